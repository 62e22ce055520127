"""A stand-in for the `gymnax` package where it is not installed (it is no dependency of jaxagent):
`make("Catch-bsuite")` returns an environment with gymnax's calling convention (`reset(key, params) -> (obs, state)`,
`step_env(key, state, action, params) -> (obs, state, reward, done, info)`) and bsuite Catch's rules: a ball starts
in a random column of the top row of a 10 x 5 grid and falls one row per step; the paddle, in a random column of the
bottom row, moves left, stays or moves right (actions 0, 1, 2); when the ball reaches the bottom row the episode
ends, reward +1 if the paddle is under it, else -1. `module()` is the real gymnax when importable, else this
stand-in as a module."""
import importlib.util
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp

ROWS, COLUMNS = 10, 5


class CatchState(NamedTuple):
    ball_x: jax.Array
    ball_y: jax.Array
    paddle_x: jax.Array


class Catch:
    num_actions = 3
    default_params = None

    def _obs(self, s):
        return jnp.zeros((ROWS, COLUMNS)).at[s.ball_y, s.ball_x].set(1.0).at[ROWS - 1, s.paddle_x].set(1.0)

    def reset(self, key, params):
        ball, paddle = jax.random.randint(key, (2,), 0, COLUMNS)
        s = CatchState(ball, jnp.asarray(0), paddle)
        return self._obs(s), s

    def step_env(self, key, state, action, params):
        s = CatchState(state.ball_x, state.ball_y + 1, jnp.clip(state.paddle_x + action - 1, 0, COLUMNS - 1))
        done = s.ball_y == ROWS - 1
        reward = jnp.where(done, jnp.where(s.ball_x == s.paddle_x, 1.0, -1.0), 0.0)
        return self._obs(s), s, reward, done, {"discount": 1.0 - done}


def make(name: str):
    if name != "Catch-bsuite":
        raise ValueError(f"the gymnax stand-in has Catch-bsuite only, not {name!r}")
    return Catch(), None


def module():
    """The real gymnax when it is installed, else this stand-in (its `make`)."""
    if importlib.util.find_spec("gymnax") is not None:
        import gymnax
        return gymnax
    return types.SimpleNamespace(make=make, __name__="gymnax (tests/fake_gymnax.py)")
