"""A gymnax environment as a jittable text env (`GymnaxEnv`): the policy reads its observation as words and
replies with the text of one of its discrete actions.

gymnax is never imported here (nor required): the adapter calls what every gymnax `Environment` has,
`reset(key, params) -> (obs, state)` and `step_env(key, state, action, params) -> (obs, state, reward, done, info)`
(the step without gymnax's automatic reset: a finished episode stays finished, as jaxagent's rollout expects).
What gymnax lacks and a text env needs comes from the caller: `describe(obs) -> (word_ids [Wr], n_words)`, the
observation as ids of the codec's words (gymnax observations are numbers; only the env's author knows which
words say them), the codec's actions in gymnax's action order (action k of the codec = gymnax action k) and,
optionally, when an episode counts as a success. The PRNG key of gymnax's next step travels in the state (a
jaxagent step takes none). `env_params` of the rollout are gymnax's params (None: the env's default_params).

Dimension legend: Wr words of a rendered observation, M reply tokens.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxagent.envs.jax.base import EnvStep, Obs
from jaxagent.envs.jax.text_codec import TextCodec, parse_action, render


class GymnaxState(NamedTuple):
    env_state: Any        # gymnax's state
    obs: jax.Array        # gymnax's observation of it (what `describe` renders and `anchor` reads)
    key: jax.Array        # the key of gymnax's next step
    done: jax.Array
    success: jax.Array


def obs_anchor(obs) -> jax.Array:
    """An int32 id of an observation's values (equal observations, equal ids; others collide rarely): a
    multiplicative hash of their float32 bits. The anchor of a gymnax state whose observation is Markov."""
    bits = jax.lax.bitcast_convert_type(jnp.ravel(jnp.asarray(obs, jnp.float32)), jnp.int32)
    weights = (jnp.arange(bits.shape[0], dtype=jnp.int32) * 2 + 1) * jnp.int32(-1640531535)  # odd multiples of 2^32/phi
    return jnp.sum(bits * weights).astype(jnp.int32)


class GymnaxEnv:
    """`env` (a gymnax Environment) with its default params `env_params`, the `codec` of its words and actions
    (`rollout.env_text(words, actions, system)`, actions in gymnax's order) and `describe` (module doc).
    `success(obs, reward, done) -> bool` says whether a finished episode succeeded (default: its last reward
    is positive); `anchor(obs) -> int32` identifies states for GiGPO (default `obs_anchor`). A reply with no
    action in it is an invalid turn: the env does not step, reward 0."""

    jittable = True

    def __init__(self, env, env_params, codec: TextCodec, describe: Callable, *,
                 success: Optional[Callable] = None, anchor: Optional[Callable] = None):
        for method in ("reset", "step_env"):
            if not callable(getattr(env, method, None)):
                raise TypeError(f"GymnaxEnv: env must be a gymnax Environment (it has no {method}); got "
                                f"{type(env).__name__}")
        self.env, self.default_params, self.codec, self.describe = env, env_params, codec, describe
        self.success_fn = success or (lambda obs, reward, done: done & (reward > 0))
        self.anchor_fn = anchor or obs_anchor

    def _params(self, env_params):
        return self.default_params if env_params is None else env_params

    def _obs(self, obs) -> Obs:
        return Obs(*render(self.codec, *self.describe(obs)))

    def reset(self, key, task, env_params):
        """`task` is unused: a gymnax episode is drawn from the key."""
        k_reset, k_next = jax.random.split(key)
        obs, st = self.env.reset(k_reset, self._params(env_params))
        return GymnaxState(st, obs, k_next, jnp.asarray(False), jnp.asarray(False)), self._obs(obs)

    def step(self, state: GymnaxState, action_tokens_M, action_len, env_params) -> EnvStep:
        a = parse_action(self.codec, action_tokens_M, action_len)
        k_step, k_next = jax.random.split(state.key)
        obs, st, reward, done, _ = self.env.step_env(k_step, state.env_state, jnp.maximum(a, 0),
                                                     self._params(env_params))
        moved = (a >= 0) & ~state.done
        done = jnp.asarray(done, bool)
        reward = jnp.where(moved, jnp.asarray(reward, jnp.float32), 0.0)
        new = GymnaxState(jax.tree.map(lambda n, o: jnp.where(moved, n, o), st, state.env_state),
                          jnp.where(moved, obs, state.obs), k_next, state.done | (moved & done),
                          state.success | (moved & done & self.success_fn(obs, reward, done)))
        info = dict(valid=a >= 0, action=a, success=new.success, anchor=self.anchor(state))
        return EnvStep(new, self._obs(new.obs), reward, new.done, info)

    def anchor(self, state: GymnaxState) -> jax.Array:
        return jnp.asarray(self.anchor_fn(state.obs), jnp.int32)
