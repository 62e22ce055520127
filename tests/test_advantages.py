"""Tests for jaxagent.rl.advantages: hand-computed values, numpy loop references, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import advantages as A

# one compiled GiGPO for the whole file (eager dispatch of its many small ops is slow on 2 cores)
gigpo = jax.jit(A.gigpo_advantages, static_argnames=("mode", "eps", "ddof"))
R4 = np.array([1.0, 2.0, 3.0, 6.0], np.float32)  # mean 3, deviations [-2, -1, 0, 3], sum sq 14
D4 = np.array([-2.0, -1.0, 0.0, 3.0])


# ----------------------------------------------------------------------------- group estimators
def test_grpo_hand_sample_and_population_std():
    np.testing.assert_allclose(A.grpo_advantages(R4, eps=0.0), D4 * np.sqrt(3 / 14), rtol=1e-6)
    np.testing.assert_allclose(A.grpo_advantages(R4, eps=0.0, ddof=0), D4 * np.sqrt(4 / 14),
                               rtol=1e-6)
    # eps sits in the denominator next to std
    np.testing.assert_allclose(A.grpo_advantages(R4, eps=0.5), D4 / (np.sqrt(14 / 3) + 0.5),
                               rtol=1e-6)


def test_dr_grpo_and_rloo_hand():
    np.testing.assert_allclose(A.dr_grpo_advantages(R4), D4, rtol=1e-6)
    # RLOO: R_i - (sum - R_i)/3 with sum 12 -> 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
    np.testing.assert_allclose(A.rloo_advantages(R4), [-8 / 3, -4 / 3, 0.0, 4.0], rtol=1e-6)


def test_zero_variance_groups_give_exact_zero_and_mask():
    flat = np.full((5,), 0.1, np.float32)  # mean of 0.1s is not exactly 0.1 in f32
    for fn in (A.grpo_advantages, A.dr_grpo_advantages):
        assert np.all(np.asarray(fn(flat)) == 0.0)
    rewards = np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [0.5, 0.5, 0.5, 0.50001]])
    np.testing.assert_array_equal(A.batch_has_reward_variance(rewards), [False, True, False, True])
    np.testing.assert_array_equal(A.batch_has_reward_variance(rewards, atol=1e-3),
                                  [False, True, False, False])


def test_group_estimators_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        A.rloo_advantages(np.ones((1,)))
    with pytest.raises(ValueError, match="estimator"):
        A.batch_group_advantages(np.ones((2, 3)), "ppo")
    with pytest.raises(ValueError, match="ddof"):
        A.grpo_advantages(R4, ddof=2)
    with pytest.raises(ValueError, match=r"grpo_advantages: rewards_G must be .* \[G\] \(rank 1\); got float64\[2, 3"):
        A.grpo_advantages(np.ones((2, 3)))


@pytest.mark.parametrize("seed", [0, 1])
def test_batch_group_estimators_vs_numpy_loop(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(5, 6)).astype(np.float32)
    got = {e: np.asarray(A.batch_group_advantages(rewards, e)) for e in A.GROUP_ESTIMATORS}
    for b, r in enumerate(rewards.astype(np.float64)):
        g = len(r)
        np.testing.assert_allclose(got["grpo"][b], (r - r.mean()) / (r.std(ddof=1) + 1e-6),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["dr_grpo"][b], r - r.mean(), rtol=1e-5, atol=1e-6)
        loo = [r[i] - np.mean([r[j] for j in range(g) if j != i]) for i in range(g)]
        np.testing.assert_allclose(got["rloo"][b], loo, rtol=1e-5, atol=1e-6)


def test_group_estimators_jit():
    fn = jax.jit(A.batch_group_advantages, static_argnames="estimator")
    np.testing.assert_allclose(fn(R4[None], estimator="rloo")[0], [-8 / 3, -4 / 3, 0, 4], atol=1e-6)


# ----------------------------------------------------------------------------- GAE
# r = [1, 0, 2], V = [.5, 1, 1.5], bootstrap 2, gamma = lam = .5:
# delta = [1 + .5*1 - .5, 0 + .5*1.5 - 1, 2 + .5*2 - 1.5] = [1, -.25, 1.5]
# A_2 = 1.5, A_1 = -.25 + .25*1.5 = .125, A_0 = 1 + .25*.125 = 1.03125
GAE_KW = dict(gamma=0.5, lam=0.5)
ADV3 = [1.03125, 0.125, 1.5]


def test_gae_hand():
    adv, ret = A.gae(jnp.array([1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, 1.5]), jnp.ones(3),
                     jnp.array(2.0), **GAE_KW)
    np.testing.assert_allclose(adv, ADV3, rtol=1e-6)
    np.testing.assert_allclose(ret, [1.53125, 1.125, 3.0], rtol=1e-6)


def test_gae_trailing_padding_does_not_leak():
    adv, ret = A.gae(jnp.array([1.0, 0.0, 2.0, 7.0, 9.0]), jnp.array([0.5, 1.0, 1.5, 3.0, -4.0]),
                     jnp.array([1, 1, 1, 0, 0]), jnp.array(2.0), **GAE_KW)
    np.testing.assert_allclose(adv, ADV3 + [0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(ret, [1.53125, 1.125, 3.0, 0.0, 0.0], rtol=1e-6)


def test_gae_interleaved_mask_is_skipped():
    # token level: a masked observation token between turns 0 and 1 is transparent
    adv, _ = A.gae(jnp.array([1.0, 5.0, 0.0, 2.0]), jnp.array([0.5, 9.0, 1.0, 1.5]),
                   jnp.array([1, 0, 1, 1]), jnp.array(2.0), **GAE_KW)
    np.testing.assert_allclose(adv, [1.03125, 0.0, 0.125, 1.5], rtol=1e-6)


def test_gae_done_cuts_the_chain():
    # done after step 1: delta_1 = 0 - 1 = -1, A_1 = -1; A_0 = 1 + .25*(-1) = .75
    adv, _ = A.gae(jnp.array([1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, 1.5]), jnp.ones(3),
                   jnp.array(2.0), dones_N=jnp.array([0, 1, 0]), **GAE_KW)
    np.testing.assert_allclose(adv, [0.75, -1.0, 1.5], rtol=1e-6)


def _np_discounted(r, m, gamma, bootstrap=0.0):
    out, run = np.zeros(len(r)), bootstrap
    for t in reversed(range(len(r))):
        if m[t]:
            run = r[t] + gamma * run
            out[t] = run
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_lambda_limits_and_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    n, gamma, lam = 7, 0.9, 0.8
    r, v = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    m = (np.arange(n) < rng.integers(1, n + 1)).astype(np.float32)
    boot = np.float32(rng.normal())
    # lambda = 1: discounted returns (with bootstrap) minus values
    adv1, ret1 = A.gae(r, v, m, boot, gamma=gamma, lam=1.0)
    np.testing.assert_allclose(adv1, (_np_discounted(r, m, gamma, boot) - v) * m, atol=1e-5)
    np.testing.assert_allclose(ret1, _np_discounted(r, m, gamma, boot), atol=1e-5)
    # lambda = 0: one-step TD errors, next value = V_{t+1} or the bootstrap after the last step
    adv0, _ = A.gae(r, v, m, boot, gamma=gamma, lam=0.0)
    length = int(m.sum())
    v_next = np.append(v[1:length], boot)
    np.testing.assert_allclose(adv0[:length], r[:length] + gamma * v_next - v[:length], atol=1e-5)
    assert np.all(np.asarray(adv0)[length:] == 0)
    # general lambda vs the textbook sum A_t = sum_l (gamma lam)^l delta_{t+l}
    delta = r[:length] + gamma * v_next - v[:length]
    ref = [sum((gamma * lam) ** k * delta[t + k] for k in range(length - t)) for t in range(length)]
    adv, _ = A.gae(r, v, m, boot, gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv[:length], ref, atol=1e-5)


def test_batch_gae_jit_matches_single():
    rng = np.random.default_rng(3)
    r, v = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    m = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    boot = rng.normal(size=3)
    fn = jax.jit(lambda *a: A.batch_gae(*a, gamma=0.9, lam=0.7))
    adv, ret = fn(r, v, m, boot)
    for b in range(3):
        a1, r1 = A.gae(r[b], v[b], m[b], boot[b], gamma=0.9, lam=0.7)
        np.testing.assert_allclose(adv[b], a1, atol=1e-6)
        np.testing.assert_allclose(ret[b], r1, atol=1e-6)
    assert np.all(np.asarray(adv[2]) == 0)


def test_gae_bad_gamma():
    with pytest.raises(ValueError, match="gamma"):
        A.gae(jnp.ones(2), jnp.ones(2), jnp.ones(2), jnp.array(0.0), gamma=1.5, lam=0.9)


def test_discounted_returns_hand():
    got = A.discounted_returns(jnp.array([0.0, 1.0, 1.0, 4.0]), jnp.array([1, 1, 1, 0]), gamma=0.5)
    np.testing.assert_allclose(got, [0.75, 1.5, 1.0, 0.0], rtol=1e-6)


# ----------------------------------------------------------------------------- GiGPO
# Group of G=3, N=3, gamma=.5. Trajectory 1 has length 2; its padded step has anchor 10 and
# reward 100 and must be ignored. Anchor 20 repeats inside trajectory 2.
GI_R = np.array([1.0, 0.0, 1.0], np.float32)
GI_r = np.array([[0, 0, 1], [0, 0, 100], [0, 1, 1]], np.float32)
GI_m = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], np.int32)
GI_a = np.array([[10, 20, 30], [10, 40, 10], [10, 20, 20]], np.int32)
# step returns: [.25, .5, 1], [0, 0, -], [.75, 1.5, 1]
# anchor 10: {.25, 0, .75} mean 1/3; anchor 20: {.5, 1.5, 1} mean 1; 30 and 40 singletons.
# A_E ('mean') = R - 2/3 = [1/3, -2/3, 1/3]


def test_gigpo_hand_mean():
    got = gigpo(GI_R, GI_r, GI_m, GI_a, gamma=0.5, mode="mean")
    want = [[1 / 3 - 1 / 12, 1 / 3 - 1 / 2, 1 / 3],
            [-2 / 3 - 1 / 3, -2 / 3, 0.0],
            [1 / 3 + 5 / 12, 1 / 3 + 1 / 2, 1 / 3]]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_gigpo_hand_mean_std_sample():
    got = gigpo(GI_R, GI_r, GI_m, GI_a, gamma=0.5, omega=0.5, mode="mean_std", eps=0.0)
    a_e = np.array([1, -2, 1]) * np.sqrt(3) / 3  # deviations [1/3,-2/3,1/3], sample var 1/3
    s10 = np.array([-1 / 12, -1 / 3, 5 / 12]) / np.sqrt(7 / 48)  # sum sq 42/144, /2 -> 7/48
    s20 = np.array([-1.0, 1.0, 0.0])  # deviations [-.5, .5, 0], sample var .25
    want = [[a_e[0] + 0.5 * s10[0], a_e[0] + 0.5 * s20[0], a_e[0]],
            [a_e[1] + 0.5 * s10[1], a_e[1], 0.0],
            [a_e[2] + 0.5 * s10[2], a_e[2] + 0.5 * s20[1], a_e[2] + 0.5 * s20[2]]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["mean_std", "mean"])
def test_gigpo_distinct_anchors_reduce_to_grpo(mode):
    rng = np.random.default_rng(4)
    g, n = 6, 5
    ret = rng.normal(size=g).astype(np.float32)
    r = rng.normal(size=(g, n)).astype(np.float32)
    m = (np.arange(n)[None] < rng.integers(1, n + 1, size=(g, 1))).astype(np.int32)
    anchors = rng.permutation(10_000)[: g * n].reshape(g, n).astype(np.int32) * 7919 - 2**30
    got = gigpo(ret, r, m, anchors, mode=mode)
    ep = A.grpo_advantages(ret) if mode == "mean_std" else A.dr_grpo_advantages(ret)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ep)[:, None] * m)


def _np_gigpo(ret, r, m, anchors, gamma, omega, mode, eps, ddof):
    def norm(x):
        x = np.asarray(x, np.float64)
        if len(x) == 1 or np.all(x == x[0]):
            return np.zeros_like(x)
        d = x - x.mean()
        return d / (x.std(ddof=ddof) + eps) if mode == "mean_std" else d

    g, n = r.shape
    step_ret = np.stack([_np_discounted(r[i], m[i], gamma) for i in range(g)])
    groups = {}
    for i in range(g):
        for t in range(n):
            if m[i, t]:
                groups.setdefault(int(anchors[i, t]), []).append((i, t))
    step_adv = np.zeros((g, n))
    for members in groups.values():
        for (i, t), a in zip(members, norm([step_ret[i, t] for i, t in members])):
            step_adv[i, t] = a
    return (norm(ret)[:, None] + omega * step_adv) * m


@pytest.mark.parametrize("seed,mode,ddof", [(0, "mean_std", 1), (1, "mean", 1), (2, "mean_std", 0),
                                            (3, "mean_std", 1)])
def test_gigpo_vs_numpy_loop(seed, mode, ddof):
    rng = np.random.default_rng(seed)
    g, n = 5, 6
    ret = rng.integers(0, 2, size=g).astype(np.float32)
    r = rng.normal(size=(g, n)).astype(np.float32)
    m = (np.arange(n)[None] < rng.integers(1, n + 1, size=(g, 1))).astype(np.int32)
    anchors = rng.integers(0, 5, size=(g, n)).astype(np.int32)  # many repeats and some singletons
    got = gigpo(ret, r, m, anchors, gamma=0.9, omega=0.7, mode=mode, ddof=ddof)
    want = _np_gigpo(ret, r, m, anchors, 0.9, 0.7, mode, 1e-6, ddof)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_batch_gigpo_jit_keeps_groups_apart():
    ret = np.stack([GI_R, GI_R[::-1]])
    r, m, a = (np.stack([x, x[::-1]]) for x in (GI_r, GI_m, GI_a))
    fn = jax.jit(lambda *x: A.batch_gigpo_advantages(*x, gamma=0.5, mode="mean"))
    got = fn(ret, r, m, a)
    for b in range(2):
        want = gigpo(ret[b], r[b], m[b], a[b], gamma=0.5, mode="mean")
        np.testing.assert_allclose(got[b], want, atol=1e-6)


def test_gigpo_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        A.gigpo_advantages(GI_R, GI_r, GI_m, GI_a, mode="std")


# ----------------------------------------------------------------------------- process reward
def test_process_advantages_hand():
    got = A.process_advantages(np.array([1.0, 0.0]), np.array([[0.0, -0.5], [-0.25, 3.0]]),
                               np.array([[1, 1], [1, 0]]), weight=2.0, mode="mean")
    # A_E = [.5, -.5]; + 2 * proc; masked step -> 0
    np.testing.assert_allclose(got, [[0.5, -0.5], [-1.0, 0.0]], rtol=1e-6)
    got = A.process_advantages(np.array([1.0, 0.0]), np.zeros((2, 2)), np.ones((2, 2)), eps=0.0)
    np.testing.assert_allclose(got, np.array([[1, 1], [-1, -1]]) / np.sqrt(2), rtol=1e-6)


def test_process_shaped_rewards_hand():
    got = A.process_shaped_rewards(jnp.array([0.0, -0.5, 0.3]), jnp.array([1, 1, 0]),
                                   jnp.array(1.0), weight=0.5)
    np.testing.assert_allclose(got, [0.0, 0.75, 0.0], rtol=1e-6)
    empty = A.process_shaped_rewards(jnp.array([0.2, 0.3]), jnp.array([0, 0]), jnp.array(1.0))
    np.testing.assert_array_equal(empty, [0.0, 0.0])


# ----------------------------------------------------------------------------- onto tokens
def test_broadcast_to_tokens_hand():
    turn = jnp.array([-1, -1, 0, 0, -1, 1, 1, 2, 5], jnp.int32)
    mask = jnp.array([0, 0, 1, 1, 0, 1, 0, 1, 1])
    got = A.broadcast_to_tokens(jnp.array([1.0, 2.0, 3.0]), turn, mask)
    np.testing.assert_array_equal(got, [0, 0, 1, 1, 0, 2, 0, 3, 0])
    got = A.broadcast_to_tokens(jnp.array(-0.5), turn, mask)
    np.testing.assert_array_equal(got, [0, 0, -0.5, -0.5, 0, -0.5, 0, -0.5, -0.5])
    with pytest.raises(ValueError, match="per-turn"):
        A.broadcast_to_tokens(jnp.ones((2, 2)), turn, mask)


def test_batch_broadcast_to_tokens_jit():
    adv = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    turn = jnp.array([[0, -1, 1], [1, 1, 0]], jnp.int32)
    mask = jnp.array([[1, 0, 1], [1, 0, 1]])
    got = jax.jit(A.batch_broadcast_to_tokens)(adv, turn, mask)
    np.testing.assert_array_equal(got, [[1, 0, 2], [4, 0, 3]])
