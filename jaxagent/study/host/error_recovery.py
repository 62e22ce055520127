"""Finding 4 on a host-env domain: the tool-call error correction rate of RL vs base on error prefixes from the
held-out evaluation trajectories of both policies (the paper, BFCL: 191 prefixes, 41.4% RL vs 27.2% base;
docs/study.md finding 4).

Prefixes (`prefixes_from_log`, `error_prefix.collect_error_prefixes`): per GRPO seed, the prefixes of base's and the
seed's full-budget held-out episodes that end in a tool-call error that neither ended nor failed the episode, with
room for one more reply. Each is continued with ONE reply of base and ONE of the seed (`continue_prefixes`), judged
on the replayed tool state by `error_prefix.correction_rate` (well formed, at least one tool call, none failing).
Estimate: c_pol(i) = 1[policy pol corrects prefix i], per prefix
    delta_i = c_RL(i) - c_base(i),
units = prefixes nested in GRPO seeds, so the estimate is the mean over seeds of rate_RL,s - rate_base,s.
Verdict: direction +1, E = 0.142 (41.4 - 27.2 points; `findings.f4_correction_bfcl`); a base rate above 1 - E
blocks the size. Domains: `DOMAINS` (BFCL, whose step infos carry `n_calls`). Notes and metric keys:
docs/host_study.md, "How the host findings are measured" (finding 4).

Dimension legend (CONVENTIONS.md): U budget tiers, P tasks, Z samples per task and tier, B episodes of one batch.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Mapping, Sequence

import jax
import numpy as np

from jaxagent.eval import error_prefix
from jaxagent.eval.findings import Finding, Row
from jaxagent.rollout.host_loop import HostTrace
from jaxagent.sampling.generate import rollout_params

DOMAINS = ("bfcl",)  # env registry names: every domain on these envs (`host_domains.uses_env`)
EFFECT = 0.142  # the paper's gap, 41.4% - 27.2% (`findings.f4_correction_bfcl`)
NO_PREFIX_NOTE = ("Finding 4 (tool-call error correction): no error prefixes were found in the held-out evaluation "
                  "trajectories of base or any GRPO seed (no step with a tool-call error that left the episode "
                  "running), so this run has no estimate for it.")


def finding(d: str, title: str) -> Finding:
    """Finding 4 on domain `d`: RL - base correction rate on error prefixes of both policies."""
    f4 = f"{d}.f4_correction"
    return Finding(f4, f"{title}: 4. tool-call error correction rate on error prefixes of both policies",
                   (Row("base correction rate (%)", f"{f4}.base", None, 100.0),
                    Row("RL correction rate (%)", f"{f4}.rl", None, 100.0),
                    Row("error prefixes (all GRPO seeds)", f"{f4}.n_prefixes", None, 1.0, ".0f")),
                   f"{f4}.diff", "RL - base correction rate (points)", +1, None, 100.0, ".1f",
                   effect=EFFECT, effect_source="the paper's gap on BFCL (41.4 - 27.2 points)",
                   note=("Room: a correction rate lies in [0, 1], so RL - base lies in [-base, 1 - base] (base: the "
                         "mean over the included seeds of base's rate on the seed's prefixes)."), room=True,
                   falsified_by=("a 95% CI of the correction rate RL - base below 0, or holding 0 with its upper end "
                                 "below the paper's 14.2 points"))


# ----------------------------------------------------------------------------- the episodes' log
def episode_records(traces: Sequence[HostTrace], batch_sizes: Sequence[int]) -> list[dict]:
    """Per evaluation episode (the first batch_sizes[i] episodes of rollout i; the rest are padding) what prefix
    collection needs: reply texts, per-step tool_error / failure / done flags and the reset seed (JSON-able); a
    reply without a step info (an env exception or time-out ended the episode) is left out."""
    if len(traces) != len(batch_sizes):
        raise ValueError(f"{len(traces)} traces for {len(batch_sizes)} rollout batches")
    out = []
    for tr, n in zip(traces, batch_sizes):
        for b in range(n):
            infos = tr.infos[b]
            out.append({"actions": [str(a) for a in tr.actions[b][:len(infos)]],
                        "tool_error": [bool(error_prefix.is_tool_error(i)) for i in infos],
                        "failure": [bool(i.get("failure")) for i in infos],
                        "done": [bool(x) for x in tr.dones[b][:len(infos)]], "seed": int(tr.seeds[b])})
    return out


def tier_episodes(log: Mapping, label: str, tier: int = -1):
    """(task index p, episode index e, episode record) of every episode of tier index `tier` in an eval log
    (`episodes`, tier-major over its [U, P, Z] grid), in task then sample order."""
    if "episodes" not in log:
        raise ValueError(f"the eval log of {label!r} has no per-episode replies ('episodes'); re-evaluate it")
    n_u, n_p, n_z = np.asarray(log["status"]).shape
    u = range(n_u)[tier]
    for p in range(n_p):
        for z in range(n_z):
            e = (u * n_p + p) * n_z + z
            yield p, e, log["episodes"][e]


def prefixes_from_log(evals: Mapping[str, Mapping], labels: Sequence[str], tasks: Sequence, t_max: int,
                      tier: int = -1) -> list[error_prefix.ErrorPrefix]:
    """Error prefixes (`collect_error_prefixes`, source = the policy label) of the episodes of tier index `tier`
    in each label's eval log (`episodes`, tier-major over the [U, P, Z] grid), that leave room for one more
    reply (length + 1 <= t_max)."""
    out = []
    for label in labels:
        trajs = []
        for p, _, ep in tier_episodes(evals[label], label, tier):
            infos = [{"tool_error": te, "failure": f} for te, f in zip(ep["tool_error"], ep["failure"])]
            trajs.append(dict(task=tasks[p], seed=ep["seed"], actions=ep["actions"], infos=infos,
                              dones=ep["done"], policy=label))
        pre = error_prefix.collect_error_prefixes(trajs, t_max=t_max)
        out += [x for x in pre if len(x.actions) + 1 <= t_max]
    return out


# ----------------------------------------------------------------------------- continuing and judging
def continue_prefixes(params, cfg, world, ts, prefixes: Sequence[error_prefix.ErrorPrefix], key, batch_size: int,
                      *, sampler, compute_dtype=None, mesh=None) -> list[str]:
    """One reply of the policy per prefix: prefixes grouped by length, in rollout batches of `batch_size` (the
    last padded with copies of its first prefix, dropped after) so the rollouts keep the evaluation's shape;
    the prefix is replayed as forced replies and the budget is its length + 1 ("" if the episode ended first)."""
    # One episode group whatever ts.overlap_groups: the continuations' sampling noise does not move with it.
    rcfg = dataclasses.replace(ts.rollout_config(sampler), overlap_groups=1)
    params = rollout_params(params, cfg, mesh=mesh, compute_dtype=compute_dtype)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        return error_prefix.continuations(params, cfg, world.env, world.tokenizer, prefixes, key, rcfg,
                                          batch_size=batch_size)


def judge(env, prefixes: Sequence[error_prefix.ErrorPrefix], base_actions: Sequence[str],
          rl_actions: Sequence[str]) -> dict:
    """Per-prefix correction flags of both continuations (`error_prefix.correction_rate`), JSON-able with the
    prefixes' source policy, task id and erroneous step."""
    rates = error_prefix.correction_rate(env, prefixes, {"base": base_actions, "rl": rl_actions})
    return {"base": [bool(x) for x in rates["base"]["corrected"]], "rl": [bool(x) for x in rates["rl"]["corrected"]],
            "source": [p.source for p in prefixes], "step": [int(p.step) for p in prefixes],
            "task_id": [str(getattr(p.task, "id", "")) for p in prefixes]}


