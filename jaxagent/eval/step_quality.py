"""Step quality on matched states, error-state metrics and the choice of the injected error action.

Dimension legend (CONVENTIONS.md): I states, G sampled actions per policy and state, A actions of the env,
Y continuations per error state, Db depth bins.

docs/study.md, "jaxagent's definitions", Step quality: q(s, a) = Q*_h(s, a) with h the remaining budget; per
state compare the mean q of each policy's G actions; "RL better on X%" is the share of states where RL's
mean q is strictly higher, ties reported separately. Error state: from a non-terminal state, take a
non-terminating action with Q* below the best (the worst such action) and continue from there.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.eval import value_checks
from jaxagent.eval.passk import bootstrap_ci


INVALID_VALUE = 0.0  # an invalid reply is scored as a failed episode: the worst outcome, as every Q* >= 0


def score_outcomes(probs_IxO, q_IxA, draws_IxG, *, invalid_value: float = INVALID_VALUE):
    """Exact and sampled quality of a policy at each state with an invalid reply scored as invalid.

    probs[s, o]: the policy's probability of outcome o (the A canonical actions, then o = A "invalid"),
    q[s, a] = Q*_h(s, a), draws[s, g] in [0, A] the G sampled outcomes. An invalid reply gets `invalid_value`
    (default 0: the value of never reaching the goal, the worst outcome since every reward is >= 0; docs/study.md
    finding 3 counts actions, and a reply that is no action is not one that stays put).
      exact[s]   = sum_a probs[s, a] q[s, a] + probs[s, A] invalid_value
      sampled[s, g] = q[s, draws[s, g]] (invalid_value for draws == A)
      invalid_share[s] = mean_g 1[draws[s, g] == A];  invalid_mass[s] = probs[s, A]
    """
    value_checks.require_ndim(q_IxA, 2, "q_IxA")
    value_checks.require_ndim(probs_IxO, 2, "probs_IxO")
    value_checks.require_ndim(draws_IxG, 2, "draws_IxG")
    q = jnp.asarray(q_IxA, jnp.float32)
    s, a = q.shape
    if np.shape(probs_IxO) != (s, a + 1):
        raise ValueError(f"probs_IxO must have shape {(s, a + 1)} (the actions then 'invalid'), got "
                         f"{np.shape(probs_IxO)}")
    if np.shape(draws_IxG)[0] != s:
        raise ValueError(f"draws_IxG must have {s} rows, got shape {np.shape(draws_IxG)}")
    probs = jnp.asarray(probs_IxO, jnp.float32)
    draws = jnp.asarray(draws_IxG, jnp.int32)
    q_ext = jnp.concatenate([q, jnp.full((s, 1), invalid_value, jnp.float32)], axis=-1)
    return {"exact": jnp.sum(probs * q_ext, axis=-1),
            "sampled": jnp.take_along_axis(q_ext, jnp.clip(draws, 0, a), axis=-1),
            "invalid_share": jnp.mean(draws >= a, axis=-1),
            "invalid_mass": probs[:, a]}


def _masked_mean(x, mask, axis=-1):
    mask = mask.astype(jnp.float32)
    count = mask.sum(axis)
    return jnp.sum(jnp.where(mask > 0, x, 0.0) * mask, axis) / count, count > 0


def per_state_comparison(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, *, tol: float = 0.0, state_mask_I=None):
    """Per-state mean q of each policy and the RL-vs-base outcome.

    mean_p[s] = sum_g valid_p[s,g] q_p[s,g] / sum_g valid_p[s,g];  diff = mean_rl - mean_base;
    better = diff > tol, worse = diff < -tol, equal otherwise. A state is used when both policies have at
    least one valid action (and state_mask allows it).
    """
    value_checks.require_ndim(q_base_IxG, 2, "q_base_IxG")
    value_checks.require_ndim(q_rl_IxG, 2, "q_rl_IxG")
    value_checks.require_same_shape(q_base_IxG, valid_base_IxG, "q_base_IxG", "valid_base_IxG")
    value_checks.require_same_shape(q_rl_IxG, valid_rl_IxG, "q_rl_IxG", "valid_rl_IxG")
    if np.shape(q_base_IxG)[0] != np.shape(q_rl_IxG)[0]:
        raise ValueError("q_base_IxG and q_rl_IxG must have the same number of states, got "
                         f"{np.shape(q_base_IxG)[0]} and {np.shape(q_rl_IxG)[0]}")
    mean_base_I, has_base_I = _masked_mean(jnp.asarray(q_base_IxG, jnp.float32), jnp.asarray(valid_base_IxG))
    mean_rl_I, has_rl_I = _masked_mean(jnp.asarray(q_rl_IxG, jnp.float32), jnp.asarray(valid_rl_IxG))
    used_I = has_base_I & has_rl_I
    if state_mask_I is not None:
        used_I = used_I & jnp.asarray(state_mask_I, bool)
    diff_I = mean_rl_I - mean_base_I
    better_I = used_I & (diff_I > tol)
    worse_I = used_I & (diff_I < -tol)
    return {
        "mean_q_base": mean_base_I,
        "mean_q_rl": mean_rl_I,
        "used": used_I,
        "rl_better": better_I,
        "equal": used_I & ~better_I & ~worse_I,
        "rl_worse": worse_I,
    }


def _summaries(per_state, weight_I):
    """Shares and mean qualities over the states selected by weight_I (float 0/1)."""
    n = weight_I.sum()
    share = lambda x: jnp.sum(x * weight_I) / n
    safe = lambda x: jnp.where(weight_I > 0, x, 0.0)
    return {
        "n_states": n,
        "share_rl_better": share(per_state["rl_better"]),
        "share_equal": share(per_state["equal"]),
        "share_rl_worse": share(per_state["rl_worse"]),
        "mean_q_base": jnp.sum(safe(per_state["mean_q_base"]) * weight_I) / n,
        "mean_q_rl": jnp.sum(safe(per_state["mean_q_rl"]) * weight_I) / n,
    }


def step_quality(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, *, tol: float = 0.0, state_mask_I=None):
    """Shares of used states where RL's mean q is strictly higher / equal (|diff| <= tol) / lower, and the
    mean over used states of each policy's per-state mean q (docs/study.md finding 3; formulas in
    `per_state_comparison`). Empty selections give NaN."""
    per_state = per_state_comparison(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, tol=tol,
                                     state_mask_I=state_mask_I)
    return _summaries(per_state, per_state["used"].astype(jnp.float32))


def depth_bins(depth_I, n_bins: int) -> jax.Array:
    """Bin index int32[I] of normalised depth d = t / T_max: floor(d * n_bins) clipped to [0, n_bins - 1]."""
    return jnp.clip(jnp.floor(jnp.asarray(depth_I, jnp.float32) * n_bins).astype(jnp.int32), 0, n_bins - 1)


def step_quality_by_depth(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, depth_I, *, n_bins: int = 4,
                          tol: float = 0.0, state_mask_I=None):
    """`step_quality` within each of n_bins equal-width bins of normalised depth d_t = t / T_max in [0, 1]
    (docs/study.md finding 4: RL's advantage grows with d_t). Every value has shape [Db]; empty bins give NaN.
    Also returns bin_edges [D + 1]."""
    if int(n_bins) < 1:
        raise ValueError(f"n_bins must be positive, got {n_bins}")
    per_state = per_state_comparison(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, tol=tol,
                                     state_mask_I=state_mask_I)
    value_checks.require_same_shape(depth_I, per_state["used"], "depth_I", "states")
    onehot_IxDb = jax.nn.one_hot(depth_bins(depth_I, n_bins), n_bins) * per_state["used"][:, None]
    out = jax.vmap(lambda w_I: _summaries(per_state, w_I), in_axes=1)(onehot_IxDb)
    out["bin_edges"] = jnp.linspace(0.0, 1.0, n_bins + 1)
    return out


def choose_error_action(q_A, non_terminating_A, valid_A=None, *, tol: float = 0.0) -> jax.Array:
    """The injected error action of one state, int32 (-1 if none exists).

    docs/study.md, "jaxagent's definitions", Error state: among valid non-terminating actions a with
    Q*(s, a) < max_{a' valid} Q*(s, a') - tol, the one with the lowest Q* (lowest index on ties).
    vmap over states for a batch.
    """
    value_checks.require_ndim(q_A, 1, "q_A")
    value_checks.require_same_shape(q_A, non_terminating_A, "q_A", "non_terminating_A")
    q_A = jnp.asarray(q_A, jnp.float32)
    valid_A = jnp.ones(q_A.shape, bool) if valid_A is None else jnp.asarray(valid_A, bool)
    best = jnp.max(jnp.where(valid_A, q_A, -jnp.inf))
    candidate_A = valid_A & jnp.asarray(non_terminating_A, bool) & (q_A < best - tol)
    worst = jnp.argmin(jnp.where(candidate_A, q_A, jnp.inf)).astype(jnp.int32)
    return jnp.where(candidate_A.any(), worst, -1)


def error_state_metrics(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, success_base_IxY, success_rl_IxY,
                        key, *, tol: float = 0.0, state_mask_I=None, n_boot: int = 1000, alpha: float = 0.05):
    """Error-state metrics with percentile bootstrap CIs over error states (docs/study.md finding 4).

    share_rl_better / share_rl_worse: shares of error states where RL's mean q over its G actions is
    strictly higher / lower than base's (as in `per_state_comparison`); success_rl / success_base: mean
    over states of the per-state success rate of the R continuations of each policy from the same error
    state; success_diff = success_rl - success_base (paired). All five resample the same states (one key,
    `passk.bootstrap_ci`); states are used when both policies have a valid action and state_mask allows.
    Returns a dict of `passk.CI`.
    """
    per_state = per_state_comparison(q_base_IxG, valid_base_IxG, q_rl_IxG, valid_rl_IxG, tol=tol,
                                     state_mask_I=state_mask_I)
    value_checks.require_ndim(success_base_IxY, 2, "success_base_IxY")
    value_checks.require_ndim(success_rl_IxY, 2, "success_rl_IxY")
    rate_base_I = jnp.mean(jnp.asarray(success_base_IxY, jnp.float32), axis=-1)
    rate_rl_I = jnp.mean(jnp.asarray(success_rl_IxY, jnp.float32), axis=-1)
    stacked_5xS = jnp.stack([
        per_state["rl_better"].astype(jnp.float32), per_state["rl_worse"].astype(jnp.float32),
        rate_rl_I, rate_base_I, rate_rl_I - rate_base_I,
    ])
    ci = bootstrap_ci(stacked_5xS, key, n_boot=n_boot, alpha=alpha, mask=per_state["used"])
    names = ("share_rl_better", "share_rl_worse", "success_rl", "success_base", "success_diff")
    return {name: type(ci)(ci.mean[i], ci.lo[i], ci.hi[i]) for i, name in enumerate(names)}
