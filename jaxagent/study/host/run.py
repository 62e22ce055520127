"""The host-domain study's run directory and its first two stages: the base checkpoint (`run_base`) and the RL arms
x seeds (`run_arms`), resumable from their checkpoints (`HostRun`).

runs/<name>/
  config.json                          the preset (+ the checkpoint used)
  tiny_checkpoint/                     CI and toy presets: the random Qwen3 with its tokenizer (HF layout)
  base/DONE                            the arms' start; toy presets (`sft`): the SFT summary, base/policy/, sft.jsonl
  arms/<arm>/seed<k>/  metrics.jsonl, ckpt/ (orbax, the 2 newest iterations: resumable), policy/ (HF layout), DONE;
                       dynamics.jsonl on the coding domain (finding 6: R_multi and R_single, `host_dynamics`)
The evaluation stage's files are `evaluate`'s, the report's `report.write_report`'s. One run writes a run directory
at a time (`run_dir.RunDir`); the checkpoint, its tokenizer and the settings are checked before the directory is
created. A finished arm/seed (DONE) is reused on a rerun, an interrupted one resumes from its latest checkpoint;
other settings are refused unless `force` (the mesh, the seeds and the arms may change:
`common.run_checks.RESULT_NEUTRAL`). In a multi-process job every process runs the same program and process 0
writes the run directory. Resuming, meshes and processes in full: docs/host_study.md, "The run directory".
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Callable, Optional

import jax

from jaxagent import sharding, xla_options
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.models import pruned_tokenizer, qwen3, weights
from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.study import run_dir
from jaxagent.study.common import arms as arms_lib, run_checks
from jaxagent.study.common.policies import SavedPolicies, save_policy
from jaxagent.study.common.progress import no_progress
from jaxagent.study.host import (dynamics as host_dynamics, metrics as host_metrics, sft as host_sft,
                                 domains as host_domains, stages as host_stages)
from jaxagent.study.host.presets import HostPreset, data_env, run_name
from jaxagent.study.host.domains import get_domain


def no_log(_message: str) -> None:
    """The default `log`: progress lines are dropped."""


def write_tiny_checkpoint(path: str, cfg, seed: int = 0, corpus: Optional[Callable[[], list]] = None) -> str:
    """A random Qwen3 of `cfg` saved in HF layout with the real Qwen3 tokenizer's files beside it; with `corpus`
    (a function returning texts) the tokenizer is Qwen3's pruned to the tokens of those texts
    (`pruned_tokenizer.prune_tokenizer`) and the model's vocabulary is its size rounded up to a multiple of 64."""
    if not os.path.isfile(os.path.join(path, "DONE")):
        os.makedirs(path, exist_ok=True)
        src = qwen3_tokenizer_dir()
        if corpus is None:
            for name in os.listdir(src):
                shutil.copy(os.path.join(src, name), os.path.join(path, name))
        else:
            tok = pruned_tokenizer.prune_tokenizer(Tokenizer.from_dir(src), corpus(), path)
            cfg = dataclasses.replace(cfg, vocab_size=-(-tok.vocab_size // 64) * 64)
        weights.save(path, cfg, qwen3.init(cfg, jax.random.key(seed)))
        run_dir.mark_done(path)
    return path


def heldout_pool(env, domain, preset: HostPreset) -> list:
    """Every task whose prompt a toy preset's pruned tokenizer is made from, besides the train split: the held-out
    split and the further held-out splits the env offers (`HostTaskSettings.extra_heldout`)."""
    names = [domain.heldout_split] + [x for x in preset.task.extra_heldout if x in getattr(env, "split_notes", {})]
    return [t for name in names for t in env.tasks(name)]


class HostRun:
    """A run directory of one host preset: its checkpoint, model config, tokenizer, world and device mesh."""

    def __init__(self, preset: HostPreset, root: str = "runs", name: str | None = None, force: bool = False):
        # Everything that can be checked is checked before the run directory is touched: a wrong setting or
        # checkpoint must not leave a config.json that refuses the corrected rerun.
        self.preset = preset
        run_checks.check_preset(preset)
        self.mesh = run_checks.make_run_mesh(preset)  # InvalidSettings unless the mesh covers every device of the job
        if self.mesh is None and jax.process_count() > 1:
            raise run_dir.InvalidSettings(
                f"preset {preset.name!r} runs on one device (mesh (1, 1, 1)), but this job has {jax.process_count()} "
                f"processes; a multi-process run needs a preset whose mesh covers all {jax.device_count()} devices")
        run_checks.check_batches(preset, sharding.batch_divisor(self.mesh))  # InvalidSettings
        if preset.policy_positions and sharding.batch_divisor(self.mesh) > 1:
            raise run_dir.InvalidSettings(
                f"preset {preset.name!r}: policy_positions packs each update's policy tokens into one list, which "
                f"needs one batch shard; mesh {tuple(preset.mesh)} has data x fsdp = "
                f"{sharding.batch_divisor(self.mesh)} (use a mesh (1, 1, tensor), or policy_positions=False)")
        if preset.checkpoint:
            self.checkpoint = preset.checkpoint
            self.cfg, self.tokenizer = run_dir.open_checkpoint(preset.checkpoint)
        env = data_env(preset)  # InvalidSettings naming the file for unusable --data, before anything is written
        self.dir = os.path.abspath(os.path.join(root, name or run_name(preset)))
        self.run_dir = run_dir.RunDir(self.dir)  # created and locked: RunDirInUse while another run writes it
        record = run_dir.plain(preset)
        _, diff = self.run_dir.config_diff(record, run_checks.RESULT_NEUTRAL,
                                           defaults={"rehearsal": False, "seed_offset": 0, "scan_layers": False})
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
            corpus = None
            if preset.pruned_vocabulary:
                domain = get_domain(preset.task.domain)
                env = domain.make_env() if env is None else env
                corpus = lambda: host_sft.tokenizer_corpus(env, env.tasks(domain.train_split),  # noqa: E731
                                                           heldout_pool(env, domain, preset), preset.task.t_max)
            if run_dir.is_main_process():  # process 0 writes the run directory; the others wait for it
                write_tiny_checkpoint(self.checkpoint, preset.tiny_model, seed=preset.seed_offset, corpus=corpus)
            run_dir.sync_processes(f"host-run-dir:{self.dir}")
            self.cfg, self.tokenizer = run_dir.open_checkpoint(self.checkpoint)
        self.world = host_stages.make_host_world(preset.task, self.tokenizer, env=env)
        self.tiers = budgets_lib.budget_tiers(preset.task.t_max, preset.eval.fractions)

    def path(self, *parts) -> str:
        p = os.path.join(self.dir, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def arm_settings(self, arm: str) -> arms_lib.ArmSettings:
        """Arm `arm` of the run's preset (`host_arm_settings`)."""
        return host_arm_settings(self.preset, arm)


def host_arm_settings(preset: HostPreset, arm: str) -> arms_lib.ArmSettings:
    """Arm `arm` of a host preset (`common.arms.arm_settings`: estimator, batch, epochs, lr, KL coefficient and
    estimator, entropy), sampling at the preset's temperature."""
    return arms_lib.arm_settings(preset, arm, temperature=preset.temperature)


def run_base(run: HostRun, log: Callable[[str], None] = no_log, progress=no_progress):
    """Stage 'base': the checkpoint's params (on the run's mesh); base/DONE names the checkpoint. A preset with
    `sft` fine-tunes them on the train split's reference solutions first (`host_sft.train_sft_base`): the base is
    then base/policy (HF layout), base/sft.jsonl has every SFT step's record and base/DONE the summary."""
    _, params = weights.load(run.checkpoint, mesh=run.mesh)
    out, p = run.path("base"), run.preset
    if p.sft is None:
        if not run_dir.done(out):
            run_dir.mark_done(out, {"source": run.checkpoint})
        return params
    policy, log_path = os.path.join(out, "policy"), os.path.join(out, "sft.jsonl")
    if run_dir.done(out):
        progress(p.sft.steps, "base SFT", "step", initial=p.sft.steps).close()
        return weights.load(policy, mesh=run.mesh)[1]
    if run_dir.is_main_process() and os.path.isfile(log_path):
        os.remove(log_path)  # of an SFT killed before its DONE: it restarts
    bar = progress(p.sft.steps, "base SFT", "step")

    def cb(i, rec):
        run_dir.append_jsonl(log_path, rec)
        bar.step(loss=f"{rec['loss']:.3f}", acc=f"{rec['token_accuracy']:.2f}")
        if i % 50 == 0 or i == p.sft.steps - 1:
            log(f"[base] SFT step {i}: loss {rec['loss']:.3f}, token accuracy {rec['token_accuracy']:.3f}")

    params, summary = host_sft.train_sft_base(run.world, run.cfg, params, p.task, p.sft, callback=cb, mesh=run.mesh)
    bar.close()
    save_policy(policy, run.cfg, params)
    run_dir.mark_done(out, {"source": run.checkpoint, "sft": summary})
    return params


def arm_stage_settings(run: HostRun, arm: str, seed: int) -> dict:
    """What determines an arm/seed's policy and logs (recorded in its checkpoints' extra and its DONE; a resume
    from a checkpoint saved with other settings is refused)."""
    p = run.preset
    sft = {} if p.sft is None else {"sft": p.sft, "pruned_vocabulary": p.pruned_vocabulary}
    return run_dir.plain({"base": p.checkpoint, "tiny_model": p.tiny_model, **sft, "arm": run.arm_settings(arm),
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
    abstract = arms_lib.abstract_arm_state(runtime, run.cfg, jax.random.key(seed), base_params)
    return manager, ckpt_lib.restore_latest(manager, abstract, cfg=run.cfg, expect_extra={"settings": recorded})


def run_arms(run: HostRun, base_params, log: Callable[[str], None] = no_log, runtimes: Optional[dict] = None,
             progress=no_progress):
    """Stage 'rl': every arm x seed; arms with equal optimisation settings share one runtime (one train-step compile;
    `runtimes`: a cache of them a caller keeps across calls, e.g. to resume arms in the same process without
    recompiling). Each iteration checkpoints the train state (arms/<arm>/seed<s>/ckpt, the 2 newest) after writing
    its logs; an interrupted arm resumes from its latest checkpoint, its logs cut back to the iterations before it.
    On the coding domain each seed of the main arm (grpo, the one finding 6 reads) also logs its R_multi and R_single
    (`host_dynamics`) into dynamics.jsonl:
    the base at step -1, then after every `dynamics_every` updates and the last. Returns the trained policies
    (`SavedPolicies`: (arm, seed) -> params, read from arms/<arm>/seed<s>/policy when asked for)."""
    p, done = run.preset, []
    runtimes = {} if runtimes is None else runtimes  # settings -> (runtime, its latest rollout's host numbers)
    r_single, base_rs = None, []
    if host_domains.uses_env(run.world.domain.name, host_dynamics.DOMAINS):
        host_dynamics.should_measure(0, p.dynamics_every, p.iterations)  # a bad dynamics_every fails before training
        if host_metrics.MAIN_ARM in p.arms:  # only the main arm's seeds measure it (finding 6 reads those)
            r_single = host_dynamics.make_r_single(run.world, run.cfg, p.task, n_samples=p.eval.n_samples,
                                                   batch_size=p.eval.batch_size, compute_dtype=p.compute_dtype,
                                                   mesh=run.mesh)
    for arm in p.arms:
        settings = run.arm_settings(arm)
        key = arms_lib.shared_key(settings)
        for seed in p.seeds:
            out = run.path("arms", arm, f"seed{seed}")
            done.append((arm, seed))
            if run_dir.done(out):
                progress(settings.iterations, f"{arm} seed {seed}", "iteration", initial=settings.iterations).close()
                continue
            if key not in runtimes:
                host = {}  # the latest training rollout's host numbers (`host_stages.trace_metrics`), for its record
                runtimes[key] = (host_stages.make_host_arm_runtime(
                    run.world, run.cfg, p.task, settings, mesh=run.mesh, compute_dtype=p.compute_dtype,
                    micro_batches=p.micro_batches, remat=p.remat, compiler_options=dict(p.compiler_options) or None,
                    scan_layers=p.scan_layers,
                    on_trace=lambda trace, host=host: host.update(host_stages.trace_metrics(trace)),
                    packed_policy=p.policy_positions), host)
            runtime, host = runtimes[key]
            label, recorded = f"{arm}/seed{seed}", arm_stage_settings(run, arm, seed)
            dyn = r_single if arm == host_metrics.MAIN_ARM else None  # finding 6 reads the main arm's seeds only
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
                if dyn is not None:
                    if not base_rs:  # the base's R_single is the same for every arm and seed (one fixed key)
                        base_rs.append(r_single(base_params))
                    run_dir.append_jsonl(dyn_path, host_dynamics.record(-1, float("nan"), 0, base_rs[0]))
            bar = progress(settings.iterations, f"{arm} seed {seed}", "iteration",
                           initial=0 if state is None else int(state.data_pos) // settings.rl.n_tasks)

            def cb(it, m, st, label=label, metrics_path=metrics_path, dyn_path=dyn_path, manager=manager,
                   recorded=recorded, settings=settings, host=host, dyn=dyn, bar=bar):
                run_checks.check_update(label, it, m, st)  # before anything of this iteration is written
                run_dir.append_jsonl(metrics_path, {**m, **host})
                if dyn is not None and host_dynamics.should_measure(it, p.dynamics_every, settings.iterations):
                    run_dir.append_jsonl(dyn_path, host_dynamics.record(it, m["success_rate"], settings.rl.batch_size,
                                                                        dyn(st.params)))
                ckpt_lib.save(manager, st, run.cfg, step=it, force=True, extra={"settings": recorded})
                bar.step(success=f"{m['success_rate']:.2f}")
                log(f"[{label}] iteration {it}: success {m['success_rate']:.2f}, valid {m['valid_action_rate']:.2f}")

            state, _ = host_stages.train_host_rl(run.world, run.cfg, base_params, jax.random.key(seed), p.task,
                                                 settings, runtime, callback=cb, state=state)
            ckpt_lib.wait_until_finished(manager)
            bar.close()
            save_policy(os.path.join(out, "policy"), run.cfg, state.params)
            run_dir.mark_done(out, {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": recorded})
            del state  # the trained params are read back from <out>/policy when evaluated (`SavedPolicies`)
            xla_options.release_freed_host_memory()
    return SavedPolicies(done, lambda arm, seed: weights.load(
        os.path.join(run.path("arms", arm, f"seed{seed}"), "policy"), mesh=run.mesh)[1])
