"""The study on a host-env domain (SQL, BFCL multi-turn, multi-turn coding; the preset names it): base checkpoint ->
RL arms x seeds -> held-out Pass@(K,T) with the structural bound -> runs/<name>/report.md. Also
`python -m experiments.reproduce --preset <host preset> [--checkpoint DIR]` (docs/host_study.md).

runs/<name>/
  config.json                          the preset (+ the checkpoint used)
  tiny_checkpoint/                     CI presets: the random Qwen3 with the real Qwen3 tokenizer (HF layout)
  base/DONE                            the checkpoint the arms start from
  arms/<arm>/seed<k>/  metrics.jsonl, ckpt/ (orbax, the 2 newest iterations: resumable), policy/ (HF layout), DONE;
                       dynamics.jsonl on the coding domain (finding 6: R_multi and R_single, `host_dynamics`)
  eval/<policy>.json                   raw per-episode log (success, status, turns [U, P, Z]; `episodes`: per
                                       episode, tier-major, the replies and per-step tool_error / failure / done
                                       flags, on finding-3 and finding-4 domains; `f5_tokens`: the full-budget
                                       episodes' tokens and policy-token spans, on finding-5 domains) and Pass@(K,T)
  eval/f3_grpo_seed<s>.json            finding 3 (coding): matched states of base's and seed s's full-budget episodes,
                                       G replies of each policy per state, their unit-test pass rates
                                       (`host_step_quality`)
  eval/f4_grpo_seed<s>.json            finding 4 (BFCL): the error prefixes of base's and seed s's full-budget
                                       episodes, each continued once by each policy, judged (`host_error_recovery`)
  eval/f5_grpo_seed<s>.json            finding 5 (BFCL): base's and seed s's full-budget episodes (their tokens kept
                                       in the eval logs' `f5_tokens`), every policy token scored under both policies:
                                       per episode action NLLs under base, LLR, policy tokens (`host_likelihood`)
  eval/bound.json                      reference turns per held-out task and the bound per tier
  metrics.json, report.md, timing.json
One run writes a run directory at a time (`jaxagent.study.run_dir`: a second gets RunDirInUse, naming the first's
pid); the checkpoint, its tokenizer and the settings are checked before the directory is created.
A finished arm/seed (DONE) and a cached evaluation are reused on a rerun; an interrupted arm resumes from its latest
checkpoint (its logs cut back to it), unless that checkpoint was saved with other settings (refused, naming them). A
rerun with other settings refuses unless --force (which empties the run directory); the mesh, the seeds and the arms
may change (`study.RESULT_NEUTRAL`).
Device mesh: a preset's `mesh` other than (1, 1, 1) runs the train step and the rollouts sharded on a mesh over
every device of the job (`study.make_run_mesh`). Several processes (a multi-host job, e.g. the v5p pod presets:
every process runs this same script): every process runs every rollout and steps every episode's env (`host_loop`
module docstring, multi-process); process 0 writes the run directory, the metrics, checkpoints and the report,
the others waiting where they read them (DONE markers and eval logs, the same on every process, are written
atomically by each).
Each arm iteration's metrics record adds the rollout's host numbers (`host_stages.trace_metrics`: model vs env
wall seconds, episodes ended by an env error or time-out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time

import jax
import numpy as np

from experiments import cli, study
from experiments.host_presets import HOST_PRESETS, HostPreset, data_env, data_problem
from jaxagent import sharding
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.eval import health
from jaxagent.models import qwen3, weights
from jaxagent.models.tokenizer import qwen3_tokenizer_dir
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.sampling import Sampler
from jaxagent.study import host_dynamics
from jaxagent.study import host_error_recovery, host_eval, host_likelihood, host_report, host_stages, stages
from jaxagent.study import host_step_quality, run_dir


def parser(prog: str = "experiments.host_study") -> argparse.ArgumentParser:
    p = cli.Parser(prog=cli.script_prog(prog), description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(HOST_PRESETS), metavar="PRESET",
                   help="domain and scale: " + ", ".join(sorted(HOST_PRESETS)) + " (ci-*: a tiny random Qwen3 with "
                        "the real tokenizer, minutes on a 2-core CPU; the others need --checkpoint)")
    p.add_argument("--name", default=None, help="run name (default: the preset's)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--checkpoint", default=None, help="local Hugging Face Qwen3 directory (with its tokenizer)")
    p.add_argument("--data", default=None, help="sql / code: a local Spider or InterCode-SQL directory, or "
                   "DeepCoder-style JSON / JSONL problems (default: the built-in tasks; docs/host_study.md, Data)")
    p.add_argument("--iterations", type=cli.positive_int, default=None, help="override the RL iterations per arm")
    p.add_argument("--seeds", type=cli.seed_int, nargs="+", default=None, help="override the RL seeds")
    p.add_argument("--force", action="store_true", help="empty a run directory made with other settings")
    cli.add_distributed(p)
    return p


def wants(argv, prog: str | None = None) -> bool:
    """Whether a command line (e.g. reproduce's, `prog`) names a host preset."""
    pre = cli.Parser(prog=cli.script_prog(prog), add_help=False)
    pre.add_argument("--preset", default=None)
    args, _ = pre.parse_known_args(argv)
    return args.preset in HOST_PRESETS


def preset_from(args) -> HostPreset:
    p = HOST_PRESETS[args.preset]
    changes = {k: v for k, v in (("checkpoint", args.checkpoint), ("data", args.data), ("iterations", args.iterations),
                                 ("seeds", tuple(args.seeds) if args.seeds else None)) if v is not None}
    if len(set(changes.get("seeds", ()))) != len(changes.get("seeds", ())):
        cli.fail(f"--seeds must be distinct, got {' '.join(map(str, args.seeds))}")
    p = dataclasses.replace(p, **changes)
    if data_problem(p) is not None:
        cli.fail(data_problem(p))
    if p.checkpoint is None and p.tiny_model is None:
        cli.fail(f"preset {p.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    return p


def write_tiny_checkpoint(path: str, cfg, seed: int = 0) -> str:
    """A random Qwen3 of `cfg` saved in HF layout with the real Qwen3 tokenizer's files beside it."""
    if not os.path.isfile(os.path.join(path, "DONE")):
        weights.save(path, cfg, qwen3.init(cfg, jax.random.key(seed)))
        src = qwen3_tokenizer_dir()
        for name in os.listdir(src):
            shutil.copy(os.path.join(src, name), os.path.join(path, name))
        run_dir.mark_done(path)
    return path


class HostRun:
    """A run directory of one host preset: its checkpoint, model config, tokenizer, world and device mesh."""

    def __init__(self, preset: HostPreset, root: str = "runs", name: str | None = None, force: bool = False):
        # Everything that can be checked is checked before the run directory is touched (`study.Run`).
        self.preset = preset
        study.check_preset(preset)
        self.mesh = study.make_run_mesh(preset)  # InvalidSettings unless the mesh covers every device of the job
        if self.mesh is None and jax.process_count() > 1:
            raise run_dir.InvalidSettings(
                f"preset {preset.name!r} runs on one device (mesh (1, 1, 1)), but this job has {jax.process_count()} "
                f"processes; a multi-process run needs a preset whose mesh covers all {jax.device_count()} devices")
        study.check_batches(preset, sharding.batch_divisor(self.mesh))  # InvalidSettings
        if preset.checkpoint:
            self.checkpoint = preset.checkpoint
            self.cfg, self.tokenizer = run_dir.open_checkpoint(preset.checkpoint)
        self.dir = os.path.abspath(os.path.join(root, name or preset.name))
        self.run_dir = run_dir.RunDir(self.dir)  # created and locked: RunDirInUse while another run writes it
        record = run_dir.plain(preset)
        _, diff = self.run_dir.config_diff(record, study.RESULT_NEUTRAL)
        if diff and not force:
            raise run_dir.SettingsMismatch(
                f"run directory {self.dir} was made with other settings ({len(diff)} differ, as recorded vs now): "
                f"{run_dir.short(diff)}. Rerun with the same settings, choose another --name/--root, or pass --force "
                "to empty it and start again")
        if diff:
            self.run_dir.empty()
        self.run_dir.write_config(record)
        if not preset.checkpoint:
            self.checkpoint = os.path.join(self.dir, "tiny_checkpoint")
            if run_dir.is_main_process():  # process 0 writes the run directory; the others wait for it
                write_tiny_checkpoint(self.checkpoint, preset.tiny_model)
            run_dir.sync_processes(f"host-run-dir:{self.dir}")
            self.cfg, self.tokenizer = run_dir.open_checkpoint(self.checkpoint)
        self.world = host_stages.make_host_world(preset.task, self.tokenizer, env=data_env(preset))
        self.tiers = budgets_lib.budget_tiers(preset.task.t_max, preset.eval.fractions)

    def path(self, *parts) -> str:
        p = os.path.join(self.dir, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def arm_settings(self, arm: str) -> stages.ArmSettings:
        """The FrozenLake study's arm settings from the same preset fields (`study.Run.arm_settings`: estimator,
        batch, epochs, lr, KL coefficient and estimator, entropy), with the preset's sampling temperature."""
        return dataclasses.replace(study.Run.arm_settings(self, arm), temperature=self.preset.temperature)


def run_base(run: HostRun):
    _, params = weights.load(run.checkpoint, mesh=run.mesh)
    out = run.path("base")
    if not run_dir.done(out):
        run_dir.mark_done(out, {"source": run.checkpoint})
    return params


def arm_stage_settings(run: HostRun, arm: str, seed: int) -> dict:
    """What determines an arm/seed's policy and logs (recorded in its checkpoints' extra and its DONE; a resume
    from a checkpoint saved with other settings is refused)."""
    p = run.preset
    return run_dir.plain({"base": p.checkpoint, "tiny_model": p.tiny_model, "arm": run.arm_settings(arm),
                         "seed": int(seed), "task": p.task, "compute_dtype": p.compute_dtype,
                         "dynamics_every": p.dynamics_every,
                         "r_single": {"n_samples": p.eval.n_samples, "batch_size": p.eval.batch_size}})


def resume_arm(run: HostRun, label: str, out: str, recorded: dict, runtime, seed: int, base_params):
    """(checkpoint manager of <out>/ckpt (keeps 2), the latest checkpoint's TrainState or None); SettingsMismatch
    when that checkpoint was saved with other settings than `recorded` (or without any)."""
    manager = ckpt_lib.make_manager(os.path.join(out, "ckpt"), max_to_keep=2)
    if manager.latest_step() is not None:
        saved = (ckpt_lib.read_metadata(manager).get("extra") or {}).get("settings")
        diff = ["settings: not recorded"] if saved is None else ckpt_lib.settings_diff(saved, recorded)
        if diff:
            where = ckpt_lib.step_directory(manager, manager.latest_step())
            raise run_dir.SettingsMismatch(
                f"stage {label}: the checkpoint {where} was saved with other settings ({len(diff)} differ, as saved "
                f"vs now): {run_dir.short(diff)}. Rerun with the same settings, choose another --name/--root, or "
                f"delete {out} to redo this arm from iteration 0")
    # the restore target carries the mesh shardings: a resumed state is sharded like a fresh one
    abstract = stages.abstract_arm_state(runtime, run.cfg, jax.random.key(seed), base_params)
    return manager, ckpt_lib.restore_latest(manager, abstract, cfg=run.cfg, expect_extra={"settings": recorded})


def run_arms(run: HostRun, base_params, log=print, runtimes: dict | None = None) -> dict:
    """Every arm x seed; arms with equal optimisation settings share one runtime (one train-step compile; `runtimes`:
    a cache of them a caller keeps across calls, e.g. to resume arms in the same process without recompiling). Each
    iteration checkpoints the train state (arms/<arm>/seed<s>/ckpt, the 2 newest) after writing its logs; an
    interrupted arm resumes from its latest checkpoint, its logs cut back to the iterations before it. On the
    coding domain each arm also logs finding 6's R_multi and R_single (`host_dynamics`) into dynamics.jsonl: the
    base at step -1, then every `dynamics_every` iterations and the last."""
    p, done = run.preset, []
    runtimes = {} if runtimes is None else runtimes  # settings -> (runtime, its latest rollout's host numbers)
    r_single, base_rs = None, []
    if run.world.domain.name in host_dynamics.DOMAINS:
        host_dynamics.should_measure(0, p.dynamics_every, p.iterations)  # a bad dynamics_every fails before training
        r_single = host_dynamics.make_r_single(run.world, run.cfg, p.task, n_samples=p.eval.n_samples,
                                               batch_size=p.eval.batch_size, compute_dtype=p.compute_dtype,
                                               mesh=run.mesh)
    for arm in p.arms:
        settings = run.arm_settings(arm)
        key = stages.shared_key(settings)
        for seed in p.seeds:
            out = run.path("arms", arm, f"seed{seed}")
            done.append((arm, seed))
            if run_dir.done(out):
                continue
            if key not in runtimes:
                host = {}  # the latest training rollout's host numbers (`host_stages.trace_metrics`), for its record
                runtimes[key] = (host_stages.make_host_arm_runtime(
                    run.world, run.cfg, p.task, settings, mesh=run.mesh, compute_dtype=p.compute_dtype,
                    micro_batches=p.micro_batches, remat=p.remat, compiler_options=dict(p.compiler_options) or None,
                    on_trace=lambda trace, host=host: host.update(host_stages.trace_metrics(trace))), host)
            runtime, host = runtimes[key]
            label, recorded = f"{arm}/seed{seed}", arm_stage_settings(run, arm, seed)
            manager, state = resume_arm(run, label, out, recorded, runtime, seed, base_params)
            metrics_path, dyn_path = os.path.join(out, "metrics.jsonl"), os.path.join(out, "dynamics.jsonl")
            if state is not None:
                start = int(state.data_pos) // settings.rl.n_tasks
                log(f"[{label}] resuming at iteration {start}")
                # lines of iterations after the restored checkpoint (a kill between append and save) go
                run_dir.cut_jsonl(metrics_path, lambda r, start=start: r.get("iteration", start) < start)
                run_dir.cut_jsonl(dyn_path, lambda r, start=start: r.get("step", start) < start)
            else:
                for f in (metrics_path, dyn_path):
                    if run_dir.is_main_process() and os.path.isfile(f):  # the logs are process 0's
                        os.remove(f)  # of a run killed before its first checkpoint: it restarts from iteration 0
                if r_single is not None:
                    if not base_rs:  # the base's R_single is the same for every arm and seed (one fixed key)
                        base_rs.append(r_single(base_params))
                    run_dir.append_jsonl(dyn_path, host_dynamics.record(-1, float("nan"), 0, base_rs[0]))

            def cb(it, m, st, label=label, metrics_path=metrics_path, dyn_path=dyn_path, manager=manager,
                   recorded=recorded, settings=settings, host=host):
                study.check_update(label, it, m, st)  # before anything of this iteration is written
                run_dir.append_jsonl(metrics_path, {**m, **host})
                if r_single is not None and host_dynamics.should_measure(it, p.dynamics_every, settings.iterations):
                    run_dir.append_jsonl(dyn_path, host_dynamics.record(it, m["success_rate"], settings.rl.batch_size,
                                                                        r_single(st.params)))
                ckpt_lib.save(manager, st, run.cfg, step=it, force=True, extra={"settings": recorded})
                log(f"[{label}] iteration {it}: success {m['success_rate']:.2f}, valid {m['valid_action_rate']:.2f}")

            state, _ = host_stages.train_host_rl(run.world, run.cfg, base_params, jax.random.key(seed), p.task,
                                                 settings, runtime, callback=cb, state=state)
            ckpt_lib.wait_until_finished(manager)
            study.save_policy(os.path.join(out, "policy"), run.cfg, state.params)
            run_dir.mark_done(out, {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": recorded})
            del state  # the trained params are read back from <out>/policy when evaluated (`study.SavedPolicies`)
    return study.SavedPolicies(done, lambda arm, seed: weights.load(
        os.path.join(run.path("arms", arm, f"seed{seed}"), "policy"), mesh=run.mesh)[1])


def eval_policy(run: HostRun, load_params, label: str) -> dict:
    """Announced-mode Pass@(K,T) of the policy `load_params()` returns (called only when the evaluation is not
    cached) on the held-out tasks (cached in eval/<label>.json; on a finding-3
    or finding-4 domain the log keeps each episode's replies and step flags, on a finding-5 domain each full-budget
    episode's tokens and policy-token spans (`host_likelihood.TokenLog`), and a cached log without them is
    re-evaluated, with the same key)."""
    path = os.path.join(run.path("eval"), f"{label.replace('/', '_')}.json")
    keep = run.world.domain.name in host_error_recovery.DOMAINS + host_step_quality.DOMAINS  # findings 3, 4
    f5 = run.world.domain.name in host_likelihood.DOMAINS  # finding 5: the full-budget episodes' tokens are kept
    if os.path.isfile(path):
        with open(path) as f:
            cached = json.load(f)
        if (not keep or "episodes" in cached) and (not f5 or host_likelihood.LOG_KEY in cached):
            return cached
    p, w, params = run.preset, run.world, load_params()
    traces = []
    ro_fn = host_stages.make_host_rollout_fn(w, run.cfg, p.task, w.heldout_tasks, sampler=Sampler(temperature=1.0),
                                             compute_dtype=p.compute_dtype, mesh=run.mesh,
                                             on_trace=traces.append if keep else None)
    tok_log = host_likelihood.TokenLog(run.tiers[-1])
    rollout = lambda idx, b, k: ro_fn(params, idx, b, k)  # noqa: E731
    raw = host_stages.run_pass_episodes(tok_log.wrap(rollout) if f5 else rollout, len(w.heldout_tasks), run.tiers,
                                        p.eval.n_samples, jax.random.key(99), p.eval.batch_size)
    per_task = host_eval.pass_grid(raw["success"], p.eval.ks)
    res = {**raw, "ks": list(p.eval.ks), "task_ids": [getattr(t, "id", str(i)) for i, t in enumerate(w.heldout_tasks)],
           "per_task": per_task, "mean": per_task.mean(-1)}
    if keep:
        total = raw["status"].size
        sizes = [min(p.eval.batch_size, total - start) for start in range(0, total, p.eval.batch_size)]
        res["episodes"] = host_error_recovery.episode_records(traces, sizes)
    if f5:
        total = raw["status"].size
        sizes = [min(p.eval.batch_size, total - start) for start in range(0, total, p.eval.batch_size)]
        res[host_likelihood.LOG_KEY] = tok_log.log_entry(sizes, raw["status"].shape)
    run_dir.write_json(path, res)
    with open(path) as f:
        return json.load(f)


def read_dynamics(run: HostRun, policies) -> dict | None:
    """Finding 6's records per GRPO seed (arms/grpo/seed<s>/dynamics.jsonl, `host_dynamics.record`); None outside
    `host_dynamics.DOMAINS`."""
    if run.world.domain.name not in host_dynamics.DOMAINS:
        return None
    paths = {s: os.path.join(run.dir, "arms", a, f"seed{s}", "dynamics.jsonl") for a, s in policies
             if a == host_eval.MAIN_ARM}
    return {s: health.read_log(path) for s, path in sorted(paths.items()) if os.path.isfile(path)}


def evaluate(run: HostRun, base, policies: dict) -> dict:
    p, w, d = run.preset, run.world, run.world.domain.name
    evals = {"base": eval_policy(run, lambda: base, "base")}
    for a, s in policies:  # one policy loaded at a time (`study.SavedPolicies`)
        evals[f"{a}/seed{s}"] = eval_policy(run, lambda a=a, s=s: policies[(a, s)], f"{a}/seed{s}")
    bound = host_eval.structural_bound(w.min_turns(w.heldout_tasks), run.tiers, p.eval.ks)
    run_dir.write_json(os.path.join(run.path("eval"), "bound.json"),
                       {**bound, "tiers": list(run.tiers), "ks": list(p.eval.ks),
                        "task_ids": evals["base"]["task_ids"]})
    hl = {(a, s): health.classify_seed(health.read_log(os.path.join(run.dir, "arms", a, f"seed{s}", "metrics.jsonl")))
          for a, s in policies}
    per_task = {label: np.asarray(e["per_task"], np.float64) for label, e in evals.items()}
    # the findings' GRPO seeds, each seed's policy loaded only when its record is not cached
    seeds = [s for a, s in policies if a == host_eval.MAIN_ARM]
    rl = lambda s: lambda: policies[(host_eval.MAIN_ARM, s)]  # noqa: E731
    judged = stepq = lik = None
    if d in host_error_recovery.DOMAINS and seeds:
        judged = {s: error_prefixes(run, base, rl(s), evals, s) for s in seeds}
    if d in host_step_quality.DOMAINS and seeds:
        stepq = {s: step_quality_seed(run, base, rl(s), evals, s) for s in seeds}
    if d in host_likelihood.DOMAINS and seeds:
        memo = {}  # base's episodes scored under base, shared by the seeds
        lik = {s: likelihood_seed(run, base, rl(s), evals, s, memo) for s in seeds}
    return host_eval.domain_metrics(d, per_task, bound, run.tiers, p.eval.ks, hl, n_train=len(w.train_tasks),
                                    n_heldout=len(w.heldout_tasks), n_boot=p.eval.n_boot, error_prefixes=judged,
                                    likelihood=lik, dynamics=read_dynamics(run, policies), step_quality=stepq)


def error_prefixes(run: HostRun, base, load_rl, evals: dict, seed: int) -> dict:
    """Finding 4 for GRPO seed `seed` (cached in eval/f4_grpo_seed<s>.json): the error prefixes of base's and the
    seed's full-budget held-out episodes, one continuation each by base and by the seed, judged per prefix
    (`host_error_recovery`)."""
    def compute(label):
        p, w = run.preset, run.world
        prefixes = host_error_recovery.prefixes_from_log(evals, ["base", label], w.heldout_tasks, p.task.t_max)
        key = jax.random.fold_in(jax.random.key(404), seed)
        acts = {}
        for i, (name, prm) in enumerate((("base", base), ("rl", load_rl()))):
            acts[name] = host_error_recovery.continue_prefixes(
                prm, run.cfg, w, p.task, prefixes, jax.random.fold_in(key, i), p.eval.batch_size,
                sampler=Sampler(temperature=1.0), compute_dtype=stages.resolve_compute_dtype(p.compute_dtype),
                mesh=run.mesh)
        return {**host_error_recovery.judge(w.env, prefixes, acts["base"], acts["rl"]), "actions": acts}
    return seed_record(run, "f4", seed, compute)


def seed_record(run: HostRun, tag: str, seed: int, compute) -> dict:
    """A finding's record for GRPO seed `seed`, eval/<tag>_grpo_seed<s>.json: read when it exists, else
    `compute(label)` (label = 'grpo/seed<s>') and written (by process 0, `run_dir.write_json`)."""
    label = f"{host_eval.MAIN_ARM}/seed{seed}"
    path = os.path.join(run.path("eval"), f"{tag}_{label.replace('/', '_')}.json")
    if not os.path.isfile(path):
        res = compute(label)
        run_dir.write_json(path, res)
        return res
    with open(path) as f:
        return json.load(f)


def step_quality_seed(run: HostRun, base, load_rl, evals: dict, seed: int) -> dict:
    """Finding 3 for GRPO seed `seed` (cached in eval/f3_grpo_seed<s>.json): matched states drawn in equal numbers
    (at most eval.step_states each) from base's and the seed's full-budget held-out episodes, G = eval.step_samples
    replies of each policy per state (the same key for both: common random numbers), each scored by its unit-test
    pass rate (`host_step_quality`)."""
    def compute(label):
        p, w = run.preset, run.world
        states = host_step_quality.states_from_log(evals, "base", label, w.heldout_tasks, seed=303 + seed,
                                                   n_states=p.eval.step_states)
        key = jax.random.fold_in(jax.random.key(303), seed)
        scores = {name: host_step_quality.sample_scores(
            prm, run.cfg, w, p.task, states, key, p.eval.batch_size, p.eval.step_samples, run.tiers[-1],
            sampler=Sampler(temperature=1.0), compute_dtype=stages.resolve_compute_dtype(p.compute_dtype),
            mesh=run.mesh)
            for name, prm in (("base", base), ("rl", load_rl()))}
        return host_step_quality.record(states, scores["base"], scores["rl"])
    return seed_record(run, "f3", seed, compute)


def likelihood_seed(run: HostRun, base, load_rl, evals: dict, seed: int, memo: dict | None = None) -> dict:
    """Finding 5 for GRPO seed `seed` (cached in eval/f5_grpo_seed<s>.json): every policy token of base's and the
    seed's full-budget held-out episodes scored under both policies, per episode its action NLLs under base, its
    cumulative LLR and its policy-token count (`host_likelihood.score_seed`; rows per scoring batch: the train
    step's micro-batch, n_tasks x group_size / micro_batches, on the run's mesh and compute dtype)."""
    p = run.preset
    return seed_record(run, "f5", seed, lambda label: host_likelihood.score_seed(
        base, load_rl(), run.cfg, evals["base"], evals[label], batch_size=p.n_tasks * p.group_size // p.micro_batches,
        mesh=run.mesh, compute_dtype=stages.resolve_compute_dtype(p.compute_dtype), max_width=p.task.max_context,
        memo=memo))


def write_report(run: HostRun, metrics: dict) -> tuple[str, dict]:
    p, dom = run.preset, run.world.domain
    findings = host_eval.domain_findings(dom.name, dom.title)
    section, verdicts = host_report.domain_section(
        dom.name, dom.title, metrics, findings, policies=["base", *p.arms], tiers=run.tiers, ks=p.eval.ks,
        t_max=p.task.t_max, splits=(dom.train_split, dom.heldout_split),
        notes=(dom.split_note, dom.bound_note))
    meta = {"preset": p.name, "checkpoint": run.checkpoint, "arms": ", ".join(p.arms),
            "seeds": ", ".join(map(str, p.seeds)), "RL iterations per arm": str(p.iterations),
            "episodes per iteration": f"{p.n_tasks} tasks x {p.group_size}",
            "domain": f"{dom.name} ({dom.title}; env '{dom.env}')",
            "T_max": str(p.task.t_max), "tool-output cap (tokens per turn)": str(p.task.max_obs_tokens),
            "Pass@(K,T) mode": "announced", "samples per task and tier": str(p.eval.n_samples)}
    if dom.name in host_error_recovery.DOMAINS:
        meta["finding 4 error prefixes"] = ("base's and each GRPO seed's full-budget held-out episodes, steps with "
                                            "a tool-call error that did not end the episode; one reply per policy")
    if dom.name in host_step_quality.DOMAINS:
        meta["finding 3 matched states"] = (f"up to {p.eval.step_states} from each of base's and each GRPO seed's "
                                            "full-budget held-out episodes (equal numbers); "
                                            f"{p.eval.step_samples} replies per policy and state, each scored by its "
                                            "unit-test pass rate")
    if dom.name in host_likelihood.DOMAINS:
        meta["finding 5 likelihood"] = ("base's and each GRPO seed's full-budget held-out episodes, every policy "
                                        f"token scored teacher-forced under both policies ({p.compute_dtype})")
    text = host_report.build_host_report(meta, metrics, [section])
    path = os.path.join(run.dir, "report.md")
    if run_dir.is_main_process():  # several processes: process 0 writes the report
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        run_dir.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    run_dir.sync_processes(f"report:{run.dir}")
    return path, verdicts


def main(argv=None, prog: str = "experiments.host_study"):
    args = parser(prog).parse_args(argv)
    cli.init_distributed(args)  # before anything touches the devices
    t0 = time.time()
    with cli.clear_errors():
        run = HostRun(preset_from(args), args.root, args.name, force=args.force)
        base = run_base(run)
        t_base = time.time()
        policies = run_arms(run, base)
        t_rl = time.time()
        metrics = evaluate(run, base, policies)
        path, verdicts = write_report(run, metrics)
    t_end = time.time()
    timing = {"base_s": t_base - t0, "rl_s": t_rl - t_base, "eval_s": t_end - t_rl, "total_s": t_end - t0}
    if not run_dir.is_main_process():
        return
    run_dir.write_json(os.path.join(run.dir, "timing.json"), timing)
    print(f"report: {path}")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in verdicts.items()))
    print("wall time (s): " + ", ".join(f"{k}={v:.0f}" for k, v in timing.items()))


if __name__ == "__main__":
    main()
