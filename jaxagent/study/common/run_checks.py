"""The checks of a study run that need no run directory: a preset's counts, seeds, mesh and batch split (both
studies check them before their run directory is made), and each RL update's finiteness (`check_update`, before
the iteration's metrics and checkpoint are written).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import sharding
# the base SFT's PRNG key (+ the seed offset), the largest seed and iteration count: read by the CLI without JAX
from jaxagent.study.preset_names import BASE_SEED, MAX_ITERATIONS, MAX_SEED
from jaxagent.study.run_dir import InvalidSettings

RESULT_NEUTRAL = ("mesh", "seeds", "arms")   # config.json fields a rerun may change: where/which, not what


class NonFiniteError(RuntimeError):
    """An RL update was non-finite (skipped by the optimizer's guard) or left non-finite params."""


def is_int(v) -> bool:
    """Whether `v` is an integer (a bool is not)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_preset(preset, seed_offset: int = 0):
    """InvalidSettings naming the field when a preset's counts make no sense (e.g. iterations < 1, a seed
    beyond an int32 PRNG seed once shifted by `seed_offset`)."""
    for field in ("iterations", "n_tasks", "group_size", "dynamics_every"):
        v = getattr(preset, field)
        if not is_int(v) or v < 1:
            raise InvalidSettings(f"preset {preset.name!r}: {field} must be a positive integer, got {v!r}")
    if preset.iterations > MAX_ITERATIONS:
        raise InvalidSettings(f"preset {preset.name!r}: iterations must be at most {MAX_ITERATIONS}, got "
                              f"{preset.iterations}")
    seeds = tuple(preset.seeds)
    if not seeds or not all(is_int(s) and s >= 0 for s in seeds):
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
    if not is_int(micro) or micro < 1 or b % mb or (b // mb) % micro or (b // mb // micro) % split:
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


def make_run_mesh(preset):
    """The preset's (data, fsdp, tensor) mesh over all devices, or None for (1, 1, 1) (default device).

    Raises InvalidSettings when the mesh is malformed or its product differs from jax.device_count().
    """
    shape = tuple(preset.mesh)
    if len(shape) != 3 or not all(is_int(n) and n >= 1 for n in shape):
        raise InvalidSettings(f"preset {preset.name!r}: mesh must be three positive ints (data, fsdp, tensor), "
                              f"got {preset.mesh!r}")
    n = math.prod(int(d) for d in shape)
    if n == 1:
        return None
    if n != jax.device_count():
        platform = jax.devices()[0].platform
        # a CPU host can hold the preset's mesh as virtual devices (a rehearsal of a multi-chip preset)
        hint = (f" (on a CPU host, XLA_FLAGS=--xla_force_host_platform_device_count={n} makes {n} CPU devices)"
                if platform == "cpu" and n > jax.device_count() else "")
        raise InvalidSettings(f"preset {preset.name!r} has mesh (data, fsdp, tensor) = {shape}, which needs {n} "
                              f"devices, but jax.device_count() = {jax.device_count()} ({platform}); "
                              f"pick a preset/--mesh whose product is the device count{hint}")
    return sharding.make_mesh(*shape)
