"""What every evaluation driver shares: plain host results, settings checks, and rollouts in fixed chunks.

Each driver (`pass_drivers`, `state_drivers`, `scoring.likelihood`) takes (world, cfg, params, key, ...)
explicitly and returns a plain dict of Python numbers and numpy arrays (CIs as {"mean", "lo", "hi"}), ready
for `plots` and `report.flatten_metrics`. Compiles are shared: every rollout goes through `run_rollouts`,
which cuts episodes into fixed `batch_size` chunks, so one `rollout_jit` compile per (batch_size,
RolloutConfig) serves every driver; pass ONE RolloutConfig with `allow_forced=True` everywhere (error states
need it; rows without forced actions sample as usual).

Placement (`mesh`, `compute_dtype`, optional on every rollout driver): the evaluation rollouts run as
`stages.make_arm_runtime`'s training rollout does, on a copy of the params in the compute dtype
(`sampling.rollout_params`), laid out per `sharding.ROLLOUT_RULES` on a mesh, the episodes split over the
mesh's batch axes under `jax.set_mesh` (the model pins activations and the KV cache to them); the results come
back replicated. Neither given: the params as they are, on the default device (the toy presets).

Dimension legend (CONVENTIONS.md): B episodes (rollout rows), N turns (T_max).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import sharding
from jaxagent.eval import passk
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import types
from jaxagent.rollout.jax_loop import RolloutConfig, rollout
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import rollout_params  # the rollouts' (and generate's) copy of the params


def to_host(tree):
    """jax/numpy leaves -> numpy arrays (0-d -> Python numbers), CIs -> {"mean", "lo", "hi"} dicts."""
    if isinstance(tree, passk.CI):
        return {"mean": to_host(tree.mean), "lo": to_host(tree.lo), "hi": to_host(tree.hi)}
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    if isinstance(tree, (jax.Array, np.ndarray, np.generic)):
        a = np.asarray(tree)
        return a.item() if a.ndim == 0 else a
    return tree


def check_rcfg(rcfg: RolloutConfig, t_max: int) -> None:
    if rcfg.t_max != t_max:
        raise ValueError(f"rcfg.t_max={rcfg.t_max} differs from t_max={t_max}")
    if rcfg.expert_fn is not None:
        raise ValueError("the eval drivers roll out the model: rcfg.expert_fn must be None")


def temperature_of(sampler: Sampler) -> float:
    """The temperature of the sampled policy pi (`sampling.policy_logprobs`: greedy uses 1)."""
    return 1.0 if sampler.greedy else float(sampler.temperature)


def pad_index(n: int, size: int) -> np.ndarray:
    """Row indices 0..n-1 then copies of the last row, up to a multiple of `size`."""
    total = -(-n // size) * size
    return np.minimum(np.arange(total), n - 1)


def concat_rows(parts, n):
    if len(parts) == 1:
        return jax.tree.map(lambda x: x[:n], parts[0])
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0)[:n], *parts)


def n_rows(tree) -> int:
    sizes = {x.shape[0] for x in jax.tree.leaves(tree)}
    if len(sizes) != 1:
        raise ValueError(f"leaves have different leading sizes {sorted(sizes)}")
    return sizes.pop()


def row_placement(mesh, rows: int):
    """(place, context, gather) for a program over chunks of `rows` rows: without a mesh the identity,
    no context and the identity; on a mesh, `place` puts every leaf with `rows` leading rows on the batch
    axes (`sharding.batch_sharding`: replicated where they do not divide), `context()` is
    `jax.set_mesh(mesh)` (the model pins its activations to the batch axes) and `gather` replicates a
    result (readable on every host)."""
    if mesh is None:
        return (lambda t: t), contextlib.nullcontext, (lambda t: t)

    def place(tree):
        return jax.tree.map(lambda x: jax.device_put(x, sharding.batch_sharding(mesh, x.ndim, batch_size=rows))
                            if np.ndim(x) and np.shape(x)[0] == rows else x, tree)

    gather = jax.jit(lambda t: t, out_shardings=sharding.replicated(mesh))
    return place, functools.partial(jax.set_mesh, mesh), gather


def run_rollouts(world, cfg: Qwen3Config, params, tasks, budgets, key, env_params, rcfg: RolloutConfig, *,
                 hide_budget=False, forced_actions=None, batch_size: Optional[int] = None, mesh=None,
                 compute_dtype=None) -> types.Rollout:
    """`rollout` over len(budgets) episodes in chunks of exactly `batch_size` rows (the last chunk padded
    with copies of the last row, dropped afterwards); chunk i uses key fold_in(key, i), so calls that differ
    only in budgets share their random numbers row by row (episodes with identical prompts stay identical
    until the shorter budget ends). batch_size None: one chunk of all rows. `mesh`, `compute_dtype`: the
    placement of the training rollout (module doc; episodes split over the batch axes where they divide
    the chunk, as there)."""
    budgets = np.asarray(budgets)
    n = int(budgets.shape[0]) if budgets.ndim == 1 else -1
    if n < 1 or n_rows(tasks) != n:
        raise ValueError(f"tasks (leading size {n_rows(tasks)}) and budgets (shape {budgets.shape}) must "
                         "give one budget per task")
    size = n if batch_size is None else int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    idx = pad_index(n, size)
    forced = None
    if forced_actions is not None:
        forced = np.asarray(forced_actions, np.int32)
        if forced.shape != (n, rcfg.t_max):
            raise ValueError(f"forced_actions must have shape {(n, rcfg.t_max)}, got {forced.shape}")
        forced = forced[idx]
        forced[n:] = -1
    params = rollout_params(params, cfg, mesh=mesh, compute_dtype=compute_dtype)
    place, context, gather = row_placement(mesh, size)
    parts = []
    for i in range(len(idx) // size):
        rows = idx[i * size:(i + 1) * size]
        # inputs made outside the mesh context, as the training rollout's (an array made inside it would
        # carry the mesh's sharding: another rollout compile)
        chunk, k_i = place(jax.tree.map(lambda x: jnp.asarray(x)[rows], tasks)), jax.random.fold_in(key, i)
        with context():
            ro = rollout(params, cfg, world.env, world.layout, world.fmt, chunk, budgets[rows], k_i, env_params,
                         rcfg, hide_budget=hide_budget,
                         forced_actions=None if forced is None else forced[i * size:(i + 1) * size])
        parts.append(gather(ro))
    return concat_rows(parts, n)
