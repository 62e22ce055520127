"""Stage runners of the study: run directories, resumability, progress bars, files.

runs/<name>/
  config.json                      the preset
  tokenizer/                       the toy word-level tokenizer (toy presets)
  base/    policy/ (HF checkpoint), metrics.jsonl, DONE
  arms/<arm>/seed<k>/  ckpt/ (orbax, resumable), policy/, metrics.jsonl, dynamics.jsonl, DONE
  eval/<policy>.json, eval/DONE    every measured diagnostic
  figures/*.png, report.md, metrics.json
A stage with a DONE marker is skipped on a rerun; an interrupted RL stage resumes from its checkpoint.

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
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from experiments.presets import Preset
from jaxagent import sharding
from jaxagent.envs.frozenlake import FrozenLake
from jaxagent.models import qwen3
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rollout import chat_layout, env_codec, budget_format
from jaxagent.study import stages
from jaxagent.study.toy import ToyWorld, make_toy_world


def _jsonable(x):
    if dataclasses.is_dataclass(x):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def is_main_process() -> bool:
    return jax.process_index() == 0


def sync_processes(tag: str):
    """A barrier across processes (multi-process runs only): files process 0 wrote are there after it."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(tag)


def write_json(path, obj):
    """Atomic write (a unique temporary file renamed over `path`), safe when several processes write."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path),
                               suffix=".tmp")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(_jsonable(obj), f, indent=1)
    os.replace(tmp, path)


def append_jsonl(path, rec):
    if not is_main_process():
        return
    with open(path, "a") as f:
        f.write(json.dumps(_jsonable(rec)) + "\n")


def save_policy(path, cfg, params):
    """qwen3.save of (possibly sharded, possibly multi-process) params, written by process 0."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(params, tiled=True)
    if is_main_process():
        qwen3.save(path, cfg, params)
    sync_processes(f"save_policy:{path}")


def make_run_mesh(preset: Preset):
    """The preset's (data, fsdp, tensor) mesh over all devices, or None for (1, 1, 1) (default device).

    Raises ValueError when the mesh is malformed or its product differs from jax.device_count().
    """
    shape = tuple(preset.mesh)
    if len(shape) != 3 or not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape):
        raise ValueError(f"preset {preset.name!r}: mesh must be three positive ints (data, fsdp, tensor), "
                         f"got {preset.mesh!r}")
    n = int(np.prod(shape))
    if n == 1:
        return None
    if n != jax.device_count():
        raise ValueError(f"preset {preset.name!r} has mesh (data, fsdp, tensor) = {shape}, which needs "
                         f"{n} devices, but jax.device_count() = {jax.device_count()} "
                         f"({jax.devices()[0].platform}); pick a preset/--mesh whose product is the device count")
    return sharding.make_mesh(*shape)


def _check_compute_dtype(preset: Preset):
    try:
        dt = jnp.dtype(preset.compute_dtype)
    except TypeError as e:
        raise ValueError(f"preset {preset.name!r}: compute_dtype {preset.compute_dtype!r} is not a dtype "
                         "name (e.g. 'float32', 'bfloat16')") from e
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"preset {preset.name!r}: compute_dtype must be a floating dtype, got {dt}")
    return dt


def done(path) -> bool:
    return os.path.isfile(os.path.join(path, "DONE"))


def mark_done(path, info=None):
    write_json(os.path.join(path, "DONE"), info or {"finished": time.strftime("%Y-%m-%d %H:%M:%S")})


