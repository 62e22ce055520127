"""The study's error-prefix evaluation on host envs (BFCL): continue prefixes that end in a tool-call
error with ONE action from each of two policies and compare correction rates (docs/study.md finding 4:
191 BFCL prefixes, 41.4% RL vs 27.2% base).

Each prefix is replayed as forced replies (`host_rollout(..., forced_actions=...)`: the prefix's actions
go into the context, not into the policy mask), the model then writes exactly one reply (the turn
budget is the prefix length + 1), and `bfcl_env.correction_rate` judges it on the replayed tool state.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import jax

from jaxagent.envs import bfcl_env
from jaxagent.rollout.host_loop import host_rollout
from jaxagent.rollout.jax_loop import RolloutConfig


def continuations(params, cfg, env, tokenizer, prefixes: Sequence[bfcl_env.ErrorPrefix], key, rcfg: RolloutConfig,
                  **rollout_kw) -> list[str]:
    """One reply text of the policy per prefix (grouped by prefix length so each rollout has one T_max)."""
    out: list[Optional[str]] = [None] * len(prefixes)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        by_len.setdefault(len(p.actions), []).append(i)
    for n, idx in sorted(by_len.items()):
        if n + 1 > rcfg.t_max:
            raise ValueError(f"a prefix of {n} actions needs RolloutConfig.t_max >= {n + 1}, got {rcfg.t_max}")
        tasks = [prefixes[i].task for i in idx]
        forced = [list(prefixes[i].actions) for i in idx]
        ro, trace = host_rollout(params, cfg, env, tokenizer, tasks, [n + 1] * len(idx), jax.random.fold_in(key, n),
                                 rcfg, forced_actions=forced, **rollout_kw)
        for j, i in enumerate(idx):
            acts = trace.actions[j]
            out[i] = acts[n] if len(acts) > n else ""  # "" when the episode ended before the reply
    return [a if a is not None else "" for a in out]


def correction_rates(env, tokenizer, prefixes: Sequence[bfcl_env.ErrorPrefix], policies: Mapping[str, tuple], key,
                     rcfg: RolloutConfig, **rollout_kw) -> dict:
    """policies: name -> (params, cfg). Returns `bfcl_env.correction_rate`'s dict per policy plus the
    actions each policy took."""
    acts = {name: continuations(p, c, env, tokenizer, prefixes, jax.random.fold_in(key, i), rcfg, **rollout_kw)
            for i, (name, (p, c)) in enumerate(policies.items())}
    rates = bfcl_env.correction_rate(env, prefixes, acts)
    for name in rates:
        rates[name]["actions"] = acts[name]
    return rates
