"""Structural upper bounds on Pass@(K,T): the best any policy can do within T turns.

Dimension legend (this module): N tasks, T budget tiers, K values of k.

docs/study.md, "jaxagent's definitions", Structural upper bound: FrozenLake takes p*[task, T], the optimal
probability of reaching the goal within T steps from its exact DP solver (deterministic maps: 0/1 from
shortest path <= T); other tasks take 1 if a reference solution needs <= T turns.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.eval import _checks


def success_prob_from_min_turns(min_turns_N, budgets_T) -> jax.Array:
    """Deterministic optimal success probability p*[N, T] = 1[0 <= min_turns <= T].

    min_turns: shortest-path length (deterministic FrozenLake) or a reference solution's turn count;
    a negative value marks a task no known solution reaches (p* = 0 at every budget).
    """
    _checks.require_ndim(min_turns_N, 1, "min_turns_N")
    _checks.require_ndim(budgets_T, 1, "budgets_T")
    _checks.require_integer(min_turns_N, "min_turns_N")
    turns_N1 = jnp.asarray(min_turns_N, jnp.int32)[:, None]
    budgets_1T = jnp.asarray(budgets_T, jnp.int32)[None, :]
    return ((turns_N1 >= 0) & (turns_N1 <= budgets_1T)).astype(jnp.float32)


def pass_at_k_bound_per_task(p_star_NxT, ks_K) -> jax.Array:
    """Per-task Pass@(K,T) upper bound [T, K, N] = 1 - (1 - p*[task, T])^K.

    K independent trajectories of the best policy each succeed with probability p*; no policy does
    better (docs/study.md, "jaxagent's definitions", Structural upper bound).
    """
    _checks.require_ndim(p_star_NxT, 2, "p_star_NxT")
    _checks.require_ndim(ks_K, 1, "ks_K")
    p = _checks.concrete(p_star_NxT)
    if p is not None and np.any((p < 0) | (p > 1)):
        raise ValueError("p_star_NxT must hold probabilities in [0, 1]")
    p_1xNxT = jnp.asarray(p_star_NxT, jnp.float32)[None]
    ks_Kx1x1 = jnp.asarray(ks_K, jnp.float32)[:, None, None]
    bound_KxNxT = 1.0 - (1.0 - p_1xNxT) ** ks_Kx1x1
    return jnp.transpose(bound_KxNxT, (2, 0, 1))


def pass_at_k_bound(p_star_NxT, ks_K) -> jax.Array:
    """Task-mean Pass@(K,T) upper bound [T, K] = mean_task 1 - (1 - p*[task, T])^K."""
    return jnp.mean(pass_at_k_bound_per_task(p_star_NxT, ks_K), axis=-1)