class Run:
    """A run directory with the world, model config, device mesh and stage paths of one preset.

    `mesh` is the preset's device mesh (None for (1, 1, 1)), built once here; `compute_dtype` the
    jnp dtype of the RL forward passes."""

    def __init__(self, preset: Preset, root: str = "runs", name: str | None = None):
        self.preset = preset
        self.compute_dtype = _check_compute_dtype(preset)
        self.mesh = make_run_mesh(preset)
        split = sharding.batch_divisor(self.mesh)
        if (preset.n_tasks * preset.group_size) % split:
            raise ValueError(f"preset {preset.name!r}: the RL batch n_tasks x group_size = "
                             f"{preset.n_tasks} x {preset.group_size} is not divisible by the mesh's batch axes "
                             f"(data x fsdp = {split} for mesh {tuple(preset.mesh)})")
        self.dir = os.path.abspath(os.path.join(root, name or preset.name))
        os.makedirs(self.dir, exist_ok=True)
        write_json(os.path.join(self.dir, "config.json"), preset)
        if preset.checkpoint:
            tok = Tokenizer.from_dir(preset.checkpoint)
            words = FrozenLake.vocabulary()
            codec = env_codec(tok, words, FrozenLake.ACTION_STRINGS, word_level=False)
            self.world = ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size),
                                  chat_layout(tok, FrozenLake.system_prompt()), budget_format(codec))
            self.cfg = qwen3.Qwen3Config.from_dir(preset.checkpoint)
        else:
            self.world = make_toy_world(os.path.join(self.dir, "tokenizer"), size=preset.task.size)
            self.cfg = dataclasses.replace(preset.model, vocab_size=self.world.tokenizer.vocab_size)

    def path(self, *parts) -> str:
        p = os.path.join(self.dir, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def arm_settings(self, arm: str) -> stages.ArmSettings:
        p = self.preset
        rl = dataclasses.replace(stages.ARMS[arm], n_tasks=p.n_tasks, group_size=p.group_size)
        return stages.ArmSettings(name=arm, rl=rl, iterations=p.iterations, lr=p.lr)

    def load_policy(self, path):
        """The params of <path>/policy, sharded on the run's mesh when it has one."""
        cfg, params = qwen3.load(os.path.join(path, "policy"), mesh=self.mesh)
        return params


def run_base(run: Run, log=print):
    """Stage 'base': SFT of the tiny Qwen3 on the noisy expert (or the given checkpoint as is)."""
    out = run.path("base")
    if done(out):
        log(f"[base] done already: {out}")
        return run.load_policy(out)
    p = run.preset
    if p.checkpoint:
        _, params = qwen3.load(p.checkpoint, mesh=run.mesh)
        save_policy(os.path.join(out, "policy"), run.cfg, params)
        mark_done(out, {"source": p.checkpoint})
        return params
    t0 = time.time()
    bar = tqdm(total=p.base.steps, desc="base SFT", unit="step", disable=not is_main_process())

    def cb(i, rec):
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{rec['token_accuracy']:.2f}")
        append_jsonl(os.path.join(out, "metrics.jsonl"), rec)

    params, hist = stages.train_base(run.world, run.cfg, jax.random.key(1000), p.task, p.base, callback=cb,
                                     mesh=run.mesh)
    bar.close()
    save_policy(os.path.join(out, "policy"), run.cfg, params)
    mark_done(out, {"seconds": time.time() - t0, **hist[0], "final": hist[-1]})
    return params


def run_arm(run: Run, arm: str, seed: int, base_params, runtime=None, log=print):
    """Stage 'rl': one arm, one seed; checkpoints every iteration, resumes after a kill."""
    out = run.path("arms", arm, f"seed{seed}")
    if done(out):
        return run.load_policy(out)
    from jaxagent.eval import drivers  # R_single on held-out first-turn states

    settings = run.arm_settings(arm)
    rt = runtime or make_runtime(run, settings)
    manager = ckpt_lib.make_manager(os.path.join(out, "ckpt"), max_to_keep=2)
    # the restore target carries the mesh shardings: a resumed state is sharded like a fresh one
    abstract = stages.abstract_arm_state(rt, run.cfg, jax.random.key(seed), base_params)
    state = ckpt_lib.restore_latest(manager, abstract)
    if state is not None:
        log(f"[{arm}/seed{seed}] resuming at iteration {int(state.data_pos) // settings.rl.n_tasks}")
    heldout = run.preset.task.sample(jax.random.key(777), 32)
    dyn = os.path.join(out, "dynamics.jsonl")
    bar = tqdm(total=settings.iterations, desc=f"{arm} seed {seed}", unit="it",
               initial=0 if state is None else int(state.data_pos) // settings.rl.n_tasks,
               disable=not is_main_process())

    def cb(it, m, st):
        bar.update(1)
        bar.set_postfix(success=f"{m['success_rate']:.2f}")
        append_jsonl(os.path.join(out, "metrics.jsonl"), m)
        if it % run.preset.dynamics_every == 0 or it == settings.iterations - 1:
            rs = drivers.r_single(run.world, run.cfg, st.params, heldout, t_max=run.preset.task.t_max,
                                  env_params=run.preset.task.env_params(), width=run.preset.task.max_context)
            append_jsonl(dyn, {"step": it, "r_multi": m["success_rate"], "r_single": float(rs["r_single"])})
        ckpt_lib.save(manager, st, run.cfg, step=it, force=True)

    if state is None:
        state = stages.init_arm_state(rt, run.cfg, jax.random.key(seed), base_params)
        rs = drivers.r_single(run.world, run.cfg, base_params, heldout, t_max=run.preset.task.t_max,
                              env_params=run.preset.task.env_params(), width=run.preset.task.max_context)
        append_jsonl(dyn, {"step": -1, "r_multi": float("nan"), "r_single": float(rs["r_single"])})
    state, _ = stages.train_rl(run.world, run.cfg, None, None, run.preset.task, settings, callback=cb,
                               state=state, runtime=rt)
    bar.close()
    manager.wait_until_finished()
    save_policy(os.path.join(out, "policy"), run.cfg, state.params)
    mark_done(out)
    sync_processes(f"done:{out}")
    return state.params


def make_runtime(run: Run, settings: stages.ArmSettings) -> stages.ArmRuntime:
    """The arm's compiled pieces on the run's mesh, with the preset's compute dtype."""
    return stages.make_arm_runtime(run.world, run.cfg, run.preset.task, settings, mesh=run.mesh,
                                   compute_dtype=run.compute_dtype)


def run_all_arms(run: Run, base_params, arms=None, seeds=None, log=print):
    """Every arm x seed; arms with equal compiled settings share one runtime (one compile)."""
    policies = {}
    runtimes = {}
    for arm in arms or run.preset.arms:
        settings = run.arm_settings(arm)
        key = settings.rl.estimator == "ppo"  # the critic changes the train step; nothing else does
        if key not in runtimes:
            runtimes[key] = make_runtime(run, settings)
        for seed in seeds or run.preset.seeds:
            policies[(arm, seed)] = run_arm(run, arm, seed, base_params, runtime=runtimes[key], log=log)
    return policies