# ----------------------------------------------------------------------------- the metrics
def error_recovery_metrics(d: str, judged: Mapping[int, Mapping], included: Sequence[int],
                           put) -> dict:
    """The finding-4 metrics (module docstring) from `judge`'s record per GRPO seed; `put` is `metrics.put_estimate`.
    No prefix in any seed: only `<d>.f4_correction.n_prefixes` = 0 and the note `<d>.note.f4_correction`."""
    f4 = f"{d}.f4_correction"
    m: dict = {}
    n_all = sum(len(j["base"]) for j in judged.values())
    m[f"{f4}.n_prefixes"] = n_all
    if n_all == 0:
        m[f"{d}.note.f4_correction"] = NO_PREFIX_NOTE
        return m
    units = {}
    for s, j in sorted(judged.items()):
        b, r = np.asarray(j["base"], np.float64), np.asarray(j["rl"], np.float64)
        units[s] = r - b
        m[f"{f4}.seed{s}.n_prefixes"] = len(b)
        m[f"{f4}.seed{s}.n_from_base"] = sum(src == "base" for src in j["source"])
        m[f"{f4}.seed{s}.base"] = float(b.mean()) if len(b) else float("nan")
        m[f"{f4}.seed{s}.rl"] = float(r.mean()) if len(r) else float("nan")
    put(m, f"{f4}.diff", units, included)
    ok = [s for s in judged if s in included]
    pooled = lambda key: (float(np.mean(np.concatenate([np.asarray(judged[s][key], np.float64) for s in ok])))  # noqa: E731
                          if ok and any(len(judged[s][key]) for s in ok) else float("nan"))
    m[f"{f4}.base"], m[f"{f4}.rl"] = pooled("base"), pooled("rl")
    # room: RL's rate lies in [0, 1], so the seed mean of rate_RL - rate_base lies in [-b, 1 - b], b the seed mean
    # of base's rate over the included seeds (the estimate's seeds, every seed when none is; the pooled rate
    # weighs seeds by their prefixes)
    b = [m[f"{f4}.seed{s}.base"] for s in ok or list(judged) if np.isfinite(m[f"{f4}.seed{s}.base"])]
    if b:
        m[f"{f4}.room_lo"], m[f"{f4}.room_hi"] = -float(np.mean(b)), 1.0 - float(np.mean(b))
    return m
