"""Policy, value, KL and entropy losses over token arrays, with verl-style loss aggregation.

Dimension legend: B sequences, T tokens, V vocab. `mask_BxT` is 1 on tokens the policy generated
and that enter the loss, 0 on prompt, observation and padding tokens. Inputs at masked positions
may hold anything (even -inf log-probs): they are replaced before any exp, so they reach neither
the loss nor its gradient. Everything is computed in at least float32.

String options (`agg_mode`, `kl_estimator`) take the `AggMode` / `KLEstimator` members or their strings;
the members also pass through `jax.jit` as static values (`jaxagent.checks`), so
`jax.jit(policy_loss)(..., agg_mode=AggMode.SEQ_MEAN_TOKEN_MEAN)` compiles without `static_argnames`.
"""
import enum

import jax
import jax.numpy as jnp

from jaxagent import checks


@checks.static_option
class AggMode(enum.StrEnum):
    """How a per-token loss becomes a scalar (`aggregate`)."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


@checks.static_option
class KLEstimator(enum.StrEnum):
    """The KL-to-reference term of `policy_loss`: sampled estimates k1, k2, k3 (`kl_penalty`) or the
    full-vocabulary KL at each state ("exact", `exact_kl`)."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    EXACT = "exact"


AGG_MODES = tuple(m.value for m in AggMode)
SAMPLED_KL_ESTIMATORS = ("k1", "k2", "k3")  # per-token estimates from the sampled token (`kl_penalty`)
KL_ESTIMATORS = tuple(m.value for m in KLEstimator)
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: finite in f32; a ratio that large is clipped anyway


def _float(x):
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _is_nonzero_number(x):
    return isinstance(x, (int, float)) and x != 0


def aggregate(loss_BxT, mask_BxT, mode, norm_len=None):
    """Reduce a per-token loss to a scalar (the loss_agg_mode options of verl).

    'token-mean'              : sum_{b,t} m l / sum_{b,t} m       (DAPO token-level loss,
                                Yu et al. 2025, "DAPO", Sec. 3.3)
    'seq-mean-token-mean'     : mean_b [ sum_t m l / sum_t m ]    (GRPO's 1/G sum_i 1/|o_i| sum_t,
                                Shao et al. 2024, eq. 3)
    'seq-mean-token-sum-norm' : mean_b [ sum_t m l / L ]          (Dr.GRPO, Liu et al. 2025, Sec.
                                3: a constant L = norm_len, default T, removes the length bias)
    The seq-mean modes average over sequences with at least one valid token, so fully masked rows
    (padding, groups dropped by dynamic sampling) do not dilute the mean. An all-masked batch -> 0.
    """
    checks.arrays("aggregate", [("loss_BxT", loss_BxT, "BT", "number"), ("mask_BxT", mask_BxT, "BT", "number")])
    mode = checks.option(AggMode, mode, "aggregate", "mode")
    loss_BxT, mask_BxT = jnp.asarray(loss_BxT), jnp.asarray(mask_BxT)
    valid_BxT = mask_BxT.astype(bool)
    w_BxT = valid_BxT.astype(jnp.float32)
    summed_B = jnp.sum(jnp.where(valid_BxT, _float(loss_BxT), 0.0), axis=-1)
    if mode == "token-mean":
        return jnp.sum(summed_B) / jnp.maximum(jnp.sum(w_BxT), 1.0)
    count_B = jnp.sum(w_BxT, axis=-1)
    if mode == "seq-mean-token-mean":
        per_seq_B = summed_B / jnp.maximum(count_B, 1.0)
    elif mode == "seq-mean-token-sum-norm":
        length = loss_BxT.shape[1] if norm_len is None else norm_len
        if isinstance(length, (int, float)) and length <= 0:
            raise ValueError(f"norm_len must be positive, got {length}")
        per_seq_B = summed_B / length
    has_tokens_B = (count_B > 0).astype(per_seq_B.dtype)
    return jnp.sum(per_seq_B * has_tokens_B) / jnp.maximum(jnp.sum(has_tokens_B), 1.0)


