"""Unbiased Pass@k, Pass@(K,T) grids in the announced and truncated modes, and task-bootstrap CIs.

Dimension legend (CONVENTIONS.md): U budget tiers, P tasks, Z samples (rollouts) per task and budget,
J values of k, R bootstrap replicates.

Axis order, one for every Pass@ array of jaxagent (here, `bounds`, `pass_drivers`, `study.host.metrics`): the
budget tier first, then k, then the task, then the sample: successes [U, P, Z] (one tier: [P, Z]), per-task
Pass@ [U, J, P] (one tier: [J, P]), grids [U, J], curves [U] or [J], optimal success probabilities p* [U, P];
means over tasks are over the last axis. Inputs are checked by shape and dtype (TypeError / ValueError naming the
argument, at trace time too): successes are bool (or 0/1 integers), counts, k and budgets integers.

Modes (docs/study.md, "jaxagent's definitions", Pass@(K,T)); a report must say which one it used:
- announced: the budget is in the prompt, every tier has its own rollouts (`success_UxPxZ` to `pass_at_k_grid`);
- truncated: the budget is hidden; one T_max run per sample, and a sample counts as a success at tier T iff it
  finished successfully with turns_used <= T (`truncated_success`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxagent import checks
from jaxagent.eval import value_checks


def _pass_at_k_one(n, c, k):
    """Pass@k for one (n, c, k) triple; see `pass_at_k`."""
    n, c, k = (jnp.asarray(v, jnp.int32) for v in (n, c, k))
    invalid = (n < 0) | (c < 0) | (c > n) | (k < 0) | (k > n)
    certain = n - c < k  # every k-subset holds a success
    lower = jnp.where(certain | invalid, n + 1, n - c + 1)  # empty loop when the answer is fixed
    kf = k.astype(jnp.float32)
    prod = lax.fori_loop(lower, n + 1, lambda i, p: p * (1.0 - kf / i.astype(jnp.float32)), jnp.float32(1.0))
    value = jnp.where(certain, 1.0, 1.0 - prod)
    return jnp.where(invalid, jnp.nan, value)


def pass_at_k(n, c, k) -> jax.Array:
    """Unbiased pass@k estimator, broadcast over integer arrays n, c, k.

    pass@k = 1 - C(n-c, k) / C(n, k)  (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1), computed in the numerically stable product form
        pass@k = 1 - prod_{i=n-c+1}^{n} (1 - k / i),
    and defined as 1 when n - c < k. n: samples, c: successes among them, k: sample budget.
    Invalid triples (c < 0, c > n, k < 0, k > n) give NaN; k = 0 gives 0. Jittable and vmappable.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        checks.dtype("pass_at_k", name, v, "integer")
    return _pass_at_k_vec(jnp.asarray(n, jnp.int32), jnp.asarray(c, jnp.int32), jnp.asarray(k, jnp.int32))


_pass_at_k_vec = jax.jit(jnp.vectorize(_pass_at_k_one))


def _check_ks(where, ks, n_samples: int) -> None:
    checks.array(where, "ks_J", ks, "J", "integer")
    values = value_checks.concrete(ks)
    if values is None:
        return
    if values.size == 0:
        raise ValueError(f"{where}: ks_J must be a non-empty 1-D array of k values, got shape {list(values.shape)}")
    if np.any(values < 1) or np.any(values > n_samples):
        raise ValueError(f"{where}: every k in ks_J must lie in [1, {n_samples}] (samples per task), "
                         f"got {values.tolist()}")


def pass_at_k_per_task(success_PxZ, ks_J, valid_PxZ=None) -> jax.Array:
    """Per-task unbiased pass@k [J, P] from boolean successes of Z samples per task.

    n = number of valid samples of the task, c = valid successes, pass@k as in `pass_at_k`
    (Chen et al. 2021, eq. 1). A task with fewer than k valid samples gives NaN.
    """
    sizes = checks.arrays("pass_at_k_per_task", [("success_PxZ", success_PxZ, "PZ", "bool_or_integer"),
                                                 ("valid_PxZ", valid_PxZ, "PZ", "bool_or_integer")])
    _check_ks("pass_at_k_per_task", ks_J, sizes["Z"])
    valid = None if valid_PxZ is None else jnp.asarray(valid_PxZ)
    return _per_task(jnp.asarray(success_PxZ), valid, jnp.asarray(ks_J, jnp.int32))


@jax.jit
def _per_task(success_PxZ, valid_PxZ, ks_J):
    success_PxZ = success_PxZ.astype(bool)
    valid_PxZ = jnp.ones_like(success_PxZ) if valid_PxZ is None else valid_PxZ.astype(bool)
    n_P = valid_PxZ.sum(-1).astype(jnp.int32)
    c_P = (success_PxZ & valid_PxZ).sum(-1).astype(jnp.int32)
    return _pass_at_k_vec(n_P[None, :], c_P[None, :], ks_J[:, None])


