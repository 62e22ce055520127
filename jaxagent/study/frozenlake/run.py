"""The FrozenLake study's run: its run directory, the checks of its settings, the pieces every stage shares (`Run`).

runs/<name>/ holds config.json, tokenizer/ (toy presets), base/, arms/<arm>/seed<k>/ (ckpt/, policy/,
metrics.jsonl, dynamics.jsonl), eval/, figures/, report.md and metrics.json; the directory's mechanics (lock, DONE
markers, settings record, atomic JSON) are `jaxagent.study.run_dir`'s. A stage with a DONE marker is skipped on a
rerun; an interrupted RL stage resumes from its checkpoint, its metrics cut back to the restored iteration.
Everything a run can check is checked before the directory is created (`common.run_checks`). config.json, each DONE
marker and each RL checkpoint record the settings that determine their result (`Run.base_settings`,
`Run.arm_stage_settings`): other settings raise SettingsMismatch, unless force=True (`--force`) redoes the stages
that differ. Seed offset N (`--seed-offset`): RL seed k -> k + N, the base SFT key BASE_SEED -> BASE_SEED + N.
A non-finite update stops the stage with NonFiniteError before its metrics and checkpoint are written. A `mesh`
other than (1, 1, 1) shards the stages over every device; `compute_dtype` is the RL forward passes' dtype (params
and optimizer state stay float32); with `--distributed` process 0 writes metrics, dynamics and policies.
The layout, resumption, settings and placement in full: docs/study.md, "The run directory".
"""
from __future__ import annotations

import dataclasses
import glob
import os
import shutil

from jaxagent import checks, sharding
from jaxagent.envs.jax.frozenlake import FrozenLake
from jaxagent.models import weights
from jaxagent.models.config import CheckpointError
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rollout import chat_layout, env_codec, budget_format
from jaxagent.study import plan_mode, run_dir, stages
from jaxagent.study.common.arms import arm_settings
from jaxagent.study.common.run_checks import (BASE_SEED, RESULT_NEUTRAL, check_batches, check_preset, is_int,
                                              make_run_mesh)
from jaxagent.study.frozenlake.presets import Preset
from jaxagent.study.run_dir import InvalidSettings, SettingsMismatch, is_main_process, sync_processes
from jaxagent.study.toy import ToyWorld, make_toy_world


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


def _check_headline(preset: Preset) -> None:
    """InvalidSettings naming the field unless the headline evaluation is off (headline_tasks 0) or has a positive
    map count and at least max(ks) samples per map (the unbiased Pass@K estimator needs n >= K)."""
    ev = preset.eval
    n, z = ev.headline_tasks, ev.headline_samples
    if not (is_int(n) and n >= 0):
        raise InvalidSettings(f"preset {preset.name!r}: eval.headline_tasks must be a non-negative integer, got {n!r}")
    if n and not (is_int(z) and z >= max(ev.ks)):
        raise InvalidSettings(f"preset {preset.name!r}: eval.headline_samples must be an integer >= the largest K "
                              f"({max(ev.ks)}) when eval.headline_tasks > 0, got {z!r}")


class Run:
    """A run directory with the world, model config, device mesh and stage paths of one preset.

    `mesh` is the preset's device mesh (None for (1, 1, 1)), built once here; `compute_dtype` the
    jnp dtype of the RL forward passes."""

    def __init__(self, preset: Preset, root: str = "runs", name: str | None = None, *, seed_offset: int = 0,
                 force: bool = False):
        # Everything that can be checked is checked before the run directory is touched: a wrong setting or
        # checkpoint must not leave a config.json that refuses the corrected rerun.
        if not is_int(seed_offset) or seed_offset < 0:
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
        _check_headline(preset)
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
        _, diff = self.run_dir.config_diff(record, RESULT_NEUTRAL, defaults={"seed_offset": 0, "rehearsal": False,
                                                                                    "scan_layers": False,
                                                                                    "eval": {"n_continuations": 4}})
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
        """Arm `arm` of the preset (`common.arms.arm_settings`)."""
        return arm_settings(self.preset, arm)

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