def ppo_clip_objective(logp, old_logp, adv, *, clip_low, clip_high):
    """Per-token PPO clipped surrogate loss, elementwise over any shape -> (loss, clipped).

    ratio = exp(logp - old_logp)
    loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    Source: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7; separate
    clip_low / clip_high is DAPO's clip-higher (Yu et al. 2025, Sec. 3.1).
    `clipped` is True where the clipped branch is strictly the larger loss (its gradient is 0).
    The log-ratio is clamped to +-LOG_RATIO_CLAMP before exp (as verl does) to stay finite.
    """
    checks.same_shape("ppo_clip_objective", logp=logp, old_logp=old_logp, adv=adv)
    for name, eps in (("clip_low", clip_low), ("clip_high", clip_high)):
        if isinstance(eps, (int, float)) and eps < 0:
            raise ValueError(f"{name} must be >= 0, got {eps}")
    log_ratio = jnp.clip(_float(logp) - _float(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    adv = _float(adv)
    unclipped = -ratio * adv
    clipped_loss = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return jnp.maximum(unclipped, clipped_loss), clipped_loss > unclipped


def kl_penalty(logp, ref_logp, estimator="k3"):
    """Per-token estimate of KL(pi || pi_ref) from samples of pi, elementwise over any shape.

    With x = ref_logp - logp (log of r = pi_ref / pi):
    k1 = -x = logp - ref_logp                  (unbiased, high variance, can be negative)
    k2 = x^2 / 2                               (biased, low variance)
    k3 = exp(x) - x - 1 = (r - 1) - log r       (unbiased, low variance, >= 0; GRPO's KL term)
    Source: Schulman 2020, "Approximating KL Divergence" (blog); k3 in Shao et al. 2024, eq. 4.
    x is clamped to +-LOG_RATIO_CLAMP so k3 stays finite.

    Differentiated as a loss term on samples of pi, the estimators optimise different things
    (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient estimation for RL",
    arXiv:2506.09477): E_pi[grad k2] = E_pi[(log pi - log pi_ref) grad log pi] = grad KL(pi || pi_ref),
    the reverse KL the penalty means; E_pi[grad k3] = E_pi[(1 - pi_ref / pi) grad log pi]
    = grad KL(pi_ref || pi), the forward KL, whose per-token weight pi_ref / pi grows without bound
    (up to the clamp) on tokens the policy has pushed far below the reference.
    """
    checks.same_shape("kl_penalty", logp=logp, ref_logp=ref_logp)
    estimator = checks.option(KLEstimator, estimator, "kl_penalty", "estimator")
    x = jnp.clip(_float(ref_logp) - _float(logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x**2
    if estimator == "k3":
        return jnp.expm1(x) - x
    raise ValueError("the 'exact' KL needs both models' logits: `exact_kl`, passed to policy_loss as kl_exact_BxT")


def exact_kl(logits_xV, ref_logits_xV):
    """KL(pi || pi_ref) of the two next-token distributions, summed over the vocabulary (last axis).

    KL = sum_v p_v (log p_v - log q_v), p = softmax(z), q = softmax(z_ref), in float32. Exact at each
    state, so unlike the sampled estimators (`kl_penalty`) it sees probability moved onto tokens that
    were not sampled, e.g. the first token of a malformed reply at a state where the batch holds only
    well-formed ones. Its gradient in z is the reverse KL's, p * ((log p - log q) - KL) per logit.
    Source: the definition (Kullback & Leibler 1951); why sampled estimators' gradients differ from
    it: Tang & Munos 2025 (arXiv:2506.09477). Entries with p = 0 add 0 (and no NaN to the gradient).
    """
    logp = jax.nn.log_softmax(_float(logits_xV), axis=-1)
    logq = jax.nn.log_softmax(_float(ref_logits_xV), axis=-1)
    p = jnp.exp(logp)
    return jnp.sum(p * jnp.where(p > 0, logp - logq, 0.0), axis=-1)


def entropy_from_logits(logits_xV):
    """Entropy of softmax(logits) over the last axis, in float32: H = logsumexp(z) - sum_v p_v z_v.

    Written as -sum_v p_v log p_v with log p = z - logsumexp(z); entries with p = 0 (including
    -inf logits from top-k/top-p masks) contribute exactly 0 to the value and the gradient.
    Shannon 1948; the entropy bonus of Mnih et al. 2016 (A3C) / Schulman et al. 2017 eq. 9.
    """
    z = logits_xV.astype(jnp.promote_types(logits_xV.dtype, jnp.float32))
    logp = jax.nn.log_softmax(z, axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)


def value_loss(values_BxT, old_values_BxT, returns_BxT, mask_BxT, *, clip_eps,
               agg_mode="token-mean", norm_len=None):
    """Clipped value loss -> (scalar, aux).

    l_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - eps, V_old_t + eps) - R_t)^2),
    aggregated with `aggregate(l, mask, agg_mode, norm_len)`. Source: the PPO value clipping of
    OpenAI baselines ppo2; Andrychowicz et al. 2021, "What Matters in On-Policy RL", Sec. 3.
    aux: 'vf_clip_frac' (token share where the clipped branch is strictly larger), 'vf_mse'.
    """
    checks.arrays("value_loss", [(n, x, "BT", "number") for n, x in (
        ("values_BxT", values_BxT), ("old_values_BxT", old_values_BxT), ("returns_BxT", returns_BxT),
        ("mask_BxT", mask_BxT))])
    agg_mode = checks.option(AggMode, agg_mode, "value_loss", "agg_mode")
    values_BxT, old_values_BxT, returns_BxT, mask_BxT = (
        jnp.asarray(x) for x in (values_BxT, old_values_BxT, returns_BxT, mask_BxT))
    if isinstance(clip_eps, (int, float)) and clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")
    valid_BxT = mask_BxT.astype(bool)
    safe = lambda x: jnp.where(valid_BxT, _float(x), 0.0)  # noqa: E731
    v, v_old, ret = safe(values_BxT), safe(old_values_BxT), safe(returns_BxT)
    err = (v - ret) ** 2
    err_clipped = (jnp.clip(v, v_old - clip_eps, v_old + clip_eps) - ret) ** 2
    loss = aggregate(0.5 * jnp.maximum(err, err_clipped), mask_BxT, agg_mode, norm_len)
    aux = {"vf_clip_frac": aggregate(err_clipped > err, mask_BxT, "token-mean"),
           "vf_mse": aggregate(err, mask_BxT, "token-mean")}
    return loss, aux


def truncated_is_weights(old_logp, sampler_logp, cap):
    """Token-level truncated importance weights for a sampler/trainer mismatch -> (w, truncated).

    w_t = min(pi_old_train(a_t | s_t) / pi_sampler(a_t | s_t), C)
        = min(exp(old_logp_t - sampler_logp_t), C)
    where pi_old_train is the trainer's pre-update policy (e.g. f32 masters) and pi_sampler the
    policy that generated the tokens (e.g. a bf16 or vLLM sampler). The weight corrects the
    sampler's distribution towards the trainer's; truncation at C bounds its variance.
    Source: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (blog post, Aug 2025; truncated importance sampling, TIS). The weight carries no
    gradient (stop_gradient); elementwise over any shape. `truncated` is True where w hit C.
    """
    checks.same_shape("truncated_is_weights", old_logp=old_logp, sampler_logp=sampler_logp)
    if isinstance(cap, (int, float)) and cap <= 0:
        raise ValueError(f"the truncated importance sampling cap must be > 0, got {cap}")
    log_w = jnp.clip(_float(old_logp) - _float(sampler_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    raw = jnp.exp(log_w)
    w = jax.lax.stop_gradient(jnp.minimum(raw, cap))
    return w, raw > cap


def _check_policy_inputs(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, ref_logp, kl_exact_BxT, entropy_BxT, sampler_logp):
    """`policy_loss`'s arrays: floating [B, T] (the mask bool or numeric), all of one shape."""
    checks.arrays("policy_loss", [
        ("logp_BxT", logp_BxT, "BT", "float"), ("old_logp_BxT", old_logp_BxT, "BT", "float"),
        ("adv_BxT", adv_BxT, "BT", "float"), ("mask_BxT", mask_BxT, "BT", "number"),
        ("ref_logp", ref_logp, "BT", "float"), ("kl_exact_BxT", kl_exact_BxT, "BT", "float"),
        ("entropy_BxT", entropy_BxT, "BT", "float"), ("sampler_logp", sampler_logp, "BT", "float")])


def policy_loss(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, *, clip_low, clip_high, agg_mode,
                norm_len=None, kl_coef=0.0, ref_logp=None, kl_estimator="k3", kl_exact_BxT=None,
                entropy_coef=0.0, entropy_BxT=None, sampler_logp=None, tis_cap=None):
    """PPO-clip policy loss with optional KL-to-reference and entropy terms -> (scalar, aux).

    L = agg(w * ppo_clip_objective) + kl_coef * agg(kl_penalty(logp, ref_logp))
        - entropy_coef * agg(entropy)
    with agg = `aggregate(., mask_BxT, agg_mode, norm_len)`. Sources: Schulman et al. 2017 eq. 7
    and 9; DAPO clip-higher (Yu et al. 2025); GRPO's KL term (Shao et al. 2024, eq. 3-4).
    w = 1, or with `tis_cap` = C the truncated importance weight of the sampler/trainer mismatch,
    w_t = min(exp(old_logp_t - sampler_logp_t), C) (`truncated_is_weights`; Yao et al. 2025, TIS):
    old_logp is then the trainer's pre-update log-prob and `sampler_logp` the sampler's.
    The KL term is added iff ref_logp is given, the entropy term iff entropy_BxT is given (a
    nonzero Python coefficient without its array is a ValueError); coefficients may be traced.
    kl_estimator "exact" takes the per-state full-vocabulary KL(pi || pi_ref) from `kl_exact_BxT`
    (`exact_kl` at each policy token's state; `logprobs.next_token_stats(ref=...)`) in place of a
    sampled estimate; ref_logp is then still given, for the k3 monitor.
    aux: 'pg_loss' and 'kl_ref' (when given) as aggregated into L; 'kl_ref_k3' the token-mean k3
    estimate of KL(pi || pi_ref) (when ref_logp is given, whatever `kl_estimator`); token-means over the mask,
    whatever agg_mode, so runs compare: 'clip_frac', 'ratio_mean', 'approx_kl_old_abs' =
    mean |logp - old_logp| and 'approx_kl_old_k3' (trainer-vs-sampler drift), 'entropy' if given;
    with tis_cap 'tis_weight_mean' and 'tis_trunc_frac' (share of tokens whose weight hit C).
    """
    _check_policy_inputs(logp_BxT, old_logp_BxT, adv_BxT, mask_BxT, ref_logp, kl_exact_BxT, entropy_BxT, sampler_logp)
    agg_mode = checks.option(AggMode, agg_mode, "policy_loss", "agg_mode")
    kl_estimator = checks.option(KLEstimator, kl_estimator, "policy_loss", "kl_estimator")
    logp_BxT, old_logp_BxT, adv_BxT, mask_BxT = (jnp.asarray(x) for x in (logp_BxT, old_logp_BxT, adv_BxT, mask_BxT))
    if ref_logp is None and _is_nonzero_number(kl_coef):
        raise ValueError("kl_coef is nonzero but ref_logp was not given")
    if entropy_BxT is None and _is_nonzero_number(entropy_coef):
        raise ValueError("entropy_coef is nonzero but entropy_BxT was not given")
    if tis_cap is not None and sampler_logp is None:
        raise ValueError("tis_cap is set but sampler_logp (the sampler's log-probs) was not given")
    if ref_logp is not None and kl_estimator == "exact" and kl_exact_BxT is None:
        raise ValueError("kl_estimator='exact' needs kl_exact_BxT (the full-vocabulary KL at each state)")
    valid_BxT = mask_BxT.astype(bool)
    safe = lambda x: jnp.where(valid_BxT, _float(x), 0.0)  # noqa: E731
    logp, old_logp = safe(logp_BxT), safe(old_logp_BxT)
    pg_BxT, clipped_BxT = ppo_clip_objective(logp, old_logp, safe(adv_BxT),
                                             clip_low=clip_low, clip_high=clip_high)
    mean = lambda x: aggregate(x, mask_BxT, "token-mean")  # noqa: E731
    tis_aux = {}
    if tis_cap is not None:
        w_BxT, trunc_BxT = truncated_is_weights(old_logp, safe(sampler_logp), tis_cap)
        pg_BxT = w_BxT * pg_BxT
        tis_aux = {"tis_weight_mean": mean(w_BxT), "tis_trunc_frac": mean(trunc_BxT)}
    pg = aggregate(pg_BxT, mask_BxT, agg_mode, norm_len)
    aux = {"pg_loss": pg, "clip_frac": mean(clipped_BxT), **tis_aux,
           "ratio_mean": mean(jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP,
                                               LOG_RATIO_CLAMP))),
           "approx_kl_old_abs": mean(jnp.abs(logp - old_logp)),
           "approx_kl_old_k3": mean(kl_penalty(logp, old_logp, "k3"))}
    loss = pg
    if ref_logp is not None:
        if kl_estimator == "exact":
            kl_BxT = safe(kl_exact_BxT)
        else:
            kl_BxT = kl_penalty(logp, safe(ref_logp), kl_estimator)
        kl = aggregate(kl_BxT, mask_BxT, agg_mode, norm_len)
        loss, aux["kl_ref"] = loss + kl_coef * kl, kl
        aux["kl_ref_k3"] = mean(kl_penalty(logp, safe(ref_logp), "k3"))  # the monitor, whatever the estimator
    if entropy_BxT is not None:
        ent = aggregate(safe(entropy_BxT), mask_BxT, agg_mode, norm_len)
        loss, aux["entropy"] = loss - entropy_coef * ent, mean(safe(entropy_BxT))
    return loss, aux
