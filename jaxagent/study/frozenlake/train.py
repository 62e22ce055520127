"""The FrozenLake study's training stages on a `run.Run`: the base (`run_base`), each RL arm x seed (`run_arm`,
`run_all_arms`), R_single logged during training (`r_single_measure`), the trained policies read back one at a
time (`common.policies.SavedPolicies`).

Progress: each stage reports its steps to `progress(total, desc, unit, initial=0)`, an object with
`step(**postfix)` and `close()` (default `no_progress`: nothing shown), and one-line notes to `log` (default:
none); the scripts pass a progress bar and print. A stage read back from the run directory reports its size as
done (`initial=total`, no step), so that an ETA over the whole study counts it.
"""
from __future__ import annotations

import os
import time

import jax

from jaxagent import xla_options
from jaxagent.models import weights
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.study import plan_mode, stages
from jaxagent.study.common.policies import SavedPolicies, save_policy
from jaxagent.study.common.progress import NoProgress, no_progress  # noqa: F401  (the stages' default progress)
from jaxagent.study.common.run_checks import check_update
from jaxagent.study.frozenlake.run import Run
from jaxagent.study.run_dir import append_jsonl, cut_jsonl, is_main_process, mark_done, sync_processes


def silent(*_args, **_kwargs) -> None:
    """The default `log`: says nothing."""




def run_base(run: Run, log=silent, progress=no_progress):
    """Stage 'base': SFT of the tiny Qwen3 on the noisy expert (or the given checkpoint as is)."""
    out = run.path("base")
    settings = run.base_settings()
    if run.stage_done(out, settings, "base"):
        log(f"[base] done already: {out}")
        return run.load_policy(out)
    p = run.preset
    if p.checkpoint:
        _, params = weights.load(p.checkpoint, mesh=run.mesh)
        save_policy(os.path.join(out, "policy"), run.cfg, params)
        mark_done(out, {"source": p.checkpoint, "settings": settings})
        return params
    t0 = time.time()
    if is_main_process() and os.path.isfile(os.path.join(out, "metrics.jsonl")):
        os.remove(os.path.join(out, "metrics.jsonl"))  # of an SFT killed before its end: it restarts from 0
    bar = progress(p.base.steps, "base SFT", "step")

    def cb(i, rec):
        bar.step(loss=f"{rec['loss']:.3f}", acc=f"{rec['token_accuracy']:.2f}")
        append_jsonl(os.path.join(out, "metrics.jsonl"), rec)

    params, hist = stages.train_base(run.world, run.cfg, jax.random.key(run.base_seed), p.task, p.base, callback=cb,
                                     mesh=run.mesh)
    bar.close()
    save_policy(os.path.join(out, "policy"), run.cfg, params)
    mark_done(out, {"seconds": time.time() - t0, **hist[0], "final": hist[-1], "settings": settings})
    return params


