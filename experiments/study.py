"""Stage runners of the study: run directories, resumability, progress bars, files.

runs/<name>/   (default name: the preset's, or <preset>-s<N> with a seed offset N)
  config.json                      the preset (+ seed_offset)
  tokenizer/                       the toy word-level tokenizer (toy presets)
  base/    policy/ (HF checkpoint), metrics.jsonl, DONE
  arms/<arm>/seed<k>/  ckpt/ (orbax, resumable), policy/, metrics.jsonl, dynamics.jsonl, DONE
  eval/<policy>.json, eval/DONE    every measured diagnostic
  figures/*.png, report.md, metrics.json
A stage with a DONE marker is skipped on a rerun; an interrupted RL stage resumes from its checkpoint,
and its metrics/dynamics files are cut back to the restored iteration (lines appended after the last
checkpoint are not repeated). The run directory's mechanics (its lock: one writer at a time, DONE markers,
the settings record, atomic JSON) are `jaxagent.study.run_dir`'s; a DONE marker that is not a JSON object is
an error (`InvalidMarker`), redone with --force. Everything a run can check (preset fields, mesh, batch split,
the checkpoint, its tokenizer and their vocabularies) is checked before the run directory is created.

Settings: config.json, each DONE marker and each RL checkpoint record the settings that determine their
result (`Run.base_settings`, `Run.arm_stage_settings`). A rerun in the same directory with other settings
raises SettingsMismatch naming them, unless the Run is made with force=True (`--force`): then every stage
whose recorded settings differ (or are unknown, for markers of older versions) is redone, and the
cached evaluations are dropped. The mesh and the choice of arms and seeds never count as a difference.
Seed offset N (`--seed-offset`): RL seed k -> k + N and the base SFT key BASE_SEED -> BASE_SEED + N.
An RL iteration whose update was skipped for non-finite gradients, or that leaves non-finite params,
stops the stage with NonFiniteError before its metrics and checkpoint are written.

Device mesh: a preset's `mesh` (data, fsdp, tensor) other than (1, 1, 1) runs the stages sharded on a
`sharding.make_mesh` mesh over every device (the product must equal `jax.device_count()`); (1, 1, 1)
runs on the default device as a plain single-device program. `compute_dtype` is the dtype of the RL
forward passes (train step and training rollouts); params and optimizer state stay float32.
Multi-process (`--distributed`): every process runs the same program on the global mesh; metrics,
dynamics and policies are written by process 0 only (policies gathered first), JSON files atomically by
each process, orbax checkpoints by orbax's own multi-host protocol.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import glob
import math
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from experiments.presets import Preset
from jaxagent import sharding
from jaxagent.envs.jax.frozenlake import FrozenLake
from jaxagent.models import weights
from jaxagent.models.config import CheckpointError
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rollout import chat_layout, env_codec, budget_format
from jaxagent.study import plan_mode, run_dir, stages
from jaxagent.study.run_dir import (InvalidSettings, SettingsMismatch, append_jsonl, cut_jsonl, is_main_process,
                                    mark_done, sync_processes)
from jaxagent.study.toy import ToyWorld, make_toy_world


BASE_SEED = 1000                      # PRNG key of the base SFT (plus the run's seed offset)
MAX_SEED = 2**31 - 1                  # seeds (offset included) are int32 PRNG seeds
MAX_ITERATIONS = 10**6                # the data position (iterations x tasks) is an int32
RESULT_NEUTRAL = ("mesh", "seeds", "arms")   # config.json fields a rerun may change: where/which, not what


class NonFiniteError(RuntimeError):
    """An RL update was non-finite (skipped by the optimizer's guard) or left non-finite params."""


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_preset(preset, seed_offset: int = 0):
    """InvalidSettings naming the field when a preset's counts make no sense (e.g. iterations < 1, a seed
    beyond an int32 PRNG seed once shifted by `seed_offset`)."""
    for field in ("iterations", "n_tasks", "group_size", "dynamics_every"):
        v = getattr(preset, field)
        if not _is_int(v) or v < 1:
            raise InvalidSettings(f"preset {preset.name!r}: {field} must be a positive integer, got {v!r}")
    if preset.iterations > MAX_ITERATIONS:
        raise InvalidSettings(f"preset {preset.name!r}: iterations must be at most {MAX_ITERATIONS}, got "
                              f"{preset.iterations}")
    seeds = tuple(preset.seeds)
    if not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
        raise InvalidSettings(f"preset {preset.name!r}: seeds must be one or more non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise InvalidSettings(f"preset {preset.name!r}: seeds must be distinct, got {seeds!r}")
    if max(seeds) + seed_offset > MAX_SEED - BASE_SEED:
        raise InvalidSettings(f"preset {preset.name!r}: seeds (plus the seed offset {seed_offset}) must be at most "
                              f"{MAX_SEED - BASE_SEED}, got {max(seeds) + seed_offset}")


def check_batches(preset, split: int) -> None:
    """InvalidSettings unless the episodes of one update (n_tasks x group_size / minibatches) split into
    `micro_batches` micro-batches whose rows divide over the mesh's `split` batch shards (data x fsdp,
    `sharding.batch_divisor`), as the sharded train step needs."""
    b, mb, micro = preset.n_tasks * preset.group_size, getattr(preset, "minibatches", 1), preset.micro_batches
    if not _is_int(micro) or micro < 1 or b % mb or (b // mb) % micro or (b // mb // micro) % split:
        raise InvalidSettings(
            f"preset {preset.name!r}: the RL batch n_tasks x group_size = {preset.n_tasks} x {preset.group_size} = "
            f"{b} must split into minibatches = {mb} updates of micro_batches = {micro!r} micro-batches of a multiple "
            f"of data x fsdp = {split} rows (mesh {tuple(preset.mesh)})")


def _all_finite_leaves(tree):
    return jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)), tree)


