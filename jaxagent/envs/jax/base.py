"""The functional environment interface of the jittable envs (gymnax-style), `Env`, and its check, `check_env`.

Static structure (sizes, vocabulary, codec) lives in the env object built on the host, dynamic limits in an
``env_params`` pytree (or None), the PRNG key in the state; the methods are pure functions of arrays for ONE
episode (the rollout vmaps them over episodes and scans over turns). What `jaxagent.rollout.rollout` needs:
    jittable = True;  codec (a `TextCodec` with the budget text's words; action k = its k-th action string)
    reset(key, task, env_params)                         -> (state, Obs)
    step(state, action_tokens_M, action_len, env_params) -> EnvStep(state, obs, reward, done, info)
    anchor(state)                                        -> int32 id of the state WITHOUT history
``Obs.tokens`` has one static length O_max per env. ``info`` holds at least (`INFO_KEYS`) valid, action (-1 when
invalid), success and anchor (of the state BEFORE the step: GiGPO groups steps on it). A malformed action never
raises (no move, error observation, reward ``-format_penalty``, not done); a finished episode steps unchanged with
reward 0. Host envs (`envs.host.base.HostEnv`) have the same names over strings. docs/custom_env.md, "What the
rollout needs", has the contract in full and builds a small env to it.

Dimension legend: O observation tokens (O_max), M action (reply) tokens, A actions, Pa tokens per action string.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

from jaxagent import checks
from jaxagent.envs.jax.text_codec import TextCodec

INFO_KEYS = ("valid", "action", "success", "anchor")
INFO_KINDS = {"valid": "bool", "action": "integer", "success": "bool", "anchor": "integer"}


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
    """Protocol every jittable environment follows (see the module docstring for the contract)."""

    jittable: bool
    codec: TextCodec

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


def check_env(env, where: str = "rollout") -> None:
    """Host-side check that `env` has what the rollout needs (module docstring): a ValueError / TypeError
    naming the first missing piece. The shapes of what reset and step return are checked while the
    rollout is traced (`check_reset`, `check_step`)."""
    name = type(env).__name__
    if not getattr(env, "jittable", False):
        raise ValueError(f"{where}: env {name} must say jittable = True (host envs run with rollout.host_rollout)")
    missing = [m for m in ("reset", "step", "anchor") if not callable(getattr(env, m, None))]
    if missing:
        raise TypeError(f"{where}: env {name} lacks the method(s) {missing} of the Env protocol "
                        "(jaxagent.envs.jax.base)")
    if not isinstance(getattr(env, "codec", None), TextCodec):
        got = type(getattr(env, "codec", None)).__name__
        raise TypeError(f"{where}: env {name} needs a `codec` attribute, a TextCodec of its words and actions "
                        f"(rollout.env_text or rollout.env_codec build one); got {got}")


def check_reset(env, out, where: str = "rollout") -> Obs:
    """The (state, Obs) of one episode's reset, at trace time; returns the Obs."""
    name = type(env).__name__
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Obs) and not isinstance(out[1], Obs):
        raise TypeError(f"{where}: {name}.reset returns (Obs, state), gymnax's order; jaxagent's reset returns "
                        "(state, Obs) (envs.jax.gymnax_env.GymnaxEnv wraps a gymnax env)")
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Obs)):
        got = type(out).__name__ + (f" of {len(out)} ({', '.join(type(x).__name__ for x in out)})"
                                    if isinstance(out, tuple) else "")
        raise TypeError(f"{where}: {name}.reset must return (state, Obs(tokens, length)); got {got}")
    _check_obs(name, "reset", out[1], where)
    return out[1]


def check_step(env, out, obs_len: int, where: str = "rollout") -> EnvStep:
    """One episode's EnvStep, at trace time: an Obs as long as reset's, the info keys (`INFO_KEYS`)."""
    name = type(env).__name__
    if not isinstance(out, EnvStep):
        raise TypeError(f"{where}: {name}.step must return an EnvStep(state, obs, reward, done, info); "
                        f"got {type(out).__name__}")
    _check_obs(name, "step", out.obs, where)
    if out.obs.tokens.shape[-1] != obs_len:
        raise ValueError(f"{where}: {name}.step's Obs.tokens has {out.obs.tokens.shape[-1]} slots but reset's has "
                         f"{obs_len}; every observation of an env needs the same static length O_max")
    if not isinstance(out.info, dict) or any(k not in out.info for k in INFO_KEYS):
        have = sorted(out.info) if isinstance(out.info, dict) else type(out.info).__name__
        raise ValueError(f"{where}: {name}.step's info must be a dict with at least {list(INFO_KEYS)}; got {have}")
    for field, x, kind in (("reward", out.reward, "number"), ("done", out.done, "bool"),
                           *((f"info['{k}']", out.info[k], kind) for k, kind in INFO_KINDS.items())):
        if np.ndim(x) != 0 or not checks.is_kind(x, kind):
            raise ValueError(f"{where}: {name}.step's {field} must be {checks.KINDS[kind]} scalar for one episode "
                             f"(the rollout vmaps the env); got {checks.describe(x)}")
    return out


def check_anchor_rule(env, task, env_params, key=None, where: str = "check_anchor_rule") -> None:
    """The anchor rule on concrete values (outside jit, one episode, once): reset `task`, then step the first state
    with every action's canonical text; each step's info["anchor"] must equal `env.anchor(state before the step)`.
    A ValueError names the action and says when the value is the anchor of the state after the step, the usual
    slip (GiGPO would then group each step with the steps taken from its successor state). The rollout cannot
    check this while tracing: no values exist then, and a check inside the program would change it."""
    name = type(env).__name__
    state, _ = env.reset(jax.random.key(0) if key is None else key, task, env_params)
    before = int(env.anchor(state))
    table, lens = env.codec.action_tokens_AxPa, env.codec.action_lens_A
    for a in range(table.shape[0]):
        out = env.step(state, table[a], lens[a], env_params)
        got, after = int(out.info["anchor"]), int(env.anchor(out.state))
        if got != before:
            slip = ", the anchor of the state AFTER the step" if got == after else ""
            raise ValueError(f"{where}: {name}.step's info['anchor'] is {got}{slip}, after action {a} from a state "
                             f"whose anchor is {before}: info['anchor'] must be anchor(state) of the state BEFORE "
                             "the step (GiGPO groups the steps taken from equal states by it)")


def _check_obs(name, method, obs: Obs, where):
    toks, length = obs.tokens, obs.length
    if np.ndim(toks) != 1 or not checks.is_kind(toks, "integer") or np.ndim(length) != 0:
        raise TypeError(f"{where}: {name}.{method} must return Obs(tokens int[O_max], length int scalar) for one "
                        f"episode; got tokens {checks.describe(toks)}, length {checks.describe(length)}")