def run_arm(run: Run, arm: str, seed: int, base_params, runtime=None, log=silent, progress=no_progress):
    """Stage 'rl': one arm, one seed; checkpoints every iteration, resumes after a kill."""
    label = f"{arm}/seed{seed}"
    out = run.path("arms", arm, f"seed{seed}")
    recorded = run.arm_stage_settings(arm, seed)
    if run.stage_done(out, recorded, label):
        progress(run.preset.iterations, f"{arm} seed {seed}", "iteration", initial=run.preset.iterations).close()
        return run.load_policy(out)
    settings = run.arm_settings(arm)
    rt = runtime or make_runtime(run, settings)
    manager = ckpt_lib.make_manager(os.path.join(out, "ckpt"), max_to_keep=2)
    expect = {"settings": recorded}
    if manager.latest_step() is not None:  # an interrupted run: resumable only with the same settings
        saved = (ckpt_lib.read_metadata(manager).get("extra") or {}).get("settings")
        where = os.path.join(out, "ckpt", str(manager.latest_step()))
        if not run.check_recorded(saved, recorded, where, out, label):
            manager = ckpt_lib.make_manager(os.path.join(out, "ckpt"), max_to_keep=2)  # emptied by --force
        elif saved is None:
            expect = None  # a checkpoint of an older version, without recorded settings
    # the restore target carries the mesh shardings: a resumed state is sharded like a fresh one
    abstract = stages.abstract_arm_state(rt, run.cfg, jax.random.key(seed), base_params)
    state = ckpt_lib.restore_latest(manager, abstract, cfg=run.cfg, expect_extra=expect)
    metrics_path, dyn = os.path.join(out, "metrics.jsonl"), os.path.join(out, "dynamics.jsonl")
    start = 0 if state is None else int(state.data_pos) // settings.rl.n_tasks
    if state is not None:
        log(f"[{label}] resuming at iteration {start}")
        # lines of iterations after the restored checkpoint (a kill between append and save) go
        cut_jsonl(metrics_path, lambda r: r.get("iteration", start) < start)
        cut_jsonl(dyn, lambda r: r.get("step", start) < start)
    elif is_main_process():
        for f in (metrics_path, dyn):
            if os.path.isfile(f):
                os.remove(f)
    sync_processes(f"cut-logs:{out}")
    r_single = r_single_measure(run)
    bar = progress(settings.iterations, f"{arm} seed {seed}", "iteration", initial=start)

    def cb(it, m, st):
        check_update(label, it, m, st)  # before anything of this iteration is written
        bar.step(success=f"{m['success_rate']:.2f}")
        append_jsonl(metrics_path, m)
        if it % run.preset.dynamics_every == 0 or it == settings.iterations - 1:
            append_jsonl(dyn, {"step": it, "r_multi": m["success_rate"], **r_single(st.params)})
        ckpt_lib.save(manager, st, run.cfg, step=it, force=True, extra={"settings": recorded})

    if state is None:
        state = stages.init_arm_state(rt, run.cfg, jax.random.key(seed), base_params)
        append_jsonl(dyn, {"step": -1, "r_multi": float("nan"), **r_single(base_params)})
    state, _ = stages.train_rl(rt, settings, run.preset.task.sample, run.preset.task.t_max, state, callback=cb)
    bar.close()
    ckpt_lib.wait_until_finished(manager)
    save_policy(os.path.join(out, "policy"), run.cfg, state.params)
    mark_done(out, {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": recorded})
    sync_processes(f"done:{out}")
    return state.params


R_SINGLE_MAPS_KEY, R_SINGLE_SAMPLE_KEY = 777, 778   # plus the run's seed offset: each seed set its own maps


def r_single_measure(run: Run):
    """measure(params) -> {"r_single": R_single, "r_single_tasks": [P] per-map plan success, "n_samples": Z}:
    FrozenLake's R_single (`plan_mode.plan_success`: the whole plan in one reply, no feedback) on P =
    eval.n_plan_tasks held-out maps (key R_SINGLE_MAPS_KEY + seed offset) with Z = eval.n_plan_samples replies
    each, sampled with the fixed key R_SINGLE_SAMPLE_KEY + seed offset at every measurement (common random
    numbers: the base and every logged iteration of every arm see the same draws), in generate calls of the
    preset's rollout batch (`Preset.rollout_batch`) rows."""
    p = run.preset
    maps = p.task.sample(jax.random.key(R_SINGLE_MAPS_KEY + run.seed_offset), p.eval.n_plan_tasks)
    key = jax.random.key(R_SINGLE_SAMPLE_KEY + run.seed_offset)

    def measure(params) -> dict:
        ok = plan_mode.plan_success(run.world, run.cfg, params, maps, key, t_max=p.task.t_max,
                                    n_samples=p.eval.n_plan_samples, env_params=p.task.env_params(),
                                    max_context=p.task.max_context, batch_size=p.rollout_batch, mesh=run.mesh,
                                    compute_dtype=stages.resolve_compute_dtype(p.compute_dtype))
        per_map = ok.mean(axis=1)
        return {"r_single": float(per_map.mean()), "r_single_tasks": [float(x) for x in per_map],
                "n_samples": int(ok.shape[1])}

    return measure


def make_runtime(run: Run, settings: stages.ArmSettings) -> stages.ArmRuntime:
    """The arm's compiled pieces on the run's mesh, with the preset's compute dtype."""
    p = run.preset
    return stages.make_arm_runtime(run.world, run.cfg, p.task, settings, mesh=run.mesh,
                                   compute_dtype=run.compute_dtype, micro_batches=p.micro_batches, remat=p.remat,
                                   tis_cap=p.tis_cap, scan_layers=p.scan_layers)


def run_all_arms(run: Run, base_params, arms=None, seeds=None, log=silent, progress=no_progress):
    """Every arm x seed; arms with equal compiled settings share one runtime (one compile). After each arm x
    seed, a line to `log` with the RL stage's ETA (`eta_line`)."""
    runtimes, done, took = {}, [], []
    arms, seeds = arms or run.preset.arms, seeds or run.preset.seeds
    for arm in arms:
        settings = run.arm_settings(arm)
        key = stages.shared_key(settings)
        if key not in runtimes:
            runtimes[key] = make_runtime(run, settings)
        for seed in seeds:
            t0 = time.time()
            run_arm(run, arm, seed, base_params, runtime=runtimes[key], log=log, progress=progress)  # params not kept
            xla_options.release_freed_host_memory()
            took.append(time.time() - t0)
            done.append((arm, seed))
            if is_main_process():
                log(eta_line(took, len(arms) * len(seeds)))
    return saved_policies(run, done)


def eta_line(took_s, total: int, *, finished_below_s: float = 2.0) -> str:
    """'[RL] 3 of 10 arm x seed runs done (41 s); about 95 s left for 7 at 14 s each': the mean time of the runs
    that trained here (those under `finished_below_s`, finished before and only read back, are left out of the
    mean; none trained yet: no estimate)."""
    trained = [t for t in took_s if t >= finished_below_s]
    left = total - len(took_s)
    head = f"[RL] {len(took_s)} of {total} arm x seed runs done ({sum(took_s):.0f} s)"
    if left == 0:
        return head
    if not trained:
        return f"{head}; {left} left"
    each = sum(trained) / len(trained)
    return f"{head}; about {left * each:.0f} s left for {left} at {each:.0f} s each"


def saved_policies(run: Run, keys) -> SavedPolicies:
    """The trained policies of `keys` (arm, seed) of `run`, each loaded from arms/<arm>/seed<s>/policy on demand."""
    return SavedPolicies(keys, lambda arm, seed: run.load_policy(run.path("arms", arm, f"seed{seed}")))
