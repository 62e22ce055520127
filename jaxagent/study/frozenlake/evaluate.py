"""Stage 'eval' of the FrozenLake study: every diagnostic on the base and each trained policy (`evaluate`).

Held-out maps per seed: RL seed s (of every arm) is evaluated on its own maps, `heldout_tasks(run, s)` =
preset.task.sample(fold_in(key(4242), s), n_tasks); the base on each seed's maps with that seed's key (labels
`base/seed<s>`), so every RL - base difference is paired per seed; the structural bound per seed on its maps.
Per policy: Pass@(K,T) in the announced, hidden-budget and truncated modes, with costs; base and each GRPO seed:
finding 1's headline evaluation (`measure.headline_eval`, when the preset has one). Base vs each GRPO seed: step
quality on matched states (G = preset.eval.n_sampled), error states (goal still reachable, V* > 0), likelihood and
plan-mode success (R_single, `plan_mode.plan_success`); all arms: Pass@T; the arms trained at the tightest tier:
training stability (finding 7, `stability_rows`). Collapsed and diverged seeds (`health.classify_seed`) are left out
of the primary estimates and kept in an all-seeds sensitivity estimate; estimates are seed-aware
(`stats.seed_estimate`). Results: runs/<name>/eval/*.json, then figures, metrics.json and report.md. Evaluation
rollouts run as the training rollout does (compute dtype, mesh, `ROLLOUT_RULES`); exact scoring and likelihoods on
the f32 params. Definitions: docs/study.md, "jaxagent's definitions"; placement: "The run directory".
"""
from __future__ import annotations

import numpy as np

from jaxagent.eval import pass_drivers
from jaxagent.study import run_dir
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.common.estimates import health_metrics
from jaxagent.study.frozenlake.estimates import Estimator, seed_health
from jaxagent.study.frozenlake.figures import draw_figures
from jaxagent.study.frozenlake.likelihood_rows import likelihood_rows
from jaxagent.study.frozenlake.measure import (MAIN_ARM, cache_path, eval_setup, eval_policy, headline_eval,
                                               headline_tasks, heldout_tasks)
from jaxagent.study.frozenlake.pass_rows import arm_rows, headline_rows, hidden_budget_rows, shrink_row
from jaxagent.study.frozenlake.plan_rows import r_multi_row, r_single_rows, training_log_rows
from jaxagent.study.frozenlake.stability_rows import stability_row
from jaxagent.study.frozenlake.state_rows import error_state_rows, step_quality_rows
from jaxagent.study.frozenlake.train import no_progress


def pass_evaluations(run, base, policies, tasks: dict, progress=no_progress) -> dict:
    """label -> Pass@(K,T) in every mode (`measure.eval_policy`, cached): the base on every seed's maps
    (`base/seed<s>`), then each arm seed on its own (`<arm>/seed<s>`), one policy loaded at a time."""
    evals = {}
    jobs = [(None, s) for s in sorted(tasks)] + sorted(policies)
    bar = progress(len(jobs), "eval Pass@(K,T)", "policy")
    for a, s in jobs:
        label = f"{a or 'base'}/seed{s}"
        load = (lambda: base) if a is None else (lambda key=(a, s): policies[key])
        evals[label] = eval_policy(run, load, label, tasks[s], s)
        bar.step()
    bar.close()
    return evals


def headline_evaluations(run, base, policies, progress=no_progress) -> tuple[dict, dict]:
    """(label -> `measure.headline_eval`, seed -> its structural bound at full budget) of the base and each MAIN_ARM
    seed on that seed's headline maps (`measure.headline_tasks`); ({}, {}) when the preset has none
    (eval.headline_tasks 0) or no MAIN_ARM seed finished."""
    seeds = sorted(s for a, s in policies if a == MAIN_ARM)
    if not run.preset.eval.headline_tasks or not seeds:
        return {}, {}
    tasks = {s: headline_tasks(run, s) for s in seeds}
    evals = {}
    bar = progress(2 * len(seeds), "eval headline (finding 1)", "policy")
    for s in seeds:
        for label, load in ((f"base/seed{s}", lambda: base),
                            (f"{MAIN_ARM}/seed{s}", lambda s=s: policies[(MAIN_ARM, s)])):
            evals[label] = headline_eval(run, load, label, tasks[s], s)
            bar.step()
    bar.close()
    return evals, structural_bounds(run, tasks, [run.preset.task.t_max], "headline_bound")


