"""Tests for jaxagent.rl.losses: hand-computed values, numpy references, gradients, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxagent.rl import losses as L

# ----------------------------------------------------------------------------- aggregation
LOSS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
MASK = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], np.int32)  # the empty row must not count


@pytest.mark.parametrize("mode,norm_len,want", [
    ("token-mean", None, 27 / 5),                    # (1+2+7+8+9) / 5
    ("seq-mean-token-mean", None, (1.5 + 8) / 2),    # row means 3/2, 24/3
    ("seq-mean-token-sum-norm", None, (3 / 3 + 24 / 3) / 2),  # L defaults to T = 3
    ("seq-mean-token-sum-norm", 4, (3 / 4 + 24 / 4) / 2),
])
def test_aggregate_hand(mode, norm_len, want):
    np.testing.assert_allclose(L.aggregate(LOSS, MASK, mode, norm_len), want, rtol=1e-6)
    assert float(L.aggregate(LOSS, np.zeros_like(MASK), mode, norm_len)) == 0.0


def test_aggregate_bad_input():
    with pytest.raises(ValueError, match="aggregate: mode must be one of 'token-mean'.*got 'sum'"):
        L.aggregate(LOSS, MASK, "sum")
    with pytest.raises(ValueError, match="norm_len"):
        L.aggregate(LOSS, MASK, "seq-mean-token-sum-norm", 0)
    with pytest.raises(ValueError, match=r"aggregate: loss_BxT must be .* \[B, T\] \(rank 2\); got float32\[\d+\]"):
        L.aggregate(LOSS[0], MASK[0], "token-mean")


def test_aggregate_vmaps_over_microbatches():
    stack_l, stack_m = np.stack([LOSS, LOSS[::-1]]), np.stack([MASK, MASK[::-1]])
    got = jax.vmap(lambda l, m: L.aggregate(l, m, "seq-mean-token-mean"))(stack_l, stack_m)
    np.testing.assert_allclose(got, [4.75, 4.75], rtol=1e-6)


# ----------------------------------------------------------------------------- PPO clip
# Real tokens: old_logp = -1, ratios r and advantages A; clip_low .2, clip_high .28:
#  r=1.5 A=+1 -> -min(1.5, 1.28) = -1.28 (clipped)   r=0.5 A=+1 -> -min(0.5, 0.8)  = -0.5
#  r=0.5 A=-1 -> -min(-.5, -.8)  =  0.8  (clipped)   r=1.1 A=-2 -> 2.2
#  r=1.2 A=+2 -> -2.4                                r=1.3 A=-1 -> -min(-1.3,-1.28) = 1.3
RATIO = np.array([[1.5, 0.5, 1.0, 1.0], [0.5, 1.1, 1.2, 1.3]])
MASK_P = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.int32)
OLD = np.where(MASK_P, -1.0, -1e4).astype(np.float32)       # garbage at padding
LOGP = np.where(MASK_P, -1.0 + np.log(RATIO), np.nan).astype(np.float32)  # must not leak
ADV = np.array([[1.0, 1.0, 99.0, 99.0], [-1.0, -2.0, 2.0, -1.0]], np.float32)
PER_TOKEN = np.array([[-1.28, -0.5, 0.0, 0.0], [0.8, 2.2, -2.4, 1.3]])
CLIP = dict(clip_low=0.2, clip_high=0.28)


def test_ppo_clip_objective_hand():
    loss, clipped = L.ppo_clip_objective(np.log(RATIO), np.zeros_like(RATIO), ADV * MASK_P, **CLIP)
    np.testing.assert_allclose(np.asarray(loss) * MASK_P, PER_TOKEN, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(clipped) * MASK_P, [[1, 0, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("mode,norm_len,want", [
    ("token-mean", None, 0.12 / 6),
    ("seq-mean-token-mean", None, (-1.78 / 2 + 1.9 / 4) / 2),
    ("seq-mean-token-sum-norm", None, (-1.78 / 4 + 1.9 / 4) / 2),
    ("seq-mean-token-sum-norm", 10, (-1.78 / 10 + 1.9 / 10) / 2),
])
def test_policy_loss_hand(mode, norm_len, want):
    loss, aux = L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode=mode, norm_len=norm_len, **CLIP)
    np.testing.assert_allclose(loss, want, atol=1e-6)
    np.testing.assert_allclose(aux["pg_loss"], want, atol=1e-6)
    np.testing.assert_allclose(aux["clip_frac"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(aux["ratio_mean"], 6.1 / 6, rtol=1e-6)
    # mean |log r| = (ln1.5 + 2 ln2 + ln1.1 + ln1.2 + ln1.3) / 6
    np.testing.assert_allclose(aux["approx_kl_old_abs"], 2.3317556 / 6, rtol=1e-5)
    # k3 = 1/r + ln r - 1 per token: .0721318 + 2 * .3068528 + .0044011 + .0156549 + .0315951
    np.testing.assert_allclose(aux["approx_kl_old_k3"], 0.7374885 / 6, rtol=1e-5)
    assert "kl_ref" not in aux and "entropy" not in aux


def test_policy_loss_gradient_hand_and_padding_safe():
    grad = jax.grad(lambda lp: L.policy_loss(lp, OLD, ADV, MASK_P, agg_mode="token-mean",
                                             **CLIP)[0])(jnp.asarray(LOGP))
    # d/dlogp of -r A / 6 is -r A / 6 on unclipped tokens, 0 on clipped ones and on padding
    want = np.array([[0.0, -0.5, 0.0, 0.0], [0.0, 2.2, -2.4, 1.3]]) / 6
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_policy_loss_with_kl_and_entropy():
    ent = np.where(MASK_P, 2.0, np.nan).astype(np.float32)
    loss, aux = L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", kl_coef=0.1,
                              ref_logp=OLD, entropy_coef=0.01, entropy_BxT=ent, **CLIP)
    np.testing.assert_allclose(aux["kl_ref"], 0.7374885 / 6, rtol=1e-5)
    np.testing.assert_allclose(aux["entropy"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(loss, 0.02 + 0.1 * 0.7374885 / 6 - 0.01 * 2.0, rtol=1e-5)


# Truncated importance sampling (Yao et al. 2025): sampler log-probs such that the raw weights
# pi_old / pi_sampler are [[.5, 3], [1, 2.5, 1.5, .8]]; C = 2 truncates 3 and 2.5 to 2.
TIS_RAW = np.array([[0.5, 3.0, 1.0, 1.0], [1.0, 2.5, 1.5, 0.8]])
SAMPLER = np.where(MASK_P, -1.0 - np.log(TIS_RAW), np.nan).astype(np.float32)  # must not leak


def test_truncated_is_weights_hand():
    w, trunc = L.truncated_is_weights(np.log(TIS_RAW), np.zeros_like(TIS_RAW), 2.0)
    np.testing.assert_allclose(w, [[0.5, 2.0, 1.0, 1.0], [1.0, 2.0, 1.5, 0.8]], rtol=1e-6)
    np.testing.assert_array_equal(trunc, [[0, 1, 0, 0], [0, 1, 0, 0]])
    with pytest.raises(ValueError, match="cap"):
        L.truncated_is_weights(np.zeros(2), np.zeros(2), 0.0)


def test_policy_loss_tis_hand_and_gradient():
    # per-token PPO loss x w: -1.28*.5, -.5*2 | .8*1, 2.2*2, -2.4*1.5, 1.3*.8 -> sum 1.0 over 6 tokens
    f = lambda lp, sp: L.policy_loss(lp, OLD, ADV, MASK_P, agg_mode="token-mean", sampler_logp=sp,  # noqa: E731
                                     tis_cap=2.0, **CLIP)
    loss, aux = f(LOGP, SAMPLER)
    np.testing.assert_allclose(loss, 1.0 / 6, rtol=1e-5)
    np.testing.assert_allclose(aux["tis_weight_mean"], 7.8 / 6, rtol=1e-5)
    np.testing.assert_allclose(aux["tis_trunc_frac"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(aux["clip_frac"], 2 / 6, rtol=1e-6)  # clipping is unchanged
    g_lp, g_sp = jax.grad(lambda lp, sp: f(lp, sp)[0], argnums=(0, 1))(jnp.asarray(LOGP),
                                                                      jnp.asarray(SAMPLER))
    # the unweighted gradient -r A / 6 (0 where clipped) times w; no gradient reaches the weights
    want = np.array([[0.0, -0.5 * 2, 0.0, 0.0], [0.0, 2.2 * 2, -2.4 * 1.5, 1.3 * 0.8]]) / 6
    np.testing.assert_allclose(g_lp, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(g_sp, np.zeros_like(SAMPLER))
    # without tis_cap the sampler log-probs are ignored: the plain loss
    plain, _ = L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", sampler_logp=SAMPLER, **CLIP)
    np.testing.assert_allclose(plain, 0.12 / 6, atol=1e-6)
    with pytest.raises(ValueError, match="sampler_logp"):
        L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", tis_cap=2.0, **CLIP)


def test_policy_loss_bad_input():
    with pytest.raises(ValueError, match="ref_logp"):
        L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", kl_coef=0.1, **CLIP)
    with pytest.raises(ValueError, match="entropy_BxT"):
        L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", entropy_coef=0.1, **CLIP)
    with pytest.raises(ValueError, match="clip_low"):
        L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", clip_low=-0.1, clip_high=0.2)
    with pytest.raises(ValueError, match="policy_loss: kl_estimator must be one of"):
        L.policy_loss(LOGP, OLD, ADV, MASK_P, agg_mode="token-mean", ref_logp=OLD,
                      kl_estimator="k4", **CLIP)


def _np_policy_loss(logp, old, adv, mask, lo, hi, mode, norm_len):
    b, t = logp.shape
    per = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            r = np.exp(logp[i, j] - old[i, j])
            per[i, j] = -min(r * adv[i, j], np.clip(r, 1 - lo, 1 + hi) * adv[i, j])
    if mode == "token-mean":
        return (per * mask).sum() / mask.sum()
    rows = [i for i in range(b) if mask[i].sum() > 0]
    denom = {i: (mask[i].sum() if mode == "seq-mean-token-mean" else norm_len) for i in rows}
    return np.mean([(per[i] * mask[i]).sum() / denom[i] for i in rows])


@pytest.mark.parametrize("seed,mode", [(0, "token-mean"), (1, "seq-mean-token-mean"),
                                       (2, "seq-mean-token-sum-norm")])
def test_policy_loss_vs_numpy_reference(seed, mode):
    rng = np.random.default_rng(seed)
    b, t = 4, 7
    old = rng.normal(-2, 1, size=(b, t)).astype(np.float32)
    logp = (old + rng.normal(0, 0.3, size=(b, t))).astype(np.float32)
    adv = rng.normal(size=(b, t)).astype(np.float32)
    mask = (np.arange(t)[None] < np.array([[7], [3], [0], [5]])).astype(np.float32)
    loss, _ = L.policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, agg_mode=mode,
                            norm_len=9)
    want = _np_policy_loss(logp.astype(np.float64), old, adv, mask, 0.2, 0.3, mode, 9)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)


def test_policy_loss_jit_traced_coefficients_and_vmap():
    fn = jax.jit(lambda lp, kc, lo: L.policy_loss(lp, OLD, ADV, MASK_P, clip_low=lo, clip_high=0.28,
                                                  agg_mode="token-mean", kl_coef=kc,
                                                  ref_logp=OLD))
    loss, aux = fn(LOGP, 0.1, 0.2)
    np.testing.assert_allclose(loss, 0.02 + 0.1 * 0.7374885 / 6, rtol=1e-5)
    stacked = [np.stack([x, x]) for x in (LOGP, OLD, ADV, MASK_P)]
    vm = jax.vmap(lambda *a: L.policy_loss(*a, agg_mode="token-mean", **CLIP)[0])(*stacked)
    np.testing.assert_allclose(vm, [0.02, 0.02], atol=1e-6)


def test_policy_loss_check_grads_unclipped_region():
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        old = jnp.asarray(rng.normal(-2, 1, size=(3, 5)))
        logp = old + jnp.asarray(rng.uniform(-0.1, 0.1, size=(3, 5)))  # ratio in [.9, 1.1]
        adv, ref = jnp.asarray(rng.normal(size=(3, 5))), jnp.asarray(rng.normal(-2, 1, (3, 5)))
        mask = jnp.asarray(np.arange(5)[None] < np.array([[5], [2], [4]]))
        for mode in L.AGG_MODES:
            f = lambda lp: L.policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28,  # noqa
                                         agg_mode=mode, kl_coef=0.3, ref_logp=ref)[0]
            check_grads(jax.jit(f), (logp,), order=2, modes=("rev",))


# ----------------------------------------------------------------------------- KL, entropy
def test_kl_estimators_hand():
    logp, ref = jnp.array([0.0, -1.0]), jnp.array([-0.5, 0.0])  # logp - ref = [.5, -1]
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k1"), [0.5, -1.0], rtol=1e-6)
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k2"), [0.125, 0.5], rtol=1e-6)
    # k3 = e^x - x - 1 with x = ref - logp = [-.5, 1]: e^-.5 - .5, e - 2
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k3"), [0.10653066, 0.71828183], rtol=1e-6)
    assert float(jnp.min(L.kl_penalty(jnp.linspace(-30, 30, 61), jnp.zeros(61), "k3"))) >= 0.0
    assert np.all(np.isfinite(L.kl_penalty(jnp.array([-1e4]), jnp.array([0.0]), "k3")))


@pytest.mark.parametrize("estimator", L.SAMPLED_KL_ESTIMATORS)
def test_kl_check_grads(estimator):
    with jax.enable_x64(True):
        logp, ref = jnp.array([-0.3, -2.0, -1.0]), jnp.array([-0.5, -1.0, -1.7])
        check_grads(jax.jit(lambda a, b: L.kl_penalty(a, b, estimator)), (logp, ref), order=2)

def test_kl_estimators_as_losses_optimise_the_documented_divergence():
    """On samples of pi (exact expectation over a categorical policy), the gradient of the k2 loss is
    grad KL(pi || ref) and that of the k3 loss grad KL(ref || pi) (Tang & Munos 2025): the reason the toy
    presets use k2. k2's gradient differs from the forward KL's, k3's from the reverse KL's."""
    with jax.enable_x64(True):
        theta, ref_logits = jnp.array([1.5, -0.5, 0.2, -3.0]), jnp.array([0.0, 0.3, -0.4, 0.5])
        ref = jax.nn.log_softmax(ref_logits)

        def expected_loss_grad(estimator):
            pi = jax.nn.softmax(theta)  # the sampling distribution: not differentiated
            return jax.grad(lambda t: jnp.sum(pi * L.kl_penalty(jax.nn.log_softmax(t), ref, estimator)))(theta)

        reverse = jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - ref)))(theta)
        forward = jax.grad(lambda t: jnp.sum(jnp.exp(ref) * (ref - jax.nn.log_softmax(t))))(theta)
        np.testing.assert_allclose(expected_loss_grad("k2"), reverse, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(expected_loss_grad("k3"), forward, rtol=1e-10, atol=1e-12)
        assert float(jnp.max(jnp.abs(reverse - forward))) > 0.1



def test_exact_kl_hand_and_gradient_is_the_reverse_kl():
    """exact_kl = sum_v p_v log(p_v / q_v) over the last axis; 0 for equal distributions; its gradient in the
    policy's logits is grad KL(pi || ref), the same as the expected k2 loss's (previous test); finite where
    a logit is -inf (p = 0)."""
    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.25, 0.5])
    want = 0.5 * np.log(2.0) + 0.25 * np.log(0.5)  # 0.1732868
    np.testing.assert_allclose(L.exact_kl(jnp.log(jnp.asarray(p)), jnp.log(jnp.asarray(q))), want, rtol=1e-6)
    z = jnp.array([[0.3, -1.0, 2.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(L.exact_kl(z, z + 5.0), [0.0, 0.0], atol=1e-6)
    with jax.enable_x64(True):
        theta, ref_logits = jnp.array([1.5, -0.5, 0.2, -3.0]), jnp.array([0.0, 0.3, -0.4, 0.5])
        ref = jax.nn.log_softmax(ref_logits)
        reverse = jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - ref)))(theta)
        np.testing.assert_allclose(jax.grad(lambda t: L.exact_kl(t, ref_logits))(theta), reverse, rtol=1e-10)
    masked = jnp.array([0.0, -jnp.inf, 1.0])
    g = jax.grad(lambda t: L.exact_kl(t, jnp.zeros(3)))(masked)
    assert np.all(np.isfinite(g)) and float(g[1]) == 0.0


def test_exact_estimator_needs_its_array():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="kl_exact_BxT"):
        L.policy_loss(x, x, x, jnp.ones((1, 2)), clip_low=0.2, clip_high=0.2, agg_mode="token-mean", kl_coef=0.1,
                      ref_logp=x, kl_estimator="exact")
    with pytest.raises(ValueError, match="both models' logits"):
        L.kl_penalty(x, x, "exact")


def test_entropy_from_logits_hand():
    ln3 = np.log(3.0)
    h_13 = 0.25 * np.log(4.0) + 0.75 * np.log(4 / 3)  # p = [1/4, 3/4]: 0.5623351
    logits = jnp.array([[0.0, 0.0, 0.0, 0.0],
                        [0.0, -jnp.inf, ln3, -jnp.inf],
                        [1000.0, 1000.0, -1000.0, -jnp.inf]])
    np.testing.assert_allclose(L.entropy_from_logits(logits), [np.log(4), h_13, np.log(2)],
                               rtol=1e-6)
    np.testing.assert_allclose(h_13, 0.5623351, rtol=1e-6)
    grad = jax.grad(lambda z: jnp.sum(L.entropy_from_logits(z)))(logits)
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad[0], 0.0, atol=1e-7)  # uniform is a maximum
    out = L.entropy_from_logits(logits[:2].astype(jnp.bfloat16))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, [np.log(4), h_13], rtol=1e-2)


def test_entropy_check_grads():
    with jax.enable_x64(True):
        z = jnp.asarray(np.random.default_rng(6).normal(size=(2, 5)))
        check_grads(jax.jit(L.entropy_from_logits), (z,), order=2, modes=("rev",))


# ----------------------------------------------------------------------------- value loss
# eps = .1. tok0: V 1, Vold .8, R 2: clip(1) = .9, max(1, 1.21)/2 = .605 (clipped branch)
#           tok1: V 2, Vold 2.5, R 1: clip(2) = 2.4, max(1, 1.96)/2 = .98 (clipped branch)
#           tok2: V 3, Vold 2.5, R 1: clip(3) = 2.6, max(4, 2.56)/2 = 2.0
V = np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]], np.float32)
V_OLD = np.array([[0.8, 2.5, 2.5], [np.nan, np.nan, np.nan]], np.float32)
RET = np.array([[2.0, 1.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
MASK_V = np.array([[1, 1, 1], [0, 0, 0]])


def test_value_loss_hand():
    loss, aux = L.value_loss(V, V_OLD, RET, MASK_V, clip_eps=0.1)
    np.testing.assert_allclose(loss, (0.605 + 0.98 + 2.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(aux["vf_clip_frac"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(aux["vf_mse"], 2.0, rtol=1e-6)
    loss, _ = L.value_loss(V, V_OLD, RET, MASK_V, clip_eps=0.1, agg_mode="seq-mean-token-sum-norm",
                           norm_len=2)
    np.testing.assert_allclose(loss, (0.605 + 0.98 + 2.0) / 2, rtol=1e-6)
    with pytest.raises(ValueError, match="clip_eps"):
        L.value_loss(V, V_OLD, RET, MASK_V, clip_eps=-1.0)


def test_value_loss_gradient_and_check_grads():
    grad = jax.grad(lambda v: L.value_loss(v, V_OLD, RET, MASK_V, clip_eps=0.1)[0])(jnp.asarray(V))
    # clipped branch saturated on tok0/tok1 -> 0; tok2: (V - R) / 3 = 2/3; padding -> 0
    np.testing.assert_allclose(grad, [[0.0, 0.0, 2 / 3], [0.0, 0.0, 0.0]], atol=1e-6)
    with jax.enable_x64(True):
        v = jnp.array([[1.0, 2.0, 3.0, 0.3]])
        v_old, ret = jnp.array([[0.8, 2.5, 2.5, 0.25]]), jnp.array([[2.0, 1.0, 1.0, 0.0]])
        mask = jnp.ones((1, 4))
        f = jax.jit(lambda a, r: L.value_loss(a, v_old, r, mask, clip_eps=0.1)[0])
        check_grads(f, (v, ret), order=2, modes=("rev",))
