"""The study's error-prefix evaluation on host envs (BFCL): continue prefixes that end in a tool-call
error with ONE action from each of two policies and compare correction rates (docs/study.md finding 4:
191 BFCL prefixes, 41.4% RL vs 27.2% base).

Bookkeeping (host-side, any host env whose step infos carry `tool_error`): `collect_error_prefixes` cuts
trajectories at their tool-call errors, `replay` rebuilds a prefix's env state, `correction_rate` judges
each policy's one continuation (`is_correction`). Drivers: `continuations`, `correction_rates`.

Each prefix is replayed as forced replies (`host_rollout(..., forced_actions=...)`: the prefix's actions
go into the context, not into the policy mask), the model then writes exactly one reply (the turn
budget is the prefix length + 1), and `correction_rate` judges it on the replayed tool state.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxagent.envs.host.base import HostEnv
from jaxagent.rollout.episode import EpisodeConfig
from jaxagent.rollout.host_loop import host_rollout


# ----------------------------------------------------------------------------- bookkeeping
@dataclasses.dataclass(frozen=True)
class ErrorPrefix:
    """A trajectory prefix whose last action produced a tool-call error."""

    task: Any
    seed: int
    actions: tuple  # the prefix's actions, the erroneous one last
    step: int  # index of the erroneous action
    depth: float  # normalised depth d_t = (step + 1) / T_max
    source: str  # the policy that produced the trajectory
    trajectory: int  # index of the trajectory in the input


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def is_tool_error(info: Mapping) -> bool:
    """A step is a tool-call error when info['tool_error'] is set (falls back to info['error'])."""
    if "tool_error" in info:
        return bool(info["tool_error"])
    return info.get("error") is not None


def collect_error_prefixes(trajectories: Sequence[Any], *, t_max: int | Callable[[Any], int] | None = None,
                           max_per_trajectory: int | None = None) -> list[ErrorPrefix]:
    """Prefixes ending in a tool-call error, from trajectories given as mappings or objects with
    `task`, `actions` (texts) and `infos` (the env's step infos), and optionally `seed`, `policy`,
    `dones` (per-step done flags). A prefix whose erroneous step ended the episode is skipped (it
    cannot be continued). T_max for the depth: `t_max` (an int or a function of the task), else the
    trajectory's length.
    """
    out = []
    for ti, traj in enumerate(trajectories):
        actions, infos = list(_get(traj, "actions", [])), list(_get(traj, "infos", []))
        if len(actions) != len(infos):
            raise ValueError(f"trajectory {ti}: {len(actions)} actions but {len(infos)} infos")
        dones = list(_get(traj, "dones", None) or [False] * len(actions))
        task = _get(traj, "task")
        tm = t_max(task) if callable(t_max) else (t_max or len(actions))
        kept = 0
        for t, info in enumerate(infos):
            if not is_tool_error(info) or dones[t] or info.get("failure"):
                continue
            out.append(ErrorPrefix(task=task, seed=int(_get(traj, "seed", 0) or 0), actions=tuple(actions[: t + 1]),
                                   step=t, depth=(t + 1) / max(1, tm), source=str(_get(traj, "policy", "") or ""),
                                   trajectory=ti))
            kept += 1
            if max_per_trajectory is not None and kept >= max_per_trajectory:
                break
    return out


def replay(env: HostEnv, task: Any, actions: Sequence[str], seed: int = 0) -> tuple[Any, str, dict | None]:
    """Reset and step through `actions`; returns (state, last obs, last info)."""
    state, obs = env.reset(seed, task)
    info = None
    for a in actions:
        state, obs, _, done, info = env.step(state, a)
        if done:
            raise ValueError("replay: the episode ended before the prefix did")
    return state, obs, info


def is_correction(info: Mapping) -> bool:
    """jaxagent's definition of a corrected error: the continuation is well-formed, makes at least one
    tool call, and none of its calls fails."""
    return bool(info.get("valid")) and not is_tool_error(info) and int(info.get("n_calls", 0)) > 0


def correction_rate(env: HostEnv, prefixes: Sequence[ErrorPrefix], continuations: Mapping[str, Sequence[str]],
                    *, corrected: Callable[[Mapping], bool] = is_correction) -> dict[str, dict]:
    """Correction rate of each policy: continue every prefix with that policy's one action and count
    corrections (docs/study.md finding 4: 191 BFCL prefixes, one action from each model, 41.4% vs 27.2%).

    `continuations[policy][i]` is the policy's action for `prefixes[i]`. Returns, per policy:
    rate, n, n_corrected, corrected (per-prefix flags) and by_source (rate per prefix source policy).
    """
    for p, acts in continuations.items():
        if len(acts) != len(prefixes):
            raise ValueError(f"policy {p!r}: {len(acts)} continuations for {len(prefixes)} prefixes")
    flags: dict[str, list[bool]] = {p: [] for p in continuations}
    for i, pre in enumerate(prefixes):
        state, _, _ = replay(env, pre.task, pre.actions, pre.seed)
        for p, acts in continuations.items():
            _, _, _, _, info = env.step(env.clone(state), acts[i])
            flags[p].append(bool(corrected(info)))
    out = {}
    for p, f in flags.items():
        by_source = collections.defaultdict(list)
        for pre, ok in zip(prefixes, f):
            by_source[pre.source].append(ok)
        out[p] = {"rate": sum(f) / len(f) if f else float("nan"), "n": len(f), "n_corrected": sum(f),
                  "corrected": f, "by_source": {s: sum(v) / len(v) for s, v in by_source.items()}}
    return out


# ----------------------------------------------------------------------------- drivers


def continuations(params, cfg, env, tokenizer, prefixes: Sequence[ErrorPrefix], key, rcfg: EpisodeConfig, *,
                  batch_size: Optional[int] = None) -> list[str]:
    """One reply text of the policy per prefix ("" when the episode ended before it): the prefixes grouped by
    length so each rollout has one budget (the prefix length + 1), each length's rollout `fold_in(key, n * 100003
    + c)` for its c-th batch. `batch_size`: rows per rollout, the last batch padded with copies of its first prefix
    (dropped after) so every rollout has one shape; None: all prefixes of a length in one rollout."""
    out: list[Optional[str]] = [None] * len(prefixes)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        by_len.setdefault(len(p.actions), []).append(i)
    for n, idx in sorted(by_len.items()):
        if n + 1 > rcfg.t_max:
            raise ValueError(f"a prefix of {n} actions needs rcfg.t_max >= {n + 1}, got {rcfg.t_max}")
        width = len(idx) if batch_size is None else batch_size
        for c, start in enumerate(range(0, len(idx), width)):
            rows = idx[start:start + width]
            rows = rows + [rows[0]] * (width - len(rows))
            ro = host_rollout(params, cfg, env, tokenizer, [prefixes[i].task for i in rows],
                              np.full((width,), n + 1, np.int32), jax.random.fold_in(key, n * 100003 + c), rcfg,
                              forced_actions=[list(prefixes[i].actions) for i in rows])
            for j, i in enumerate(rows[:min(width, len(idx) - start)]):
                acts = ro.trace.actions[j]
                out[i] = acts[n] if len(acts) > n else ""
    return [a if a is not None else "" for a in out]


def correction_rates(env, tokenizer, prefixes: Sequence[ErrorPrefix], policies: Mapping[str, tuple], key,
                     rcfg: EpisodeConfig, *, batch_size: Optional[int] = None) -> dict:
    """policies: name -> (params, cfg). Returns `correction_rate`'s dict per policy plus the
    actions each policy took (`continuations` with `fold_in(key, i)` for the i-th policy)."""
    acts = {name: continuations(p, c, env, tokenizer, prefixes, jax.random.fold_in(key, i), rcfg,
                                batch_size=batch_size)
            for i, (name, (p, c)) in enumerate(policies.items())}
    rates = correction_rate(env, prefixes, acts)
    for name in rates:
        rates[name]["actions"] = acts[name]
    return rates
