"""The Pass@ findings of the FrozenLake study's eval stage (`findings` module doc for the keys and verdicts): 1
(held-out Pass@1 at full budget, and the RL - base gap as K grows), 2 (the gap at the tightest tier minus the gap
at full budget, on the tasks solvable there), 7 (the oracle arm against GRPO at K=1 on the tasks solvable at the
tightest tier) and 8 (BudgetMix against GRPO at every tier), paired by seed index, and beyond the paper the
announced vs hidden budget per arm.

Every row is judged where a difference is possible: at K=1, at a tight tier on the held-out tasks the exact
solver can solve there (p* > 0), with the room the structural bound allows the difference (`Estimator.room`).
"""
from __future__ import annotations

import numpy as np

from jaxagent.rl.loop import tight_budget
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import mean
from jaxagent.study.frozenlake.measure import MAIN_ARM
from jaxagent.study.frozenlake.stability_rows import TIGHT_ARMS


def pass_row(ctx: EvalContext, key, t_i, k_i, comparator, other, pair_arms, on_solvable=False, bound_pt=None):
    """other - comparator Pass@K at tier t_i per seed (paired by task, optionally on the tasks solvable at
    t_i), with rows .base (comparator), .rl (other), .bound and the room (-comparator, bound - comparator);
    `bound_pt` (seed -> [U, J, P]) the bound of the maps the rows are on (default: the Pass@ grid's)."""
    est, solvable = ctx.est, ctx.solvable()
    bound_pt = ctx.bound_per_task() if bound_pt is None else bound_pt
    units, lo, hi, cb, ob, ub = {}, {}, {}, {}, {}, {}
    for s in comparator:
        use = solvable[s][t_i] if on_solvable else np.ones(bound_pt[s].shape[-1], bool)
        c, o, u = comparator[s][t_i, k_i][use], other[s][t_i, k_i][use], bound_pt[s][t_i, k_i][use]
        units[s] = o - c
        cb[s], ob[s], ub[s] = mean(c), mean(o), mean(u)
        lo[s], hi[s] = -cb[s], ub[s] - cb[s]
    est.put(f"{key}.diff", units, pair_arms)
    est.mean(f"{key}.base", cb, pair_arms)
    est.mean(f"{key}.rl", ob, pair_arms)
    est.mean(f"{key}.bound", ub, pair_arms)
    est.room(key, lo, hi, pair_arms)


def main_arm_per_task(ctx: EvalContext) -> dict:
    """seed -> MAIN_ARM's per_task on that seed's maps."""
    return {s: ctx.per_task(f"{MAIN_ARM}/seed{s}") for s in ctx.arm_seeds(MAIN_ARM)}


def headline_rows(ctx: EvalContext) -> None:
    """Finding 1: held-out Pass@1 at full budget; the RL - base gap at full budget per K, judged at the largest
    K. On the headline evaluation's maps when the preset has one (`measure.headline_eval`, `<row>.n_maps` and
    `<row>.n_samples` say its size), else on the Pass@ grid's full-budget tier."""
    seeds, main = ctx.arm_seeds(MAIN_ARM), [MAIN_ARM]
    if ctx.headline:
        seeds = [s for s in seeds if f"{MAIN_ARM}/seed{s}" in ctx.headline]
        rl = {s: ctx.headline_per_task(f"{MAIN_ARM}/seed{s}") for s in seeds}
        base_by = {s: ctx.headline_per_task(f"base/seed{s}") for s in seeds}
        bound_pt = {s: np.asarray(ctx.headline_bounds[s]["per_task"], np.float64) for s in seeds}
        full, n_maps, n_samples = 0, ctx.preset.eval.headline_tasks, ctx.preset.eval.headline_samples
    else:
        rl, base_pt = main_arm_per_task(ctx), ctx.base_per_task()
        base_by, bound_pt = {s: base_pt[s] for s in seeds}, None
        full, n_maps, n_samples = ctx.full, ctx.preset.eval.n_tasks, ctx.preset.eval.n_samples
    k1_i = ctx.k1_i
    pass_row(ctx, "f1_pass1", full, k1_i, base_by, rl, main, bound_pt=bound_pt)
    for k_i, k in enumerate(ctx.ks):
        e = ctx.est.put(f"f1_breadth.k{k}", {s: rl[s][full, k_i] - base_by[s][full, k_i] for s in seeds}, main)
        ctx.m[f"f1_breadth.gap_k{k}"] = e.mean
    pass_row(ctx, "f1_breadth", full, ctx.kmax_i, base_by, rl, main, bound_pt=bound_pt)
    for key in ("f1_pass1", "f1_breadth"):
        ctx.m[f"{key}.n_maps"], ctx.m[f"{key}.n_samples"] = float(n_maps), float(n_samples)


