"""Likelihood diagnostics: per-action NLL, cumulative log-likelihood ratio, length-matched pairs.

Dimension legend (this module): B trajectories, T tokens, N turns (actions) per trajectory,
R RL trajectories, M base trajectories.

Token inputs follow the rollout's layout: logp_BxT is the per-token log-probability of the trajectory's
own tokens under some policy, turn_ids_BxT is the index of the turn (action) a policy-generated token
belongs to, -1 for prompt / observation / padding tokens. `policy_turn_ids` builds it from the rollout's
`turn_index` (which also numbers observation tokens) and `policy_mask`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxagent.eval import _checks
from jaxagent.eval.passk import CI, bootstrap_ci


def _check_tokens(logp_BxT, turn_ids_BxT):
    _checks.require_ndim(logp_BxT, 2, "logp_BxT")
    _checks.require_same_shape(logp_BxT, turn_ids_BxT, "logp_BxT", "turn_ids_BxT")
    _checks.require_integer(turn_ids_BxT, "turn_ids_BxT")


def policy_turn_ids(turn_index_BxT, policy_mask_BxT) -> jax.Array:
    """Turn ids of policy-generated tokens, -1 elsewhere: where(policy_mask, turn_index, -1)."""
    _checks.require_same_shape(turn_index_BxT, policy_mask_BxT, "turn_index_BxT", "policy_mask_BxT")
    return jnp.where(jnp.asarray(policy_mask_BxT, bool), jnp.asarray(turn_index_BxT, jnp.int32), -1)


def action_nll(logp_BxT, turn_ids_BxT, n_turns: int) -> dict[str, jax.Array]:
    """Per-action negative log-likelihood and its mean over actions.

    nll[b, a] = -sum_{t: turn_ids[b,t] = a} logp[b, t]  (docs/study.md, "jaxagent's definitions", Action NLL:
    sum of -log pi over the action's generated tokens); mean_nll = mean over every action present
    (at least one token) in the batch. Computed by one segment sum; ids outside [0, n_turns) are ignored.
    Returns nll [B, N], action_mask [B, N], mean_nll [].
    """
    _check_tokens(logp_BxT, turn_ids_BxT)
    ids = _checks.concrete(turn_ids_BxT)
    if ids is not None and ids.size and ids.max() >= n_turns:
        raise ValueError(f"turn id {ids.max()} does not fit n_turns={n_turns}")
    b, _ = np.shape(logp_BxT)
    turn_ids_BxT = jnp.asarray(turn_ids_BxT, jnp.int32)
    slot_BxT = jnp.where((turn_ids_BxT >= 0) & (turn_ids_BxT < n_turns), turn_ids_BxT, n_turns)  # n_turns = discard
    seg_BxT = slot_BxT + (n_turns + 1) * jnp.arange(b, dtype=jnp.int32)[:, None]
    n_seg = b * (n_turns + 1)
    nll = jax.ops.segment_sum(-jnp.asarray(logp_BxT, jnp.float32).reshape(-1), seg_BxT.reshape(-1), num_segments=n_seg)
    count = jax.ops.segment_sum(jnp.ones(seg_BxT.size, jnp.int32), seg_BxT.reshape(-1), num_segments=n_seg)
    nll_BxN = nll.reshape(b, n_turns + 1)[:, :n_turns]
    mask_BxN = count.reshape(b, n_turns + 1)[:, :n_turns] > 0
    mean = jnp.sum(jnp.where(mask_BxN, nll_BxN, 0.0)) / mask_BxN.sum()
    return {"nll": nll_BxN, "action_mask": mask_BxN, "mean_nll": mean}


def policy_token_counts(turn_ids_BxT) -> jax.Array:
    """Number of policy-generated tokens int32[B] (turn id >= 0) of each trajectory."""
    return jnp.sum(jnp.asarray(turn_ids_BxT) >= 0, axis=-1).astype(jnp.int32)


def cumulative_llr(logp_rl_BxT, logp_base_BxT, turn_ids_BxT) -> jax.Array:
    """Cumulative log-likelihood ratio per trajectory [B].

    llr[b] = sum_{t: turn_ids[b,t] >= 0} (log pi_RL(y_t | .) - log pi_base(y_t | .)) = log pi_RL(tau) -
    log pi_base(tau) over the policy-generated tokens (docs/study.md, "jaxagent's definitions", Cumulative LLR).
    """
    _check_tokens(logp_rl_BxT, turn_ids_BxT)
    _checks.require_same_shape(logp_rl_BxT, logp_base_BxT, "logp_rl_BxT", "logp_base_BxT")
    diff_BxT = jnp.asarray(logp_rl_BxT, jnp.float32) - jnp.asarray(logp_base_BxT, jnp.float32)
    return jnp.sum(jnp.where(jnp.asarray(turn_ids_BxT) >= 0, diff_BxT, 0.0), axis=-1)


def length_matched_pairs(task_rl_R, success_rl_R, ntok_rl_R, task_base_M, success_base_M, ntok_base_M,
                         *, rel_tol: float = 0.1) -> dict[str, jax.Array]:
    """Length-matched (RL, base) trajectory pairs with static shapes.

    Candidates [R, M]: same task, both successful, |n_rl - n_base| <= rel_tol * max(n_rl, n_base) on
    policy-token counts (docs/study.md, "jaxagent's definitions": within 10% of the longer). Matching is greedy
    and one-to-one, not a maximum matching: RL trajectories in index order each take the still-unused
    candidate base trajectory with the smallest token-count gap (lowest index on ties), or none.
    Returns candidates [R, M], match [R] (base index or -1), pair_mask [R, M], n_pairs, n_tasks
    (distinct tasks among matched pairs).
    """
    for name, x in (("task_rl_R", task_rl_R), ("success_rl_R", success_rl_R), ("ntok_rl_R", ntok_rl_R),
                    ("task_base_M", task_base_M), ("success_base_M", success_base_M), ("ntok_base_M", ntok_base_M)):
        _checks.require_ndim(x, 1, name)
    _checks.require_same_shape(task_rl_R, ntok_rl_R, "task_rl_R", "ntok_rl_R")
    _checks.require_same_shape(task_base_M, ntok_base_M, "task_base_M", "ntok_base_M")
    n_rl_R1 = jnp.asarray(ntok_rl_R, jnp.float32)[:, None]
    n_base_1M = jnp.asarray(ntok_base_M, jnp.float32)[None, :]
    gap_RxM = jnp.abs(n_rl_R1 - n_base_1M)
    task_rl_R = jnp.asarray(task_rl_R)
    cand_RxM = ((task_rl_R[:, None] == jnp.asarray(task_base_M)[None, :])
                & jnp.asarray(success_rl_R, bool)[:, None] & jnp.asarray(success_base_M, bool)[None, :]
                & (gap_RxM <= rel_tol * jnp.maximum(n_rl_R1, n_base_1M)))

    def pick(used_M, row):
        cand_M, gap_M = row
        avail_M = cand_M & ~used_M
        j = jnp.argmin(jnp.where(avail_M, gap_M, jnp.inf)).astype(jnp.int32)
        j = jnp.where(avail_M.any(), j, -1)
        return used_M | (jnp.arange(used_M.shape[0]) == j), j

    _, match_R = lax.scan(pick, jnp.zeros(cand_RxM.shape[1], bool), (cand_RxM, gap_RxM))
    matched_R = match_R >= 0
    pair_RxM = matched_R[:, None] & (jnp.arange(cand_RxM.shape[1])[None, :] == match_R[:, None])
    earlier_same_RxR = (task_rl_R[:, None] == task_rl_R[None, :]) & jnp.tril(jnp.ones((task_rl_R.size,) * 2, bool), -1)
    first_of_task_R = matched_R & ~jnp.any(earlier_same_RxR & matched_R[None, :], axis=1)
    return {"candidates": cand_RxM, "match": match_R, "pair_mask": pair_RxM,
            "n_pairs": matched_R.sum(), "n_tasks": first_of_task_R.sum()}


def matched_difference(values_rl_R, values_base_M, match_R, key, *, n_boot: int = 1000, alpha: float = 0.05) -> CI:
    """Mean paired difference values_rl[i] - values_base[match[i]] over matched pairs (match >= 0) with a
    percentile bootstrap CI over pairs (`passk.bootstrap_ci`); e.g. the length-matched cumulative LLR
    control of docs/study.md finding 5. No pair gives NaN."""
    _checks.require_same_shape(values_rl_R, match_R, "values_rl_R", "match_R")
    match_R = jnp.asarray(match_R, jnp.int32)
    base_R = jnp.asarray(values_base_M, jnp.float32)[jnp.clip(match_R, 0, None)]
    diff_R = jnp.asarray(values_rl_R, jnp.float32) - base_R
    return bootstrap_ci(diff_R, key, n_boot=n_boot, alpha=alpha, mask=match_R >= 0)