def structural_bounds(run, tasks: dict, tiers, name: str = "bound") -> dict:
    """seed -> the structural bound on that seed's maps (`pass_drivers.upper_bound`), written beside the Pass@
    files as eval/<name>_seed<s>.json so each seed's bound can be read back."""
    p = run.preset
    bounds = {s: pass_drivers.upper_bound(run.world, np.asarray(tasks[s]), tiers=tiers, ks=p.eval.ks,
                                          env_params=p.task.env_params()) for s in sorted(tasks)}
    for s, bnd in bounds.items():
        run_dir.write_json(cache_path(run, f"{name}/seed{s}"), {k: bnd[k] for k in ("tiers", "ks", "p_star",
                                                                                    "per_task")})
    return bounds


def evaluate(run, base, policies, progress=no_progress) -> tuple:
    """Runs every diagnostic; returns (metrics, figures, evals, bounds): the flat metrics dict the report reads
    (keys per findings.py, seed-aware estimates per stats.Estimate, rooms per `Estimator.room`), figure paths,
    the Pass@ results by label (`base/seed<s>`, `<arm>/seed<s>`) and the structural bound per seed. `progress`
    as in `train` (one step per policy evaluated).

    Every Pass@ row is judged where a difference of E is possible (docs/study.md, Statistics): at K=1, and at a
    tight tier on the held-out tasks the exact solver can solve there (p* > 0), with the room the bound allows
    the difference written beside it."""
    p = run.preset
    tiers, rcfg = eval_setup(run)
    all_seeds = sorted({s for _, s in policies}) or [min(p.seeds)]  # no finished seed: the base on one seed's maps
    tasks = {s: heldout_tasks(run, s) for s in all_seeds}
    evals = pass_evaluations(run, base, policies, tasks, progress)
    bounds = structural_bounds(run, tasks, tiers)
    headline, headline_bounds = headline_evaluations(run, base, policies, progress)
    m: dict = {"meta.tiers": list(tiers), "meta.ks": list(p.eval.ks), "meta.t_max": float(p.task.t_max)}
    hl = seed_health(run, policies)
    health_metrics(m, hl)
    ctx = EvalContext(run=run, base=base, policies=policies, tiers=tiers, rcfg=rcfg, tasks=tasks, evals=evals,
                      bounds=bounds, hl=hl, m=m, est=Estimator(m, hl), headline=headline,
                      headline_bounds=headline_bounds)
    if MAIN_ARM in ctx.arms:
        headline_rows(ctx)          # finding 1
        shrink_row(ctx)             # finding 2
        arm_rows(ctx)               # findings 7 and 8
    stability_row(ctx)              # finding 7, training stability at the tightest tier (training logs)
    if p.eval.hidden_budget:
        hidden_budget_rows(ctx)     # beyond the paper
    grpo_seeds = [s for (a, s) in sorted(policies) if a == MAIN_ARM]
    depth_rows = error_depth_rows = None
    nll_pool, llr_pool = {}, {}
    if grpo_seeds:
        depth_rows = step_quality_rows(ctx, grpo_seeds)             # finding 3
        error_depth_rows = error_state_rows(ctx, grpo_seeds)        # finding 4
        likelihood_rows(ctx, grpo_seeds, nll_pool, llr_pool)        # finding 5
        r_multi_row(ctx, grpo_seeds)                                # finding 6, R_multi (training log)
        r_single_rows(ctx, grpo_seeds)                              # finding 6, R_single
    dyn = training_log_rows(ctx)                                    # finding 6, the training logs
    figures = draw_figures(run, evals, bounds, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn,
                           ctx.arms, hl)
    return m, figures, evals, bounds