def shrink_row(ctx: EvalContext) -> None:
    """Finding 2: K=1 on the tasks solvable at the tightest tier, gap(tight) - gap(full) on those tasks; room:
    RL(tight) in [0, U(tight)], so the difference lies in [-base(tight) - gap(full), U - base - gap(full)]."""
    seeds, main, rl, base_pt = ctx.arm_seeds(MAIN_ARM), [MAIN_ARM], main_arm_per_task(ctx), ctx.base_per_task()
    bound_pt, solvable = ctx.bound_per_task(), ctx.solvable()
    full, tight, k1_i = ctx.full, ctx.tight, ctx.k1_i
    key = "f2_shrink_frozenlake"
    units, lo, hi, vals = {}, {}, {}, {n: {} for n in ("base_full", "rl_full", "base_tight", "rl_tight",
                                                         "bound_tight", "gap_full", "gap_tight", "solvable")}
    for s in seeds:
        use = solvable[s][tight]
        b_t, r_t = base_pt[s][tight, k1_i][use], rl[s][tight, k1_i][use]
        b_f, r_f = base_pt[s][full, k1_i][use], rl[s][full, k1_i][use]
        units[s] = (r_t - b_t) - (r_f - b_f)
        for n, v in (("base_full", b_f), ("rl_full", r_f), ("base_tight", b_t), ("rl_tight", r_t),
                     ("bound_tight", bound_pt[s][tight, k1_i][use]), ("gap_full", r_f - b_f),
                     ("gap_tight", r_t - b_t), ("solvable", use)):
            vals[n][s] = mean(v)
        lo[s] = -vals["base_tight"][s] - vals["gap_full"][s]
        hi[s] = vals["bound_tight"][s] - vals["base_tight"][s] - vals["gap_full"][s]
    ctx.est.put(f"{key}.diff", units, main)
    for n, v in vals.items():
        ctx.est.mean(f"{key}.{n}" if n != "solvable" else f"{key}.solvable_tight", v, main)
    ctx.est.room(key, lo, hi, main)
    ctx.m[f"{key}.tier_turns"] = float(ctx.tiers[tight])


def process_pair(ctx: EvalContext) -> tuple[str, str, int] | None:
    """Finding 7's evaluation row compares (GRPO arm, oracle arm, their training budget in turns): the arms trained
    at the tightest tier when the run has both (`stability_rows.TIGHT_ARMS`), else the full-budget ones (the row is
    then reported, not judged: `recipe.no_tight_training`); None when the run has neither pair."""
    t_max = int(ctx.tiers[ctx.full])
    for pair, turns in ((TIGHT_ARMS, tight_budget(t_max)), ((MAIN_ARM, "grpo_oracle"), t_max)):
        if all(a in ctx.arms for a in pair):
            return pair[0], pair[1], int(turns)
    return None


def arm_rows(ctx: EvalContext) -> None:
    """Findings 7 (the oracle arm against GRPO, `process_pair`, tightest tier, K=1 on the tasks solvable there) and
    8 (budgetmix against GRPO, every tier at 25/50/75/100% of T_max, K=1 on all held-out tasks, the paper's scale:
    `findings._mix`), paired by seed index (every arm starts seed s from the same key and is evaluated on seed s's
    maps). Finding 7 writes its arms' training budget, `<row>.train_turns`. Finding 8 also writes each arm's move
    from the base on the row's tasks, `<row>.moved.<arm>` (mean over the paired seeds of Pass@1(arm) -
    Pass@1(base)), for the parity row's recipe check (`recipe.parity_moves`)."""
    base_pt, jobs = ctx.base_per_task(), []  # (comparator, arm, row key, tiers, on solvable tasks, extra metrics)
    pair = process_pair(ctx)
    if pair is not None:
        jobs.append((pair[0], pair[1], "f7_process_frozenlake", [(ctx.tight, None)], True,
                     {"f7_process_frozenlake.train_turns": float(pair[2])}))
    if MAIN_ARM in ctx.arms:
        jobs.append((MAIN_ARM, "budgetmix", "f8_budgetmix", list(enumerate(ctx.preset.eval.fractions)), False, {}))
    for comparator, other, key, t_list, solv, extra in jobs:
        if other not in ctx.arms:
            continue
        both = sorted(set(ctx.arm_seeds(comparator)) & set(ctx.arm_seeds(other)))
        rl = {s: ctx.per_task(f"{comparator}/seed{s}") for s in both}
        oth = {s: ctx.per_task(f"{other}/seed{s}") for s in both}
        for t_i, frac in t_list:
            if frac is not None:
                pct = int(round(100 * frac))
                if pct not in (25, 50, 75, 100):
                    continue
                name = f"{key}_t{pct}"
            else:
                name = key
            pass_row(ctx, name, t_i, ctx.k1_i, rl, oth, [comparator, other], on_solvable=solv)
            ctx.m[f"{name}.tier_turns"] = float(ctx.tiers[t_i])
            if not solv:
                for arm, per in ((comparator, rl), (other, oth)):
                    ctx.est.mean(f"{name}.moved.{arm}", {s: mean(per[s][t_i, ctx.k1_i] - base_pt[s][t_i, ctx.k1_i])
                                                         for s in both}, [comparator, other])
        ctx.m.update(extra)


def hidden_budget_rows(ctx: EvalContext) -> None:
    """Beyond the paper: announced vs hidden budget per arm at the tightest tier (largest K), the base over every
    seed's maps, an arm over its included seeds."""
    tight, kmax_i = ctx.tight, ctx.kmax_i
    for arm in ["base"] + ctx.arms:
        if arm == "base":
            base_pt = ctx.base_per_task()
            a = np.mean([base_pt[s] for s in ctx.all_seeds], axis=0)
            h = np.mean([ctx.per_task(f"base/seed{s}", "hidden") for s in ctx.all_seeds], axis=0)
        else:
            a, h = ctx.arm_per_task(arm), ctx.arm_per_task(arm, "hidden")
        ctx.m[f"x_hidden.{arm}.announced_tight"] = float(a[tight, kmax_i].mean())
        ctx.m[f"x_hidden.{arm}.hidden_tight"] = float(h[tight, kmax_i].mean())
