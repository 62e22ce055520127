"""The FrozenLake study's run: its run directory, the checks of its settings, the pieces every stage shares.

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

import dataclasses
import glob
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import checks, sharding
from jaxagent.envs.jax.frozenlake import FrozenLake
from jaxagent.models import weights
from jaxagent.models.config import CheckpointError
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rollout import chat_layout, env_codec, budget_format
from jaxagent.study import plan_mode, run_dir, stages
from jaxagent.study.frozenlake.presets import Preset
# the base SFT's PRNG key (+ the seed offset), the largest seed and iteration count: read by the CLI without JAX
from jaxagent.study.preset_names import BASE_SEED, MAX_ITERATIONS, MAX_SEED
from jaxagent.study.run_dir import InvalidSettings, SettingsMismatch, is_main_process, sync_processes
from jaxagent.study.toy import ToyWorld, make_toy_world


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


all_finite_leaves_jit = jax.jit(_all_finite_leaves)  # `nonfinite_leaves`' program (the AOT check lowers it)


def nonfinite_leaves(tree) -> list[str]:
    """Paths of the floating leaves of `tree` holding a NaN or Inf."""
    floats = jax.tree.map(lambda x: x if jnp.issubdtype(x.dtype, jnp.floating) else None, tree)
    flags = jax.device_get(all_finite_leaves_jit(floats))
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
    return checks.float_dtype(f"preset {preset.name!r}: compute_dtype", preset.compute_dtype, InvalidSettings)


def checkpoint_world(tok, size: int) -> ToyWorld:
    """The FrozenLake world of a checkpoint's tokenizer `tok` (its BPE text of FrozenLake's words, the plan
    instruction's and the actions, and its chat template) on maps of side `size`; ValueError when the tokenizer
    cannot write them."""
    codec = env_codec(tok, FrozenLake.vocabulary() + plan_mode.PLAN_WORDS, FrozenLake.ACTION_STRINGS,
                      word_level=False)
    return ToyWorld(tok, codec, FrozenLake(codec, size=size), chat_layout(tok, FrozenLake.system_prompt()),
                    budget_format(codec))


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
                self.world = checkpoint_world(tok, preset.task.size)
            except ValueError as e:
                raise CheckpointError(f"the tokenizer in {preset.checkpoint} cannot write FrozenLake's text: "
                                      f"{e}") from None
        default = (preset.name + ("-rehearsal" if preset.rehearsal else "")
                   + (f"-s{self.seed_offset}" if self.seed_offset else ""))
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
        _, diff = self.run_dir.config_diff(record, RESULT_NEUTRAL, defaults={"seed_offset": 0, "rehearsal": False})
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
