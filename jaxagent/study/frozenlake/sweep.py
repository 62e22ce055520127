"""Sweeps of RL recipes on a toy preset (`sweep_recipe`): each setting of a grid (`GRIDS`) x seed trained from
the run's base, then scored on held-out maps at full budget; one record per (setting, seed) and a markdown table
(`recipe_table`). The command line: `python -m experiments.sweep`.

The `base` grid (`sweep_base`, `BASE_GRIDS`) sweeps the base SFT instead (steps, learning rate): each setting
trains a base from the run's SFT key and reports its held-out Pass@1 and valid-action rate (no RL).

A seed "collapses" when its training valid-action rate drops below 0.5; the table reports the minimum
valid-action rate over all iterations, so a setting can be read for stability and for gain at once.
"""
from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.rl.loop import RLSettings
from jaxagent.study import stages
from jaxagent.study.frozenlake.run import Run
from jaxagent.study.frozenlake.train import make_runtime, no_progress, run_base, silent

# name -> ArmSettings / RLSettings overrides; every setting uses the GRPO estimator unless it says so
GRIDS = {
    "recipe": {
        "old": dict(lr=1e-3, n_tasks=4, group_size=8, epochs=1, minibatches=1),
        "lr1e-4_b128": dict(lr=1e-4, n_tasks=16, group_size=8, epochs=1, minibatches=1),
        "lr1e-4_b128_e2m4": dict(lr=1e-4, n_tasks=16, group_size=8, epochs=2, minibatches=4),
        "lr3e-4_b128_e2m4": dict(lr=3e-4, n_tasks=16, group_size=8, epochs=2, minibatches=4),
        "lr1e-4_b128_e2m4_kl": dict(lr=1e-4, n_tasks=16, group_size=8, epochs=2, minibatches=4, kl_coef=0.05),
        "lr2e-4_b64_e2m2_kl": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05),
        "lr1e-4_b64_e2m2_kl": dict(lr=1e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05),
        "lr2e-4_b64_e2m2_kl_fp": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                      format_penalty=0.1),
        "lr1e-4_b128_e2m4_kl_fp": dict(lr=1e-4, n_tasks=16, group_size=8, epochs=2, minibatches=4, kl_coef=0.05,
                                       format_penalty=0.1),
        "lr2e-4_b64_e2m2_kl_fp03": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                        format_penalty=0.3),
        "lr2e-4_b64_e2m2_kl_fp1": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                       format_penalty=1.0),
        "lr1e-4_b64_e2m2_kl_fp03": dict(lr=1e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                        format_penalty=0.3),
        "lr2e-4_b64_e2m2_kl01_fp03": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.1,
                                          format_penalty=0.3),
        "lr2e-4_b64_e1m2_kl_fp03": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=1, minibatches=2, kl_coef=0.05,
                                        format_penalty=0.3),
        "lr1.5e-4_b64_e2m2_kl_fp03": dict(lr=1.5e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2,
                                          kl_coef=0.05, format_penalty=0.3),
        "lr1e-4_b64_e3m2_kl_fp03": dict(lr=1e-4, n_tasks=8, group_size=8, epochs=3, minibatches=2, kl_coef=0.05,
                                        format_penalty=0.3),
        "lr1e-4_b64_e2m2_klk2_fp03": dict(lr=1e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                          kl_estimator="k2", format_penalty=0.3),
        "lr2e-4_b64_e2m2_klk2_fp03": dict(lr=2e-4, n_tasks=8, group_size=8, epochs=2, minibatches=2, kl_coef=0.05,
                                          kl_estimator="k2", format_penalty=0.3),
    },
    # the quick preset's recipe with the sampled k2 KL vs the exact full-vocabulary KL at the batch's states
    "kl": {
        "k2_kl0.05": dict(kl_coef=0.05, kl_estimator="k2"),
        "exact_kl0.05": dict(kl_coef=0.05, kl_estimator="exact"),
        "exact_kl0.1": dict(kl_coef=0.1, kl_estimator="exact"),
        "exact_kl0.2": dict(kl_coef=0.2, kl_estimator="exact"),
    },
}
# name -> BaseSettings overrides (the `base` grid: the SFT that every arm starts from)
BASE_GRIDS = {
    "base": {
        "s200_lr3e-3": dict(steps=200, lr=3e-3),
        "s300_lr3e-3": dict(steps=300, lr=3e-3),
        "s400_lr3e-3": dict(steps=400, lr=3e-3),
        "s200_lr6e-3": dict(steps=200, lr=6e-3),
    },
}
_RL_FIELDS = {f.name for f in dataclasses.fields(RLSettings)}


