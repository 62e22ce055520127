"""GRPO's loss in one call: group-relative advantages, the PPO-clip policy loss and the KL to a reference.

Dimension legend: P prompts (tasks), G rollouts per prompt (a group), B = P * G sequences, row p * G + g
being rollout g of prompt p (the order `rl.loop` and `jnp.repeat(tasks, G)` produce), T tokens.

The parts stay public for other combinations: `advantages.batch_group_advantages` (the baseline),
`losses.policy_loss` (clip, aggregation, KL, entropy, truncated importance sampling) and
`train_step.build_train_step` (the sharded update with micro-batches).
"""
from __future__ import annotations

import jax.numpy as jnp

from jaxagent import checks
from jaxagent.rl import advantages as adv_lib
from jaxagent.rl import losses
from jaxagent.rl.advantages import GroupEstimator
from jaxagent.rl.losses import AggMode, KLEstimator


def grpo_loss(logp_BxT, old_logp_BxT, rewards_PxG, mask_BxT, *, clip_eps=0.2, clip_high=None, kl_coef=0.0,
              ref_logp_BxT=None, estimator=GroupEstimator.GRPO, agg_mode=AggMode.SEQ_MEAN_TOKEN_MEAN,
              kl_estimator=KLEstimator.K3, eps=1e-6, ddof=1):
    """GRPO loss (minimised) -> (scalar, aux).

    With r_{i,t} = pi_theta(o_{i,t} | q, o_{i,<t}) / pi_old(o_{i,t} | q, o_{i,<t}) over the policy tokens
    (mask_BxT) of the G rollouts o_i of a prompt q, and outcome rewards R_i (rewards_PxG):

        A_i   = (R_i - mean_j R_j) / (std_j R_j + eps)                                  (std: ddof=1)
        J     = 1/G sum_i 1/|o_i| sum_t [ min(r_{i,t} A_i, clip(r_{i,t}, 1 - eps_lo, 1 + eps_hi) A_i)
                                          - beta D_{i,t} ]
        D_{i,t} = pi_ref / pi_theta - log(pi_ref / pi_theta) - 1                         (k3 estimator)
        loss  = -J, averaged over the P prompts

    Source: Shao et al. 2024, "DeepSeekMath" (arXiv 2402.03300), Sec. 4.1: eq. 3 (objective), eq. 4 (the
    k3 KL), Sec. 4.1.2 (outcome-supervised advantage A_i). eps_lo = clip_eps, eps_hi = clip_high (default
    clip_eps; a larger one is DAPO's clip-higher, Yu et al. 2025, Sec. 3.1). beta = kl_coef; the KL term is
    present iff ref_logp_BxT is given. `estimator` swaps the baseline ('dr_grpo': A_i = R_i - mean R, Liu
    et al. 2025; 'rloo'), `agg_mode` the 1/G sum_i 1/|o_i| sum_t average ('token-mean': DAPO's, Yu et al.
    2025, Sec. 3.3; 'seq-mean-token-sum-norm': Dr.GRPO's constant normaliser), `kl_estimator` the KL
    estimate (`losses.kl_penalty`).

    logp_BxT, old_logp_BxT, ref_logp_BxT: float [B, T], log-probs of each token under the current, the
    sampling and the reference policy (`rl.token_logprobs`; a rollout's `logprobs`); rewards_PxG: one
    outcome per rollout; mask_BxT: 1 on the policy tokens that enter the loss (a rollout's `policy_mask`).
    Under `jax.jit(grpo_loss)` pass the options as their enum members (`GroupEstimator`, `AggMode`,
    `KLEstimator`): they are static; the numbers may be traced.

    aux: `losses.policy_loss`'s (pg_loss, clip_frac, ratio_mean, kl_ref, ...) and 'advantages_PxG'.
    """
    sizes = checks.arrays("grpo_loss", [
        ("logp_BxT", logp_BxT, "BT", "float"), ("old_logp_BxT", old_logp_BxT, "BT", "float"),
        ("mask_BxT", mask_BxT, "BT", "number"), ("ref_logp_BxT", ref_logp_BxT, "BT", "float"),
        ("rewards_PxG", rewards_PxG, "PG", "number")])
    if sizes["P"] * sizes["G"] != sizes["B"]:
        raise ValueError(f"grpo_loss: rewards_PxG is [{sizes['P']}, {sizes['G']}] ({sizes['P'] * sizes['G']} rollouts) "
                         f"but logp_BxT has B = {sizes['B']} rows; B must equal P * G (row p * G + g = rollout g "
                         "of prompt p)")
    adv_PxG = adv_lib.batch_group_advantages(rewards_PxG, estimator, eps=eps, ddof=ddof)
    adv_BxT = jnp.broadcast_to(adv_PxG.reshape(-1, 1), (sizes["B"], sizes["T"]))
    loss, aux = losses.policy_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, clip_low=clip_eps,
                                   clip_high=clip_eps if clip_high is None else clip_high, agg_mode=agg_mode,
                                   kl_coef=kl_coef, ref_logp=ref_logp_BxT, kl_estimator=kl_estimator)
    return loss, {**aux, "advantages_PxG": adv_PxG}
