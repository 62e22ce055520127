"""The noisy experts of the host study's toy bases (docs/host_study.md, "Toy presets"): per env, the reference
with one generic mistake (a slip, the same kinds on every task), a reference that checks before it answers, and
what is wrong with an episode's submission, for the mistake tables (`study.host.mistakes`). The toy base imitates
the expert (`study.host.sft.expert_replies`), as the FrozenLake toy base imitates an epsilon-noisy expert, so RL
has a behaviour shared by all tasks to unlearn.

  base   `NoisyExpert` (what an expert offers) and `check_slip_fix`
  sql    `SQLExpert` of `SQLEnv`: slips of the gold query (`slip_query`), checking first, `submission_mistake`
  code   `CodeExpert` of `CodeEnv`: slips of the reference program (`slip_program`), `program_mistake`
  bfcl   `BFCLExpert` of `BFCLEnv` and its cuts: a call with a required argument left out (`is_slip`)

`expert_for(env)` is the env's expert, or None for an env without one (e.g. a user's own env).

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

from jaxagent.envs.host.base import HostEnv
from jaxagent.study.host.experts.base import NoisyExpert, check_slip_fix

__all__ = ["NoisyExpert", "check_slip_fix", "expert_for"]


def expert_for(env) -> NoisyExpert | None:
    """The noisy expert of `env`, by its class (`NoisyExpert.env_class`, subclasses included): `SQLExpert` of an
    `SQLEnv`, `CodeExpert` of a `CodeEnv`, `BFCLExpert` of a `BFCLEnv` (any cut); None for any other env. Wrappers
    that are not a `HostEnv` but hold one as `.env` (the study world's `stages.CappedObservations`, a wrapper of a
    wrapper too) are looked through: the expert's env is the wrapped one (BFCL's replays step it, uncapped)."""
    from jaxagent.study.host.experts.bfcl import BFCLExpert
    from jaxagent.study.host.experts.code import CodeExpert
    from jaxagent.study.host.experts.sql import SQLExpert
    inner, seen = env, set()
    while not isinstance(inner, HostEnv) and getattr(inner, "env", None) is not None and id(inner) not in seen:
        seen.add(id(inner))
        inner = inner.env
    env = inner if isinstance(inner, HostEnv) else env
    for expert in (SQLExpert, CodeExpert, BFCLExpert):
        if isinstance(env, expert.env_class):
            return expert(env)
    return None
