"""Likelihood diagnostics: per-action NLL, cumulative log-likelihood ratio, length-matched pairs.

Dimension legend (this module): B trajectories, T tokens, N turns (actions) per trajectory,
Br RL trajectories, Bb base trajectories (the two sides of a length-matched comparison).

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

from jaxagent.eval import value_checks
from jaxagent.eval.passk import CI, bootstrap_ci


def _check_tokens(logp_BxT, turn_ids_BxT):
    value_checks.require_ndim(logp_BxT, 2, "logp_BxT")
    value_checks.require_same_shape(logp_BxT, turn_ids_BxT, "logp_BxT", "turn_ids_BxT")
    value_checks.require_integer(turn_ids_BxT, "turn_ids_BxT")


def policy_turn_ids(turn_index_BxT, policy_mask_BxT) -> jax.Array:
    """Turn ids of policy-generated tokens, -1 elsewhere: where(policy_mask, turn_index, -1)."""
    value_checks.require_same_shape(turn_index_BxT, policy_mask_BxT, "turn_index_BxT", "policy_mask_BxT")
    return jnp.where(jnp.asarray(policy_mask_BxT, bool), jnp.asarray(turn_index_BxT, jnp.int32), -1)


def action_nll(logp_BxT, turn_ids_BxT, n_turns: int) -> dict[str, jax.Array]:
    """Per-action negative log-likelihood and its mean over actions.

    nll[b, a] = -sum_{t: turn_ids[b,t] = a} logp[b, t]  (docs/study.md, "jaxagent's definitions", Action NLL:
    sum of -log pi over the action's generated tokens); mean_nll = mean over every action present
    (at least one token) in the batch. Computed by one segment sum; ids outside [0, n_turns) are ignored.
    Returns nll [B, N], action_mask [B, N], mean_nll [].
    """
    _check_tokens(logp_BxT, turn_ids_BxT)
    ids = value_checks.concrete(turn_ids_BxT)
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
    value_checks.require_same_shape(logp_rl_BxT, logp_base_BxT, "logp_rl_BxT", "logp_base_BxT")
    diff_BxT = jnp.asarray(logp_rl_BxT, jnp.float32) - jnp.asarray(logp_base_BxT, jnp.float32)
    return jnp.sum(jnp.where(jnp.asarray(turn_ids_BxT) >= 0, diff_BxT, 0.0), axis=-1)


def length_matched_pairs(task_rl_Br, success_rl_Br, ntok_rl_Br, task_base_Bb, success_base_Bb, ntok_base_Bb,
                         *, rel_tol: float = 0.1) -> dict[str, jax.Array]:
    """Length-matched (RL, base) trajectory pairs with static shapes.

    Candidates [R, M]: same task, both successful, |n_rl - n_base| <= rel_tol * max(n_rl, n_base) on
    policy-token counts (docs/study.md, "jaxagent's definitions": within 10% of the longer). Matching is greedy
    and one-to-one, not a maximum matching: RL trajectories in index order each take the still-unused
    candidate base trajectory with the smallest token-count gap (lowest index on ties), or none.
    Returns candidates [R, M], match [R] (base index or -1), pair_mask [R, M], n_pairs, n_tasks
    (distinct tasks among matched pairs).
    """
    for name, x in (("task_rl_Br", task_rl_Br), ("success_rl_Br", success_rl_Br), ("ntok_rl_Br", ntok_rl_Br),
                    ("task_base_Bb", task_base_Bb), ("success_base_Bb", success_base_Bb), ("ntok_base_Bb", ntok_base_Bb)):
        value_checks.require_ndim(x, 1, name)
    value_checks.require_same_shape(task_rl_Br, ntok_rl_Br, "task_rl_Br", "ntok_rl_Br")
    value_checks.require_same_shape(task_base_Bb, ntok_base_Bb, "task_base_Bb", "ntok_base_Bb")
    n_rl_R1 = jnp.asarray(ntok_rl_Br, jnp.float32)[:, None]
    n_base_1M = jnp.asarray(ntok_base_Bb, jnp.float32)[None, :]
    gap_BrxBb = jnp.abs(n_rl_R1 - n_base_1M)
    task_rl_Br = jnp.asarray(task_rl_Br)
    cand_BrxBb = ((task_rl_Br[:, None] == jnp.asarray(task_base_Bb)[None, :])
                & jnp.asarray(success_rl_Br, bool)[:, None] & jnp.asarray(success_base_Bb, bool)[None, :]
                & (gap_BrxBb <= rel_tol * jnp.maximum(n_rl_R1, n_base_1M)))

    def pick(used_Bb, row):
        cand_Bb, gap_Bb = row
        avail_Bb = cand_Bb & ~used_Bb
        j = jnp.argmin(jnp.where(avail_Bb, gap_Bb, jnp.inf)).astype(jnp.int32)
        j = jnp.where(avail_Bb.any(), j, -1)
        return used_Bb | (jnp.arange(used_Bb.shape[0]) == j), j

    _, match_Br = lax.scan(pick, jnp.zeros(cand_BrxBb.shape[1], bool), (cand_BrxBb, gap_BrxBb))
    matched_Br = match_Br >= 0
    pair_BrxBb = matched_Br[:, None] & (jnp.arange(cand_BrxBb.shape[1])[None, :] == match_Br[:, None])
    earlier_same_BrxBr = (task_rl_Br[:, None] == task_rl_Br[None, :]) & jnp.tril(jnp.ones((task_rl_Br.size,) * 2, bool), -1)
    first_of_task_Br = matched_Br & ~jnp.any(earlier_same_BrxBr & matched_Br[None, :], axis=1)
    return {"candidates": cand_BrxBb, "match": match_Br, "pair_mask": pair_BrxBb,
            "n_pairs": matched_Br.sum(), "n_tasks": first_of_task_Br.sum()}


def matched_difference(values_rl_Br, values_base_Bb, match_Br, key, *, n_boot: int = 1000, alpha: float = 0.05) -> CI:
    """Mean paired difference values_rl[i] - values_base[match[i]] over matched pairs (match >= 0) with a
    percentile bootstrap CI over pairs (`passk.bootstrap_ci`); e.g. the length-matched cumulative LLR
    control of docs/study.md finding 5. No pair gives NaN."""
    value_checks.require_same_shape(values_rl_Br, match_Br, "values_rl_Br", "match_Br")
    match_Br = jnp.asarray(match_Br, jnp.int32)
    base_Br = jnp.asarray(values_base_Bb, jnp.float32)[jnp.clip(match_Br, 0, None)]
    diff_Br = jnp.asarray(values_rl_Br, jnp.float32) - base_Br
    return bootstrap_ci(diff_Br, key, n_boot=n_boot, alpha=alpha, mask=match_Br >= 0)