_all_finite_leaves_jit = jax.jit(_all_finite_leaves)


def nonfinite_leaves(tree) -> list[str]:
    """Paths of the floating leaves of `tree` holding a NaN or Inf."""
    floats = jax.tree.map(lambda x: x if jnp.issubdtype(x.dtype, jnp.floating) else None, tree)
    flags = jax.device_get(_all_finite_leaves_jit(floats))
    return [jax.tree_util.keystr(path) for path, ok in jax.tree_util.tree_flatten_with_path(flags)[0] if not ok]


def check_update(label: str, it: int, metrics: dict, state):
    """Raises NonFiniteError when iteration `it` skipped an update for non-finite gradients (the optimizer's
    guard, `skipped` / `critic_skipped` > 0), reports a non-finite loss or gradient norm, or left non-finite
    params (policy or critic)."""
    problems = []
    for k in ("skipped", "critic_skipped"):
        v = metrics.get(k, 0.0)
        if not math.isfinite(v) or v > 0:
            problems.append(f"{k}={v:.3g} (share of this iteration's updates the optimizer skipped because "
                            "their gradients were not finite)")
    for k in ("loss", "grad_norm", "critic_grad_norm"):
        if k in metrics and not math.isfinite(metrics[k]):
            problems.append(f"{k}={metrics[k]}")
    for name in ("params", "critic_params"):
        tree = getattr(state, name, None)
        bad = [] if tree is None else nonfinite_leaves(tree)
        if bad:
            problems.append(f"non-finite {name}: {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}")
    if problems:
        raise NonFiniteError(
            f"[{label}] RL iteration {it} diverged: {'; '.join(problems)}. Stopped before its metrics and "
            f"checkpoint were written (the run resumes from iteration {it}); lower the learning rate or "
            "check the inputs before rerunning")


