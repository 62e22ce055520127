"""Cost curves (turns, generated tokens, env calls) from rollout outputs, by episode status (the codes are the
rollout's, `jaxagent.rollout.types`).

Dimension legend (CONVENTIONS.md): B episodes (any leading shape is flattened into episodes),
U budget tiers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxagent.eval import value_checks
from jaxagent.rollout.types import BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED, FAILED, STATUS_NAMES, SUCCESS

N_STATUS = len(STATUS_NAMES)


def status_histogram(status, mask=None) -> jax.Array:
    """Counts int32[N_STATUS] of each status code among the (masked) episodes; out-of-range codes count nowhere."""
    value_checks.require_integer(status, "status")
    status_B = jnp.asarray(status, jnp.int32).reshape(-1)
    mask_B = jnp.ones_like(status_B, bool) if mask is None else jnp.asarray(mask, bool).reshape(-1)
    onehot_BxS = jax.nn.one_hot(status_B, N_STATUS, dtype=jnp.int32)  # codes outside [0, N_STATUS) -> zero row
    return jnp.sum(onehot_BxS * mask_B[:, None], axis=0)


def turns_to_success(status, turns_used) -> jax.Array:
    """turns_used where the episode succeeded, else -1: the input of `passk.truncated_success`."""
    return jnp.where(jnp.asarray(status) == SUCCESS, jnp.asarray(turns_used, jnp.int32), -1)


def cost_summary(status, turns, gen_tokens, env_calls, mask=None) -> dict[str, jax.Array]:
    """Per-episode and per-success costs of a batch of episodes.

    mean_x = sum_b x_b / B;  x_per_success = sum_b x_b / #success (expected spend per solved episode,
    NaN without successes); success_rate, truncation_rate (status BUDGET_EXHAUSTED),
    context_exhausted_rate and failed_rate are shares of episodes; status_counts is `status_histogram`.
    """
    for name, x in (("turns", turns), ("gen_tokens", gen_tokens), ("env_calls", env_calls)):
        value_checks.require_same_shape(status, x, "status", name)
    status_B = jnp.asarray(status, jnp.int32).reshape(-1)
    mask_B = jnp.ones_like(status_B, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32).reshape(-1)
    n_episodes = mask_B.sum()
    n_success = jnp.sum(mask_B * (status_B == SUCCESS))
    out = {
        "n_episodes": n_episodes,
        "success_rate": n_success / n_episodes,
        "failed_rate": jnp.sum(mask_B * (status_B == FAILED)) / n_episodes,
        "truncation_rate": jnp.sum(mask_B * (status_B == BUDGET_EXHAUSTED)) / n_episodes,
        "context_exhausted_rate": jnp.sum(mask_B * (status_B == CONTEXT_EXHAUSTED)) / n_episodes,
        "status_counts": status_histogram(status_B, mask_B > 0),
    }
    for name, x in (("turns", turns), ("gen_tokens", gen_tokens), ("env_calls", env_calls)):
        total = jnp.sum(mask_B * jnp.asarray(x, jnp.float32).reshape(-1))
        out[f"mean_{name}"] = total / n_episodes
        out[f"{name}_per_success"] = jnp.where(n_success > 0, total / jnp.maximum(n_success, 1.0), jnp.nan)
    return out


def cost_curves(status_UxB, turns_UxB, gen_tokens_UxB, env_calls_UxB, mask_UxB=None) -> dict[str, jax.Array]:
    """`cost_summary` at every budget tier: each value gains a leading T axis."""
    value_checks.require_same_shape(status_UxB, turns_UxB, "status_UxB", "turns_UxB")
    if mask_UxB is None:
        mask_UxB = jnp.ones(jnp.shape(status_UxB), bool)
    return jax.vmap(cost_summary)(status_UxB, turns_UxB, gen_tokens_UxB, env_calls_UxB, mask_UxB)
