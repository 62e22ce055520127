"""Unbiased Pass@k, Pass@(K,T) grids in the announced and truncated modes, and task-bootstrap CIs.

Dimension legend (this module): T budget tiers, N tasks, S samples (rollouts) per task and budget,
K values of k, R bootstrap replicates.

Modes (docs/study.md, "jaxagent's definitions", Pass@(K,T)); a report must say which one it used:
- announced: the budget is written into the prompt, so every tier has its own rollouts,
  `success_TxNxS[t, task, sample]`, fed to `pass_at_k_grid` directly.
- truncated: the budget is hidden; one T_max run per sample, and a sample counts as a success at tier T
  iff it finished successfully with turns_used <= T (`truncated_success`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxagent.eval import _checks


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
        _checks.require_integer(v, name)
    return _pass_at_k_vec(jnp.asarray(n, jnp.int32), jnp.asarray(c, jnp.int32), jnp.asarray(k, jnp.int32))


_pass_at_k_vec = jax.jit(jnp.vectorize(_pass_at_k_one))


def _check_ks(ks, n_samples: int) -> None:
    values = _checks.concrete(ks)
    if values is None:
        return
    _checks.require_integer(values, "ks")
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"ks must be a non-empty 1-D array of k values, got shape {values.shape}")
    if np.any(values < 1) or np.any(values > n_samples):
        raise ValueError(f"every k in ks must lie in [1, {n_samples}] (samples per task), got {values.tolist()}")


def pass_at_k_per_task(success_NxS, ks_K, valid_NxS=None) -> jax.Array:
    """Per-task unbiased pass@k [K, N] from boolean successes of S samples per task.

    n = number of valid samples of the task, c = valid successes, pass@k as in `pass_at_k`
    (Chen et al. 2021, eq. 1). A task with fewer than k valid samples gives NaN.
    """
    _checks.require_ndim(success_NxS, 2, "success_NxS")
    _check_ks(ks_K, np.shape(success_NxS)[1])
    if valid_NxS is not None:
        _checks.require_same_shape(success_NxS, valid_NxS, "success_NxS", "valid_NxS")
    valid = None if valid_NxS is None else jnp.asarray(valid_NxS)
    return _per_task(jnp.asarray(success_NxS), valid, jnp.asarray(ks_K, jnp.int32))


@jax.jit
def _per_task(success_NxS, valid_NxS, ks_K):
    success_NxS = success_NxS.astype(bool)
    valid_NxS = jnp.ones_like(success_NxS) if valid_NxS is None else valid_NxS.astype(bool)
    n_N = valid_NxS.sum(-1).astype(jnp.int32)
    c_N = (success_NxS & valid_NxS).sum(-1).astype(jnp.int32)
    return _pass_at_k_vec(n_N[None, :], c_N[None, :], ks_K[:, None])


def pass_at_k_grid(success_TxNxS, ks_K, valid_TxNxS=None) -> jax.Array:
    """Per-task Pass@(K,T) grid [T, K, N]; average over the last axis for the study's figure.

    success_TxNxS[t, task, sample]: announced mode (separate rollouts per budget tier) or the output of
    `truncated_success` (truncated mode). Entry [t, j, i] = pass@ks[j] of task i at tier t (Chen et al.
    2021, eq. 1; docs/study.md "jaxagent's definitions", Pass@(K,T)).
    """
    _checks.require_ndim(success_TxNxS, 3, "success_TxNxS")
    _check_ks(ks_K, np.shape(success_TxNxS)[2])
    if valid_TxNxS is None:
        return jax.vmap(lambda s: pass_at_k_per_task(s, ks_K))(jnp.asarray(success_TxNxS))
    return jax.vmap(lambda s, v: pass_at_k_per_task(s, ks_K, v))(jnp.asarray(success_TxNxS), jnp.asarray(valid_TxNxS))


def pass_at_k_curve(success_NxS, ks_K) -> jax.Array:
    """Pass@K curve [K] at one budget: task mean of per-task pass@k (Chen et al. 2021, eq. 1)."""
    return jnp.mean(pass_at_k_per_task(success_NxS, ks_K), axis=-1)


def pass_at_t_curve(success_TxNxS, k: int) -> jax.Array:
    """Pass@T curve [T] at fixed K=k (the study uses K=8): task mean of pass@k at each budget tier."""
    return jnp.mean(pass_at_k_grid(success_TxNxS, jnp.asarray([k], jnp.int32))[:, 0, :], axis=-1)


def truncated_success(turns_to_success_NxS, budgets_T) -> jax.Array:
    """Truncated-mode successes [T, N, S] from one T_max run per sample.

    success[t, i, s] = 0 <= turns_to_success[i, s] <= budgets[t], where turns_to_success is the number
    of turns the episode used when it succeeded and any negative value (-1) means it never succeeded.
    """
    _checks.require_ndim(turns_to_success_NxS, 2, "turns_to_success_NxS")
    _checks.require_ndim(budgets_T, 1, "budgets_T")
    _checks.require_integer(turns_to_success_NxS, "turns_to_success_NxS")
    turns = jnp.asarray(turns_to_success_NxS, jnp.int32)[None]
    budgets = jnp.asarray(budgets_T, jnp.int32)[:, None, None]
    return (turns >= 0) & (turns <= budgets)


class CI(NamedTuple):
    """A point estimate with its percentile bootstrap interval."""

    mean: jax.Array
    lo: jax.Array
    hi: jax.Array


@functools.partial(jax.jit, static_argnames=("n_boot",))
def _resample_counts(key, n_boot, mask_N):
    """counts[r, i]: how often item i is drawn in replicate r; n_valid draws among the valid items."""
    n = mask_N.shape[0]
    n_valid = mask_N.sum()
    order_N = jnp.argsort(~mask_N, stable=True)  # valid positions first
    u_RxN = jax.random.uniform(key, (n_boot, n))
    slot_RxN = jnp.clip((u_RxN * n_valid).astype(jnp.int32), 0, jnp.maximum(n_valid - 1, 0))
    weight_RxN = jnp.broadcast_to((jnp.arange(n) < n_valid).astype(jnp.float32), (n_boot, n))  # only n_valid draws
    rows_RxN = jnp.broadcast_to(jnp.arange(n_boot)[:, None], (n_boot, n))
    return jnp.zeros((n_boot, n), jnp.float32).at[rows_RxN, order_N[slot_RxN]].add(weight_RxN)


@jax.jit
def _ci_from_counts(values, counts_RxN, alpha, mask_N):
    n_valid = mask_N.sum()
    safe = jnp.where(mask_N, values, 0.0)  # NaNs at masked positions must not leak into the sums
    boot = jnp.einsum("...n,rn->...r", safe, counts_RxN) / n_valid
    lo, hi = jnp.quantile(boot, jnp.stack([alpha / 2, 1 - alpha / 2]), axis=-1)
    return CI(jnp.sum(safe, axis=-1) / n_valid, lo, hi)


def bootstrap_ci(per_task_values, key, n_boot: int = 1000, alpha: float = 0.05, mask=None) -> CI:
    """Mean over the last axis (tasks or states) with a percentile bootstrap (1 - alpha) interval.

    Nonparametric bootstrap (Efron & Tibshirani 1993, ch. 13, percentile interval): draw n_valid items
    with replacement from the valid ones (mask [N], default all), take the mean; lo / hi are the alpha/2
    and 1 - alpha/2 quantiles of n_boot such means. Leading axes share the resampled items, so a grid
    [T, K, N] gets jointly resampled tasks. No valid item gives NaN. Jitted (n_boot static); the same
    key resamples the same items whatever the values, so two metrics bootstrapped with one key are paired.
    """
    values = jnp.asarray(per_task_values, jnp.float32)
    if values.ndim < 1:
        raise ValueError(f"per_task_values needs a last axis of tasks, got shape {values.shape}")
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    _checks.require_unit_interval(alpha, "alpha")
    n = values.shape[-1]
    mask_N = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask).astype(bool)
    if mask_N.shape != (n,):
        raise ValueError(f"mask must have shape ({n},) matching the last axis of the values, got {mask_N.shape}")
    counts_RxN = _resample_counts(key, int(n_boot), mask_N)  # compiled once per (n_boot, N), shared by all value shapes
    return _ci_from_counts(values, counts_RxN, jnp.float32(alpha), mask_N)