def arm_settings(base: stages.ArmSettings, overrides: dict, iterations: int) -> stages.ArmSettings:
    """`base` with a grid setting's overrides (RLSettings fields into its `rl`, the others into the arm) and
    `iterations`."""
    rl_kw = {k: v for k, v in overrides.items() if k in _RL_FIELDS}
    arm_kw = {k: v for k, v in overrides.items() if k not in _RL_FIELDS}
    return dataclasses.replace(base, rl=dataclasses.replace(base.rl, **rl_kw), iterations=iterations, **arm_kw)


def heldout_success(rt: stages.ArmRuntime, params, tasks, t_max: int, samples: int, key) -> tuple[np.ndarray, float]:
    """Per-task success rate at full budget (Pass@1 per task), `samples` episodes per task, and the
    valid-action rate over all turns taken."""
    rows = jax.tree.map(lambda x: np.repeat(np.asarray(x), samples, axis=0), tasks)
    n = int(np.shape(jax.tree.leaves(tasks)[0])[0])
    ro = rt.rollout_fn(params, rows, np.asarray(budgets_lib.full_budget(n * samples, t_max)), key)
    valid = float(np.asarray(ro.turns.valid).sum() / max(1, np.asarray(ro.turns.active).sum()))
    return np.asarray(ro.success, np.float64).reshape(n, samples).mean(axis=1), valid


HELDOUT_KEY, HELDOUT_SAMPLE_KEY = 5151, 6262   # the sweep's held-out maps and their rollouts


def sweep_recipe(run: Run, grid: str, *, arm: str = "grpo", iterations: int = 20, seeds=(0, 1, 2), only=None,
                 heldout_tasks: int = 64, heldout_samples: int = 4, log=silent, record=silent,
                 progress=no_progress) -> list[dict]:
    """The sweep of `GRIDS[grid]` (the settings named in `only`, or all): the base's held-out line goes to `log`
    as JSON, each (setting, seed) record to `record`; returns the records. Seeds are shifted by the run's seed
    offset. The base is the run's (`train.run_base`, which reports to `log` and `progress`)."""
    seeds = [s + run.seed_offset for s in seeds]
    base_params = run_base(run, log=log, progress=progress)
    ts = task0 = run.preset.task
    tasks = ts.sample(jax.random.key(HELDOUT_KEY), heldout_tasks)
    k_eval = jax.random.key(HELDOUT_SAMPLE_KEY)
    rows = []
    base_rt = None
    for name, over in GRIDS[grid].items():
        if only and name not in only:
            continue
        task_kw = {k: over[k] for k in ("format_penalty",) if k in over}
        run.preset = dataclasses.replace(run.preset, task=dataclasses.replace(task0, **task_kw))
        settings = arm_settings(run.arm_settings(arm), {k: v for k, v in over.items() if k not in task_kw},
                                iterations)
        rt = make_runtime(run, settings)
        if base_rt is None:
            base_rt = rt
            base_succ, base_valid = heldout_success(rt, base_params, tasks, ts.t_max, heldout_samples, k_eval)
            log(json.dumps({"setting": "base", "heldout_pass1": float(base_succ.mean()),
                            "heldout_valid": base_valid}))
        for seed in seeds:
            t0 = time.time()
            state = stages.init_arm_state(rt, run.cfg, jax.random.key(seed), base_params)
            state, hist = stages.train_rl(rt, settings, run.preset.task.sample, run.preset.task.t_max, state)
            succ, valid = heldout_success(rt, state.params, tasks, ts.t_max, heldout_samples, k_eval)
            rec = {"setting": name, "seed": seed, **over, "iterations": iterations,
                   "seconds": round(time.time() - t0, 1),
                   "heldout_pass1": float(succ.mean()), "base_pass1": float(base_succ.mean()),
                   "heldout_valid": valid, "base_valid": base_valid,
                   "min_valid": min(h["valid_action_rate"] for h in hist),
                   "train_success": [round(h["success_rate"], 3) for h in hist],
                   "valid": [round(h["valid_action_rate"], 3) for h in hist],
                   "kl": [round(h.get("kl", 0.0), 4) for h in hist],
                   "kl_exact": [round(h.get("kl_exact", 0.0), 4) for h in hist],
                   "drift": [round(h.get("drift", 0.0), 4) for h in hist],
                   "entropy": [round(h.get("entropy", 0.0), 3) for h in hist],
                   "clip_frac": [round(h.get("clip_frac", 0.0), 3) for h in hist]}
            rows.append(rec)
            record(rec)
    return rows


