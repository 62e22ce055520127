"""Structural upper bounds on Pass@(K,T): the best any policy can do within T turns.

Dimension legend (CONVENTIONS.md): P tasks, U budget tiers, J values of k. Axis order: Pass@ arrays put the
tier first, then k, then the task (`passk`'s module docstring): p* is [U, P], the bound per task [U, J, P].

docs/study.md, "jaxagent's definitions", Structural upper bound: FrozenLake takes p*[T, task], the optimal
probability of reaching the goal within T steps from its exact DP solver (deterministic maps: 0/1 from
shortest path <= T); other tasks take 1 if a reference solution needs <= T turns.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import checks
from jaxagent.eval import value_checks


def success_prob_from_min_turns(min_turns_P, budgets_U) -> jax.Array:
    """Deterministic optimal success probability p*[U, P] = 1[0 <= min_turns[task] <= T].

    min_turns: shortest-path length (deterministic FrozenLake) or a reference solution's turn count;
    a negative value marks a task no known solution reaches (p* = 0 at every budget).
    """
    checks.array("success_prob_from_min_turns", "min_turns_P", min_turns_P, "P", "integer")
    checks.array("success_prob_from_min_turns", "budgets_U", budgets_U, "U", "integer")
    turns_1xP = jnp.asarray(min_turns_P, jnp.int32)[None, :]
    budgets_Ux1 = jnp.asarray(budgets_U, jnp.int32)[:, None]
    return ((turns_1xP >= 0) & (turns_1xP <= budgets_Ux1)).astype(jnp.float32)


def pass_at_k_bound_per_task(p_star_UxP, ks_J) -> jax.Array:
    """Per-task Pass@(K,T) upper bound [U, J, P] = 1 - (1 - p*[T, task])^K.

    K independent trajectories of the best policy each succeed with probability p*; no policy does
    better (docs/study.md, "jaxagent's definitions", Structural upper bound).
    """
    checks.array("pass_at_k_bound", "p_star_UxP", p_star_UxP, "UP", "number")
    checks.array("pass_at_k_bound", "ks_J", ks_J, "J", "integer")
    p = value_checks.concrete(p_star_UxP)
    if p is not None and np.any((p < 0) | (p > 1)):
        raise ValueError("pass_at_k_bound: p_star_UxP must hold probabilities in [0, 1]")
    p_Ux1xP = jnp.asarray(p_star_UxP, jnp.float32)[:, None, :]
    ks_1xJx1 = jnp.asarray(ks_J, jnp.float32)[None, :, None]
    return 1.0 - (1.0 - p_Ux1xP) ** ks_1xJx1


def pass_at_k_bound(p_star_UxP, ks_J) -> jax.Array:
    """Task-mean Pass@(K,T) upper bound [U, J] = mean_task 1 - (1 - p*[T, task])^K."""
    return jnp.mean(pass_at_k_bound_per_task(p_star_UxP, ks_J), axis=-1)
