"""The functional environment interface shared by every jaxagent environment (gymnax-style).

Static structure (sizes, vocabulary, codec) lives in the env object built on the host; dynamic limits
live in an ``env_params`` pytree; the PRNG key lives in the state. A jittable env's methods are pure
functions of arrays, written for ONE episode: the rollout vmaps them over episodes and scans over turns.

Dimension legend: O observation tokens (O_max, static per env), M action (reply) tokens (static per rollout).

Contract of a jittable env (``jittable = True``):
    reset(key, task, env_params)                         -> (state, Obs)
    step(state, action_tokens_M, action_len, env_params) -> EnvStep(state, obs, reward, done, info)
    anchor(state)                                        -> int32 id of the state WITHOUT history
Host-side envs (SQL, code, function calling) use the same method names with Python strings in place
of token arrays and say ``jittable = False``.

``info`` is a dict of fixed-shape arrays with at least:
    valid   bool   the action parsed and was legal
    action  int32  the parsed action index, -1 when invalid
    success bool   the episode has succeeded (state after the step)
    anchor  int32  ``anchor`` of the state BEFORE the step (GiGPO groups steps on it)
A malformed action never raises: it gets a defined response (no move, error observation, reward
``-format_penalty``, not done). Stepping a finished episode leaves it unchanged with reward 0.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax

INFO_KEYS = ("valid", "action", "success", "anchor")


class Obs(NamedTuple):
    """A token observation: ``tokens`` int32[O_max] padded after ``length`` (int32 scalar)."""

    tokens: jax.Array
    length: jax.Array


class EnvStep(NamedTuple):
    """What ``step`` returns; unpacks as ``state, obs, reward, done, info``."""

    state: Any
    obs: Obs
    reward: jax.Array  # float32 scalar
    done: jax.Array  # bool scalar
    info: dict[str, jax.Array]


@runtime_checkable
class Env(Protocol):
    """Protocol every environment follows (see the module docstring for the contract)."""

    jittable: bool

    def reset(self, key: jax.Array, task: Any, env_params: Any) -> tuple[Any, Obs]:
        """Start one episode of ``task``; returns the state and the first observation."""
        ...

    def step(self, state: Any, action_tokens_M: jax.Array, action_len: jax.Array,
             env_params: Any) -> EnvStep:
        """Parse the action from the generated tokens and advance one turn."""
        ...

    def anchor(self, state: Any) -> jax.Array:
        """int32 id of the env state without history (equal states -> equal anchors)."""
        ...