def recipe_table(rows: list[dict]) -> str:
    """The markdown table of `sweep_recipe`'s records (a blank line first): minimum valid-action rate, training
    success first 3 -> last 3 iterations, held-out Pass@1 with the base's."""
    lines = ["", "| setting | seed | min valid | train success first 3 -> last 3 | held-out Pass@1 (base) |",
             "|---|---|---|---|---|"]
    for r in rows:
        ts_ = r["train_success"]
        lines.append(f"| {r['setting']} | {r['seed']} | {r['min_valid']:.2f} | {np.mean(ts_[:3]):.2f} -> "
                     f"{np.mean(ts_[-3:]):.2f} | {r['heldout_pass1']:.3f} ({r['base_pass1']:.3f}) |")
    return "\n".join(lines)


def sweep_base(run: Run, grid: str = "base", *, arm: str = "grpo", only=None, heldout_tasks: int = 64,
               heldout_samples: int = 4, record=silent) -> list[dict]:
    """The `base` grid: SFT settings x the run's SFT key; held-out Pass@1 and valid-action rate of each base
    (the policy every RL arm starts from: a low valid-action rate there is where training dips start). Each
    record goes to `record`; returns the records."""
    ts, p0 = run.preset.task, run.preset
    tasks = ts.sample(jax.random.key(HELDOUT_KEY), heldout_tasks)
    rt = make_runtime(run, run.arm_settings(arm))  # the rollout only
    rows = []
    for name, over in BASE_GRIDS[grid].items():
        if only and name not in only:
            continue
        bs = dataclasses.replace(p0.base, **over)
        t0 = time.time()
        params, hist = stages.train_base(run.world, run.cfg, jax.random.key(run.base_seed), ts, bs)
        seconds = round(time.time() - t0, 1)
        succ, valid = heldout_success(rt, params, tasks, ts.t_max, heldout_samples,
                                      jax.random.key(HELDOUT_SAMPLE_KEY))
        rec = {"setting": name, **over, "base_seed": run.base_seed, "sft_seconds": seconds,
               "final_loss": hist[-1]["loss"], "heldout_pass1": float(succ.mean()), "heldout_valid": valid}
        rows.append(rec)
        record(rec)
    return rows


def base_table(rows: list[dict]) -> str:
    """The markdown table of `sweep_base`'s records (a blank line first)."""
    lines = ["", "| SFT setting | base seed | final loss | held-out Pass@1 | held-out valid-action rate | SFT seconds |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['base_seed']} | {r['final_loss']:.3f} | {r['heldout_pass1']:.3f} | "
                     f"{r['heldout_valid']:.4f} | {r['sft_seconds']} |")
    return "\n".join(lines)