def pass_at_k_grid(success_UxPxZ, ks_J, valid_UxPxZ=None) -> jax.Array:
    """Per-task Pass@(K,T) grid [U, J, P]; average over the last axis for the study's figure.

    success_UxPxZ[t, task, sample]: announced mode (separate rollouts per budget tier) or the output of
    `truncated_success` (truncated mode). Entry [t, j, i] = pass@ks[j] of task i at tier t (Chen et al.
    2021, eq. 1; docs/study.md "jaxagent's definitions", Pass@(K,T)).
    """
    sizes = checks.arrays("pass_at_k_grid", [("success_UxPxZ", success_UxPxZ, "UPZ", "bool_or_integer"),
                                             ("valid_UxPxZ", valid_UxPxZ, "UPZ", "bool_or_integer")])
    _check_ks("pass_at_k_grid", ks_J, sizes["Z"])
    if valid_UxPxZ is None:
        return jax.vmap(lambda s: pass_at_k_per_task(s, ks_J))(jnp.asarray(success_UxPxZ))
    return jax.vmap(lambda s, v: pass_at_k_per_task(s, ks_J, v))(jnp.asarray(success_UxPxZ), jnp.asarray(valid_UxPxZ))


def pass_at_k_curve(success_PxZ, ks_J) -> jax.Array:
    """Pass@K curve [J] at one budget: task mean of per-task pass@k (Chen et al. 2021, eq. 1)."""
    return jnp.mean(pass_at_k_per_task(success_PxZ, ks_J), axis=-1)


def pass_at_t_curve(success_UxPxZ, k: int) -> jax.Array:
    """Pass@T curve [U] at fixed K=k (the study uses K=8): task mean of pass@k at each budget tier."""
    checks.array("pass_at_t_curve", "k", k, "", "integer")
    return jnp.mean(pass_at_k_grid(success_UxPxZ, jnp.asarray([k], jnp.int32))[:, 0, :], axis=-1)


def truncated_success(turns_to_success_PxZ, budgets_U) -> jax.Array:
    """Truncated-mode successes [U, P, Z] from one T_max run per sample.

    success[t, i, s] = 0 <= turns_to_success[i, s] <= budgets[t], where turns_to_success is the number
    of turns the episode used when it succeeded and any negative value (-1) means it never succeeded.
    """
    checks.array("truncated_success", "turns_to_success_PxZ", turns_to_success_PxZ, "PZ", "integer")
    checks.array("truncated_success", "budgets_U", budgets_U, "U", "integer")
    turns = jnp.asarray(turns_to_success_PxZ, jnp.int32)[None]
    budgets = jnp.asarray(budgets_U, jnp.int32)[:, None, None]
    return (turns >= 0) & (turns <= budgets)


class CI(NamedTuple):
    """A point estimate with its percentile bootstrap interval."""

    mean: jax.Array
    lo: jax.Array
    hi: jax.Array


@functools.partial(jax.jit, static_argnames=("n_boot",))
def _resample_counts(key, n_boot, mask_P):
    """counts[r, i]: how often item i is drawn in replicate r; n_valid draws among the valid items."""
    n = mask_P.shape[0]
    n_valid = mask_P.sum()
    order_P = jnp.argsort(~mask_P, stable=True)  # valid positions first
    u_RxP = jax.random.uniform(key, (n_boot, n))
    slot_RxP = jnp.clip((u_RxP * n_valid).astype(jnp.int32), 0, jnp.maximum(n_valid - 1, 0))
    weight_RxP = jnp.broadcast_to((jnp.arange(n) < n_valid).astype(jnp.float32), (n_boot, n))  # only n_valid draws
    rows_RxP = jnp.broadcast_to(jnp.arange(n_boot)[:, None], (n_boot, n))
    return jnp.zeros((n_boot, n), jnp.float32).at[rows_RxP, order_P[slot_RxP]].add(weight_RxP)


@jax.jit
def _ci_from_counts(values, counts_RxP, alpha, mask_P):
    n_valid = mask_P.sum()
    safe = jnp.where(mask_P, values, 0.0)  # NaNs at masked positions must not leak into the sums
    boot = jnp.einsum("...n,rn->...r", safe, counts_RxP) / n_valid
    lo, hi = jnp.quantile(boot, jnp.stack([alpha / 2, 1 - alpha / 2]), axis=-1)
    return CI(jnp.sum(safe, axis=-1) / n_valid, lo, hi)


def bootstrap_ci(per_task_values, key, n_boot: int = 1000, alpha: float = 0.05, mask=None) -> CI:
    """Mean over the last axis (tasks or states) with a percentile bootstrap (1 - alpha) interval.

    Nonparametric bootstrap (Efron & Tibshirani 1993, ch. 13, percentile interval): draw n_valid items
    with replacement from the valid ones (mask [P], default all), take the mean; lo / hi are the alpha/2
    and 1 - alpha/2 quantiles of n_boot such means. Leading axes share the resampled items, so a grid
    [U, J, P] gets jointly resampled tasks. No valid item gives NaN. Jitted (n_boot static); the same
    key resamples the same items whatever the values, so two metrics bootstrapped with one key are paired.
    """
    values = jnp.asarray(per_task_values, jnp.float32)
    if values.ndim < 1:
        raise ValueError(f"per_task_values needs a last axis of tasks, got shape {values.shape}")
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    value_checks.require_unit_interval(alpha, "alpha")
    n = values.shape[-1]
    mask_P = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask).astype(bool)
    if mask_P.shape != (n,):
        raise ValueError(f"mask must have shape ({n},) matching the last axis of the values, got {mask_P.shape}")
    counts_RxP = _resample_counts(key, int(n_boot), mask_P)  # compiled once per (n_boot, N), shared by all value shapes
    return _ci_from_counts(values, counts_RxP, jnp.float32(alpha), mask_P)
