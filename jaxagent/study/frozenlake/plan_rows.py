"""Finding 6 of the FrozenLake study's eval stage (`findings` module doc): R_multi, the trajectory reward over
training (`r_multi_row`: each MAIN_ARM seed's training-batch success, last W iterations - first W, from its
metrics.jsonl); R_single, plan-mode success (every move in one reply, no feedback, `plan_mode.plan_success`) on
each MAIN_ARM seed's held-out maps, final RL - base per seed paired by task; and the dynamics logs' R_multi /
R_single (dynamics.jsonl: first and last logged value per seed), printed and drawn as the dynamics figure.
"""
from __future__ import annotations

import os

import numpy as np

from jaxagent.eval import health, stats
from jaxagent.eval.dynamics import r_multi_windows
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import mean, number
from jaxagent.study.frozenlake.measure import MAIN_ARM, plan_eval, plan_tasks


def r_single_rows(ctx: EvalContext, grpo_seeds) -> None:
    """R_single final RL - base per seed, paired by task; room: success lies in [0, 1]."""
    run, est = ctx.run, ctx.est
    units, b_by, r_by = {}, {}, {}
    for s in grpo_seeds:
        maps = plan_tasks(run, s)
        pb = plan_eval(run, lambda: ctx.base, f"base/seed{s}", maps, s).mean(-1)
        pr = plan_eval(run, lambda s=s: ctx.policies[(MAIN_ARM, s)], f"{MAIN_ARM}/seed{s}", maps, s).mean(-1)
        units[s], b_by[s], r_by[s] = pr - pb, mean(pb), mean(pr)
    est.put("f6_r_single.diff", units, [MAIN_ARM])
    est.mean("f6_r_single.base", b_by, [MAIN_ARM])
    est.mean("f6_r_single.rl", r_by, [MAIN_ARM])
    est.room("f6_r_single", {s: -v for s, v in b_by.items()}, {s: 1 - v for s, v in b_by.items()}, [MAIN_ARM])


def r_multi_row(ctx: EvalContext, grpo_seeds) -> None:
    """Finding 6's R_multi: per MAIN_ARM seed, the success rates of its training batches (metrics.jsonl's
    success_rate, one per iteration in log order, B = preset.rollout_batch episodes each; iteration 0's batch is
    rolled out by the base's policy) -> `dynamics.r_multi_windows`: the last W = min(5, n // 2) batches' episodes
    and the first W's, the seed's value mean(last) - mean(first) (`stats.mean_difference`), a t-interval over
    seeds; room [-first, 1 - first]. The estimator is the coding domain's (`study.host.dynamics`).
    E = `findings.F6_R_MULTI_E` = 0.127, derived from FrozenLake: the paper's FrozenLake continuation success
    from error states, GRPO 51.3% against base 38.6% (finding 4), its one FrozenLake measure of how far GRPO
    training lifts trajectory success above the base; the DeepCoder-MT rise 0.331 is not on this scale.
    Unlike finding 1 (final RL - base held-out Pass@1 at full budget, on the evaluation's held-out maps), this
    reads only the training log: the training maps, the policies along the way, no evaluation rollout.
    A seed with fewer than 2 logged iterations has no value."""
    n = ctx.preset.rollout_batch
    windows, n_iter = {}, {}
    for s in grpo_seeds:
        rates = ctx.training_success(MAIN_ARM, s)
        w = r_multi_windows(rates, n)
        if w is not None:
            windows[s], n_iter[s] = w, len(rates)
    if not windows:
        return
    ctx.est.put("f6_r_multi.diff", {s: (last, first) for s, (last, first, _) in windows.items()}, [MAIN_ARM],
                stat=stats.mean_difference)
    first = {s: float(first.mean()) for s, (_, first, _) in windows.items()}
    ctx.est.mean("f6_r_multi.first", first, [MAIN_ARM])
    ctx.est.mean("f6_r_multi.last", {s: float(last.mean()) for s, (last, _, _) in windows.items()}, [MAIN_ARM])
    ctx.est.room("f6_r_multi", {s: -v for s, v in first.items()}, {s: 1 - v for s, v in first.items()}, [MAIN_ARM])
    ctx.est.mean("f6_r_multi.window", {s: w for s, (_, _, w) in windows.items()}, [MAIN_ARM])
    ctx.est.mean("f6_r_multi.iterations", n_iter, [MAIN_ARM])
    ctx.m["f6_r_multi.n_batch"] = float(n)


def training_log_rows(ctx: EvalContext) -> dict:
    """The main arm's first and last logged R_single per seed (`f6_r_single.log_first/.log_last`; R_multi's row
    reads the whole training log, `r_multi_row`); returns seed -> that seed's dynamics.jsonl rows (the dynamics
    figure, R_multi and R_single)."""
    dyn = {}
    for (a, s) in sorted(ctx.policies):
        path = os.path.join(ctx.run.dir, "arms", a, f"seed{s}", "dynamics.jsonl")
        if a == MAIN_ARM and os.path.isfile(path):
            dyn[s] = health.read_log(path)
    firsts, lasts = {}, {}
    for s, rows in dyn.items():
        vals = [v for v in (number(r.get("r_single")) for r in rows) if np.isfinite(v)]
        if vals:
            firsts[s], lasts[s] = vals[0], vals[-1]
    if firsts:
        ctx.est.mean("f6_r_single.log_first", firsts, [MAIN_ARM])
        ctx.est.mean("f6_r_single.log_last", lasts, [MAIN_ARM])
    return dyn
