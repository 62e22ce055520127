"""Sweep RL recipes on a toy preset: each setting x seed trained from the preset's base, then scored on
held-out maps at full budget. Prints one JSON line per (setting, seed) and a markdown table.

  python -m experiments.sweep --preset quick --grid recipe --iterations 20 --seeds 0 1 2

`--grid base` sweeps the base SFT instead (steps, learning rate): each setting trains a base from the
run's SFT key and reports its held-out Pass@1 and valid-action rate (no RL).

A seed "collapses" when its training valid-action rate drops below 0.5; the table reports the minimum
valid-action rate over all iterations, so a setting can be read for stability and for gain at once.
"""
from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np

from experiments import cli, study
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.rl.loop import RLSettings
from jaxagent.study import stages

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


def _emit(rows: list, rec: dict, out) -> None:
    """One sweep record: kept for the table, printed as a JSON line, appended to `out` when given."""
    rows.append(rec)
    print(json.dumps(rec), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")


def main(argv=None):
    p = cli.parser(__doc__.splitlines()[0], prog="experiments.sweep", run_options=True)
    p.add_argument("--grid", default="recipe", choices=sorted(GRIDS) + sorted(BASE_GRIDS))
    p.add_argument("--only", nargs="*", default=None, help="settings of the grid to run (default: all)")
    p.add_argument("--arm", default="grpo", choices=sorted(stages.ARMS))
    p.add_argument("--heldout-tasks", type=cli.positive_int, default=64, help="held-out maps per setting")
    p.add_argument("--heldout-samples", type=cli.positive_int, default=4, help="rollouts per held-out map")
    p.add_argument("--out", default=None, help="append JSON lines here")
    args = p.parse_args(argv)
    with cli.clear_errors():
        return sweep(args)


def sweep(args) -> None:
    """The sweep of `args.grid` (main's command line)."""
    iterations, seeds = args.iterations or 20, args.seeds or [0, 1, 2]
    run = cli.make_run(args)
    if args.grid in BASE_GRIDS:
        return sweep_base(run, args)
    seeds = [s + run.seed_offset for s in seeds]
    base_params = study.run_base(run)
    ts = task0 = run.preset.task
    tasks = ts.sample(jax.random.key(5151), args.heldout_tasks)
    k_eval = jax.random.key(6262)
    rows = []
    base_rt = None
    for name, over in GRIDS[args.grid].items():
        if args.only and name not in args.only:
            continue
        task_kw = {k: over[k] for k in ("format_penalty",) if k in over}
        run.preset = dataclasses.replace(run.preset, task=dataclasses.replace(task0, **task_kw))
        settings = arm_settings(run.arm_settings(args.arm), {k: v for k, v in over.items() if k not in task_kw},
                                iterations)
        rt = study.make_runtime(run, settings)
        if base_rt is None:
            base_rt = rt
            base_succ, base_valid = heldout_success(rt, base_params, tasks, ts.t_max, args.heldout_samples, k_eval)
            print(json.dumps({"setting": "base", "heldout_pass1": float(base_succ.mean()),
                              "heldout_valid": base_valid}), flush=True)
        for seed in seeds:
            t0 = time.time()
            state, hist = stages.train_rl(run.world, run.cfg, base_params, jax.random.key(seed), run.preset.task, settings,
                                          runtime=rt)
            succ, valid = heldout_success(rt, state.params, tasks, ts.t_max, args.heldout_samples, k_eval)
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
            _emit(rows, rec, args.out)
    print("\n| setting | seed | min valid | train success first 3 -> last 3 | held-out Pass@1 (base) |")
    print("|---|---|---|---|---|")
    for r in rows:
        ts_ = r["train_success"]
        print(f"| {r['setting']} | {r['seed']} | {r['min_valid']:.2f} | {np.mean(ts_[:3]):.2f} -> "
              f"{np.mean(ts_[-3:]):.2f} | {r['heldout_pass1']:.3f} ({r['base_pass1']:.3f}) |")


def sweep_base(run: study.Run, args) -> None:
    """The `base` grid: SFT settings x the run's SFT key; held-out Pass@1 and valid-action rate of each base
    (the policy every RL arm starts from: a low valid-action rate there is where training dips start)."""
    ts, p0 = run.preset.task, run.preset
    tasks = ts.sample(jax.random.key(5151), args.heldout_tasks)
    rt = study.make_runtime(run, run.arm_settings(args.arm))  # the rollout only
    rows = []
    for name, over in BASE_GRIDS[args.grid].items():
        if args.only and name not in args.only:
            continue
        bs = dataclasses.replace(p0.base, **over)
        t0 = time.time()
        params, hist = stages.train_base(run.world, run.cfg, jax.random.key(run.base_seed), ts, bs)
        seconds = round(time.time() - t0, 1)
        succ, valid = heldout_success(rt, params, tasks, ts.t_max, args.heldout_samples, jax.random.key(6262))
        rec = {"setting": name, **over, "base_seed": run.base_seed, "sft_seconds": seconds,
               "final_loss": hist[-1]["loss"], "heldout_pass1": float(succ.mean()), "heldout_valid": valid}
        _emit(rows, rec, args.out)
    print("\n| SFT setting | base seed | final loss | held-out Pass@1 | held-out valid-action rate | SFT seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['base_seed']} | {r['final_loss']:.3f} | {r['heldout_pass1']:.3f} | "
              f"{r['heldout_valid']:.4f} | {r['sft_seconds']} |")


if __name__ == "__main__":
    main()