def save_policy(path, cfg, params):
    """weights.save of (possibly sharded, possibly multi-process) params, written by process 0."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(params, tiled=True)
    if is_main_process():
        weights.save(path, cfg, params)
    sync_processes(f"save_policy:{path}")


def make_run_mesh(preset):
    """The preset's (data, fsdp, tensor) mesh over all devices, or None for (1, 1, 1) (default device).

    Raises InvalidSettings when the mesh is malformed or its product differs from jax.device_count().
    """
    shape = tuple(preset.mesh)
    if len(shape) != 3 or not all(_is_int(n) and n >= 1 for n in shape):
        raise InvalidSettings(f"preset {preset.name!r}: mesh must be three positive ints (data, fsdp, tensor), "
                              f"got {preset.mesh!r}")
    n = math.prod(int(d) for d in shape)
    if n == 1:
        return None
    if n != jax.device_count():
        raise InvalidSettings(f"preset {preset.name!r} has mesh (data, fsdp, tensor) = {shape}, which needs {n} "
                              f"devices, but jax.device_count() = {jax.device_count()} ({jax.devices()[0].platform}); "
                              "pick a preset/--mesh whose product is the device count")
    return sharding.make_mesh(*shape)


def _check_compute_dtype(preset: Preset):
    try:
        dt = jnp.dtype(preset.compute_dtype)
    except TypeError:
        raise InvalidSettings(f"preset {preset.name!r}: compute_dtype {preset.compute_dtype!r} is not a dtype "
                              "name (e.g. 'float32', 'bfloat16')") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise InvalidSettings(f"preset {preset.name!r}: compute_dtype must be a floating dtype, got {dt}")
    return dt


class Run:
    """A run directory with the world, model config, device mesh and stage paths of one preset.

    `mesh` is the preset's device mesh (None for (1, 1, 1)), built once here; `compute_dtype` the
    jnp dtype of the RL forward passes."""

    def __init__(self, preset: Preset, root: str = "runs", name: str | None = None, *, seed_offset: int = 0,
                 force: bool = False):
        # Everything that can be checked is checked before the run directory is touched: a wrong setting or
        # checkpoint must not leave a config.json that refuses the corrected rerun.
        if not _is_int(seed_offset) or seed_offset < 0:
            raise InvalidSettings(f"seed_offset must be a non-negative integer, got {seed_offset!r}")
        check_preset(preset, int(seed_offset))
        self.seed_offset, self.force = int(seed_offset), bool(force)
        if self.seed_offset:
            preset = dataclasses.replace(preset, seeds=tuple(int(s) + self.seed_offset for s in preset.seeds))
        self.base_seed = BASE_SEED + self.seed_offset
        self.preset = preset
        unknown = [a for a in preset.arms if a not in stages.ARMS]
        if unknown or not preset.arms:
            raise InvalidSettings(f"preset {preset.name!r}: arms must be one or more of {sorted(stages.ARMS)}, got "
                                  f"{list(preset.arms)!r}")
        self.compute_dtype = _check_compute_dtype(preset)
        self.mesh = make_run_mesh(preset)
        check_batches(preset, sharding.batch_divisor(self.mesh))
        if preset.checkpoint:
            self.cfg, tok = run_dir.open_checkpoint(preset.checkpoint)
            try:
                codec = env_codec(tok, FrozenLake.vocabulary() + plan_mode.PLAN_WORDS, FrozenLake.ACTION_STRINGS,
                                  word_level=False)
            except ValueError as e:
                raise CheckpointError(f"the tokenizer in {preset.checkpoint} cannot write FrozenLake's text: "
                                      f"{e}") from None
            self.world = ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size),
                                  chat_layout(tok, FrozenLake.system_prompt()), budget_format(codec))
        default = preset.name if not self.seed_offset else f"{preset.name}-s{self.seed_offset}"
        self.dir = os.path.abspath(os.path.join(root, name or default))
        self.run_dir = run_dir.RunDir(self.dir)  # created and locked: RunDirInUse while another run writes it
        record = {**run_dir.plain(preset), "seed_offset": self.seed_offset}
        self._check_run_settings(record)
        self.run_dir.write_config(record)
        if not preset.checkpoint:
            self.world = make_toy_world(os.path.join(self.dir, "tokenizer"), size=preset.task.size)
            self.cfg = dataclasses.replace(preset.model, vocab_size=self.world.tokenizer.vocab_size)

    def path(self, *parts) -> str:
        p = os.path.join(self.dir, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def close(self) -> None:
        """Releases the run directory's lock (also released when the process ends)."""
        self.run_dir.release()

    def _check_run_settings(self, record: dict):
        """Compares config.json (if any) with `record`; SettingsMismatch unless force (which drops eval/)."""
        _, diff = self.run_dir.config_diff(record, RESULT_NEUTRAL, defaults={"seed_offset": 0})
        if not diff:
            return
        if not self.force:
            raise SettingsMismatch(
                f"run directory {self.dir} was made with other settings ({len(diff)} differ, as recorded vs "
                f"now): {run_dir.short(diff)}. Rerun with the same settings, choose another --name/--root, or pass "
                "--force to redo the stages whose settings differ")
        self._drop_eval_cache(None)

    def _drop_eval_cache(self, label: str | None):
        """Removes cached evaluations: all of them (label None or 'base'), else those of one arm/seed."""
        if is_main_process():
            ev = os.path.join(self.dir, "eval")
            if label in (None, "base"):
                shutil.rmtree(ev, ignore_errors=True)
            else:
                stem = label.replace("/", "_")
                for f in glob.glob(os.path.join(ev, f"{stem}.json")) + glob.glob(os.path.join(ev, f"*_{stem}.json")):
                    os.remove(f)
        sync_processes(f"drop-eval:{self.dir}:{label}")

    def base_settings(self) -> dict:
        """What determines the base policy (recorded in base/DONE)."""
        p = self.preset
        if p.checkpoint:
            return run_dir.plain({"model": self.cfg, "checkpoint": os.path.abspath(p.checkpoint)})
        return run_dir.plain({"model": self.cfg, "task": p.task, "base": p.base, "seed": self.base_seed})

    def arm_stage_settings(self, arm: str, seed: int) -> dict:
        """What determines an arm/seed's policy and logs (recorded in its DONE and its checkpoints)."""
        p = self.preset
        return run_dir.plain({"base": self.base_settings(), "arm": self.arm_settings(arm), "seed": int(seed),
                       "task": p.task, "compute_dtype": p.compute_dtype, "dynamics_every": p.dynamics_every,
                       "r_single": {"definition": "plan_mode", "n_tasks": p.eval.n_plan_tasks,
                                    "n_samples": p.eval.n_plan_samples}})

    def check_recorded(self, recorded, settings: dict, where: str, out: str, label: str) -> bool:
        """True if `recorded` (settings of a DONE marker or checkpoint at `where`; None: not recorded, an
        older version's) may be used with `settings`; else SettingsMismatch, or with force: the stage
        directory `out` is emptied (and its cached evaluations dropped) and False returned."""
        if recorded is None:
            if not self.force:
                return True
            diff = ["settings: not recorded (made by an older version)"]
        else:
            diff = ckpt_lib.settings_diff(recorded, settings)
            if not diff:
                return True
        if not self.force:
            raise SettingsMismatch(
                f"stage {label}: {where} was made with other settings ({len(diff)} differ, as recorded vs now): "
                f"{run_dir.short(diff)}. Rerun with the same settings, choose another --name/--root, or pass --force "
                "to redo this stage")
        sync_processes(f"reset:{out}")  # every process has read the record before it goes
        if is_main_process():
            shutil.rmtree(out, ignore_errors=True)
        self._drop_eval_cache(label)
        os.makedirs(out, exist_ok=True)
        return False

    def stage_done(self, out: str, settings: dict, label: str) -> bool:
        """Whether stage `out` is finished with `settings` (see `check_recorded`). A DONE marker that is not a
        JSON object is InvalidMarker; with force the stage is redone."""
        try:
            info = run_dir.read_done(out)
        except run_dir.InvalidMarker:
            if not self.force:
                raise
            return self.check_recorded(None, settings, os.path.join(out, "DONE"), out, label)  # redone
        if info is None:
            return False
        return self.check_recorded(info.get("settings"), settings, os.path.join(out, "DONE"), out, label)

    def arm_settings(self, arm: str) -> stages.ArmSettings:
        p = self.preset
        rl = dataclasses.replace(stages.ARMS[arm], n_tasks=p.n_tasks, group_size=p.group_size, epochs=p.epochs,
                                 minibatches=p.minibatches)
        return stages.ArmSettings(name=arm, rl=rl, iterations=p.iterations, lr=p.lr, kl_coef=p.kl_coef,
                                  kl_estimator=p.kl_estimator, entropy_coef=p.entropy_coef)

    def load_policy(self, path):
        """The params of <path>/policy, sharded on the run's mesh when it has one; SettingsMismatch when
        it was saved for another model config (before any array reaches a compiled function)."""
        cfg, params = weights.load(os.path.join(path, "policy"), mesh=self.mesh)
        diff = ckpt_lib.settings_diff(dataclasses.asdict(cfg), dataclasses.asdict(self.cfg))
        if diff:
            raise SettingsMismatch(f"the policy in {os.path.join(path, 'policy')} was saved for another model "
                                   f"config than this run's (saved vs now): {run_dir.short(diff)}; this run directory "
                                   "was made with other settings: use another --name, or --force")
        return params


