"""Structural upper bounds on Pass@(K,T): the best any policy can do within T turns.

Dimension legend (CONVENTIONS.md): P tasks, U budget tiers, J values of k.

docs/study.md, "jaxagent's definitions", Structural upper bound: FrozenLake takes p*[task, T], the optimal
probability of reaching the goal within T steps from its exact DP solver (deterministic maps: 0/1 from
shortest path <= T); other tasks take 1 if a reference solution needs <= T turns.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.eval import _checks


def success_prob_from_min_turns(min_turns_P, budgets_U) -> jax.Array:
    """Deterministic optimal success probability p*[P, U] = 1[0 <= min_turns <= T].

    min_turns: shortest-path length (deterministic FrozenLake) or a reference solution's turn count;
    a negative value marks a task no known solution reaches (p* = 0 at every budget).
    """
    _checks.require_ndim(min_turns_P, 1, "min_turns_P")
    _checks.require_ndim(budgets_U, 1, "budgets_U")
    _checks.require_integer(min_turns_P, "min_turns_P")
    turns_Px1 = jnp.asarray(min_turns_P, jnp.int32)[:, None]
    budgets_1xU = jnp.asarray(budgets_U, jnp.int32)[None, :]
    return ((turns_Px1 >= 0) & (turns_Px1 <= budgets_1xU)).astype(jnp.float32)


def pass_at_k_bound_per_task(p_star_PxU, ks_J) -> jax.Array:
    """Per-task Pass@(K,T) upper bound [U, J, P] = 1 - (1 - p*[task, T])^K.

    K independent trajectories of the best policy each succeed with probability p*; no policy does
    better (docs/study.md, "jaxagent's definitions", Structural upper bound).
    """
    _checks.require_ndim(p_star_PxU, 2, "p_star_PxU")
    _checks.require_ndim(ks_J, 1, "ks_J")
    p = _checks.concrete(p_star_PxU)
    if p is not None and np.any((p < 0) | (p > 1)):
        raise ValueError("p_star_PxU must hold probabilities in [0, 1]")
    p_1xPxU = jnp.asarray(p_star_PxU, jnp.float32)[None]
    ks_Jx1x1 = jnp.asarray(ks_J, jnp.float32)[:, None, None]
    bound_JxPxU = 1.0 - (1.0 - p_1xPxU) ** ks_Jx1x1
    return jnp.transpose(bound_JxPxU, (2, 0, 1))


def pass_at_k_bound(p_star_PxU, ks_J) -> jax.Array:
    """Task-mean Pass@(K,T) upper bound [U, J] = mean_task 1 - (1 - p*[task, T])^K."""
    return jnp.mean(pass_at_k_bound_per_task(p_star_PxU, ks_J), axis=-1)
