"""Finding 7 of the FrozenLake study's eval stage, training stability under a tight budget (`findings` module doc):
GRPO and GRPO + the oracle process reward, both trained at the tightest tier (`arms.ARMS` grpo_tight and
grpo_oracle_tight), compared on their training logs. Per seed, each arm's fall from its best window of
training-batch success to its last (`dynamics.training_drawdown`); the row is GRPO's fall - the process-reward
arm's, paired by seed index (both arms start seed s from the same key and base). Every seed counts, collapsed
ones included: a collapse is what the row measures, so the health rule that leaves collapsed seeds out of the
other rows does not apply here. Room: the process-reward arm's fall lies in [0, 1], so the difference lies in
[GRPO's fall - 1, GRPO's fall]: a GRPO that did not fall leaves nothing to stabilise, and the verdict's reason names
that room as GRPO's own fall (`Finding.room_source`). What turns the row: a CI above 0 whose far end reaches E = 10
points (reproduced), possible once GRPO falls by at least 10 points in the seeds' mean; a CI below 0 (opposite), always
possible.
"""
from __future__ import annotations

import numpy as np

from jaxagent.eval import health
from jaxagent.eval.dynamics import training_drawdown
from jaxagent.rl.loop import tight_budget
from jaxagent.study.common.estimates import put_estimate
from jaxagent.study.frozenlake.context import EvalContext

TIGHT_ARMS = ("grpo_tight", "grpo_oracle_tight")  # (outcome reward, outcome + process reward), both at the tier
KEY = "f7_stability_frozenlake"


def stability_row(ctx: EvalContext) -> None:
    """`<KEY>.diff` (GRPO's fall - the oracle arm's, per seed), `.grpo` / `.oracle` (mean falls), `.collapsed_grpo`
    / `.collapsed_oracle` (shares of seeds `health.classify_seed` calls collapsed), `.window` (W), the room and
    `.tier_turns` (the training budget, `loop.tight_budget`); nothing when the run did not train both tight arms."""
    outcome, process = TIGHT_ARMS
    if outcome not in ctx.arms or process not in ctx.arms:
        return
    units, falls, lo, hi, windows = {}, {outcome: {}, process: {}}, {}, {}, {}
    for s in sorted(set(ctx.arm_seeds(outcome)) & set(ctx.arm_seeds(process))):
        got = {a: training_drawdown(ctx.training_success(a, s)) for a in TIGHT_ARMS}
        if any(v is None for v in got.values()):
            continue
        for a in TIGHT_ARMS:
            falls[a][s] = got[a][0]
        units[s] = np.asarray([falls[outcome][s] - falls[process][s]])
        lo[s], hi[s], windows[s] = falls[outcome][s] - 1.0, falls[outcome][s], got[outcome][1]
    if not units:
        return
    seeds = sorted(units)
    put_estimate(ctx.m, f"{KEY}.diff", units, seeds, " & ".join(TIGHT_ARMS))
    every = lambda d: float(np.mean([d[s] for s in seeds]))  # noqa: E731  every seed, collapsed ones included
    ctx.m[f"{KEY}.grpo"], ctx.m[f"{KEY}.oracle"] = every(falls[outcome]), every(falls[process])
    for a, name in ((outcome, "grpo"), (process, "oracle")):
        ctx.m[f"{KEY}.collapsed_{name}"] = every({s: float(ctx.hl[(a, s)].status == health.COLLAPSED)
                                                 for s in seeds})
    ctx.m[f"{KEY}.window"] = every(windows)
    ctx.m[f"{KEY}.room_lo"], ctx.m[f"{KEY}.room_hi"] = every(lo), every(hi)
    ctx.m[f"{KEY}.tier_turns"] = float(tight_budget(int(ctx.tiers[ctx.full])))  # the arms' training budget