class ProgressBar:
    """A tqdm bar over a stage's steps that starts after the first step. The first one also compiles the
    stage's programs, which on a CPU takes many times a later step (the `ci` preset's first SFT step: 25 s, the
    next three: a fraction of a second), so it gets its own line with its seconds and the bar's rate and ETA count
    only the steps after it. Process 0 only."""

    def __init__(self, total: int, desc: str, unit: str, *, initial: int = 0, log=print):
        self.total, self.desc, self.unit, self.initial, self.log = total, desc, unit, initial, log
        self.t0, self.bar = time.time(), None

    def step(self, **postfix) -> None:
        if self.bar is None:
            if is_main_process():
                self.log(f"[{self.desc}] {self.unit} {self.initial + 1} of {self.total}: {time.time() - self.t0:.1f} s "
                         f"(it compiles the programs the first time they run; the rate below counts the "
                         f"{self.unit}s after it)")
            self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit[:4], initial=self.initial + 1,
                            disable=not is_main_process())
        else:
            self.bar.update(1)
        self.bar.set_postfix(**postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_base(run: Run, log=print):
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
    bar = ProgressBar(p.base.steps, "base SFT", "step", log=log)

    def cb(i, rec):
        bar.step(loss=f"{rec['loss']:.3f}", acc=f"{rec['token_accuracy']:.2f}")
        append_jsonl(os.path.join(out, "metrics.jsonl"), rec)

    params, hist = stages.train_base(run.world, run.cfg, jax.random.key(run.base_seed), p.task, p.base, callback=cb,
                                     mesh=run.mesh)
    bar.close()
    save_policy(os.path.join(out, "policy"), run.cfg, params)
    mark_done(out, {"seconds": time.time() - t0, **hist[0], "final": hist[-1], "settings": settings})
    return params


class SavedPolicies(collections.abc.Mapping):
    """(arm, seed) -> that arm seed's trained params, read by `load(arm, seed)` from its run directory each time
    one is asked for and never kept here, so a run holds one trained policy at a time on its devices however
    many arms x seeds it has (on a 1-GPU preset 15 Qwen3-0.6B policies in f32 are 33 GiB, beside the train state
    and the rollout's KV cache). Iterating gives the keys in sorted order; index to load. A comprehension over
    `items()` loads every policy at once: take keys, then fetch one at a time."""

    def __init__(self, keys, load):
        self._keys, self._load = sorted(keys), load

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._load(*key)

    def __contains__(self, key):  # Mapping's would load the policy
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)


