"""Finding 6 of the FrozenLake study's eval stage (`findings` module doc): R_single, plan-mode success (every move
in one reply, no feedback, `plan_mode.plan_success`) on each MAIN_ARM seed's held-out maps, final RL - base per
seed paired by task; and the training logs' R_multi / R_single (dynamics.jsonl: first and last logged value per
seed), printed beside the judged held-out rows and drawn as the dynamics figure.
"""
from __future__ import annotations

import os

import numpy as np

from jaxagent.eval import health
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


def training_log_rows(ctx: EvalContext) -> dict:
    """The main arm's first and last logged R_multi / R_single per seed (`f6_<name>.log_first/.log_last`);
    returns seed -> that seed's dynamics.jsonl rows (the dynamics figure)."""
    dyn = {}
    for (a, s) in sorted(ctx.policies):
        path = os.path.join(ctx.run.dir, "arms", a, f"seed{s}", "dynamics.jsonl")
        if a == MAIN_ARM and os.path.isfile(path):
            dyn[s] = health.read_log(path)
    for name in ("r_multi", "r_single"):
        firsts, lasts = {}, {}
        for s, rows in dyn.items():
            vals = [v for v in (number(r.get(name)) for r in rows) if np.isfinite(v)]
            if vals:
                firsts[s], lasts[s] = vals[0], vals[-1]
        if firsts:
            ctx.est.mean(f"f6_{name}.log_first", firsts, [MAIN_ARM])
            ctx.est.mean(f"f6_{name}.log_last", lasts, [MAIN_ARM])
    return dyn