def run_arm(run: Run, arm: str, seed: int, base_params, runtime=None, log=print):
    """Stage 'rl': one arm, one seed; checkpoints every iteration, resumes after a kill."""
    label = f"{arm}/seed{seed}"
    out = run.path("arms", arm, f"seed{seed}")
    recorded = run.arm_stage_settings(arm, seed)
    if run.stage_done(out, recorded, label):
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
    bar = ProgressBar(settings.iterations, f"{arm} seed {seed}", "iteration", initial=start, log=log)

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
    state, _ = stages.train_rl(run.world, run.cfg, None, None, run.preset.task, settings, callback=cb,
                               state=state, runtime=rt)
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
    numbers: the base and every logged iteration of every arm see the same draws)."""
    p = run.preset
    maps = p.task.sample(jax.random.key(R_SINGLE_MAPS_KEY + run.seed_offset), p.eval.n_plan_tasks)
    key = jax.random.key(R_SINGLE_SAMPLE_KEY + run.seed_offset)

    def measure(params) -> dict:
        ok = plan_mode.plan_success(run.world, run.cfg, params, maps, key, t_max=p.task.t_max,
                                    n_samples=p.eval.n_plan_samples, env_params=p.task.env_params(),
                                    max_context=p.task.max_context, mesh=run.mesh,
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
                                   tis_cap=p.tis_cap)


def run_all_arms(run: Run, base_params, arms=None, seeds=None, log=print):
    """Every arm x seed; arms with equal compiled settings share one runtime (one compile)."""
    runtimes, done = {}, []
    for arm in arms or run.preset.arms:
        settings = run.arm_settings(arm)
        key = stages.shared_key(settings)
        if key not in runtimes:
            runtimes[key] = make_runtime(run, settings)
        for seed in seeds or run.preset.seeds:
            run_arm(run, arm, seed, base_params, runtime=runtimes[key], log=log)  # its params are not kept
            done.append((arm, seed))
    return saved_policies(run, done)


def saved_policies(run: Run, keys) -> SavedPolicies:
    """The trained policies of `keys` (arm, seed) of `run`, each loaded from arms/<arm>/seed<s>/policy on demand."""
    return SavedPolicies(keys, lambda arm, seed: run.load_policy(run.path("arms", arm, f"seed{seed}")))
