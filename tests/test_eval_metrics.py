"""Tests of jaxagent.eval.{costs, step_quality, likelihood, dynamics} against hand-computed numbers."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.eval import costs, dynamics, likelihood, step_quality
from jaxagent.rollout import types

# ---- costs ----


def test_cost_summary_hand_example():
    S, F, B, C = types.SUCCESS, types.FAILED, types.BUDGET_EXHAUSTED, types.CONTEXT_EXHAUSTED
    status = np.asarray([S, S, F, B, C, S], np.int32)
    turns = np.asarray([2, 3, 5, 5, 4, 1])
    tokens = np.asarray([20, 30, 50, 60, 90, 10])
    calls = np.asarray([2, 3, 4, 5, 4, 1])
    out = costs.cost_summary(status, turns, tokens, calls)
    assert float(out["success_rate"]) == pytest.approx(0.5)
    assert float(out["truncation_rate"]) == pytest.approx(1 / 6)
    assert float(out["context_exhausted_rate"]) == pytest.approx(1 / 6)
    assert float(out["mean_turns"]) == pytest.approx(20 / 6)
    assert float(out["turns_per_success"]) == pytest.approx(20 / 3)
    assert float(out["gen_tokens_per_success"]) == pytest.approx(260 / 3)
    assert float(out["mean_env_calls"]) == pytest.approx(19 / 6)
    np.testing.assert_array_equal(np.asarray(out["status_counts"]), [0, 3, 1, 1, 1])
    masked = costs.cost_summary(status, turns, tokens, calls, mask=np.asarray([1, 1, 1, 1, 0, 0]))
    assert float(masked["success_rate"]) == pytest.approx(0.5)
    assert float(masked["mean_gen_tokens"]) == pytest.approx(160 / 4)


def test_cost_curves_and_edge_cases():
    status_TxB = np.asarray([[types.FAILED, types.BUDGET_EXHAUSTED], [types.SUCCESS, types.BUDGET_EXHAUSTED]], np.int32)
    ones = np.ones((2, 2), np.int32)
    out = jax.jit(costs.cost_curves)(status_TxB, ones * 3, ones * 7, ones)
    assert np.isnan(float(out["turns_per_success"][0]))  # no success at the first tier
    assert float(out["turns_per_success"][1]) == pytest.approx(6.0)
    np.testing.assert_allclose(np.asarray(out["truncation_rate"]), [0.5, 0.5])
    np.testing.assert_array_equal(np.asarray(costs.status_histogram(np.asarray([0, 9, -1, 4]))), [1, 0, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(costs.turns_to_success(np.asarray([1, 2, 1]), np.asarray([3, 4, 5]))), [3, -1, 5])
    assert types.STATUS_NAMES[types.BUDGET_EXHAUSTED] == "budget_exhausted" and len(types.STATUS_NAMES) == costs.N_STATUS
    with pytest.raises(ValueError, match="same shape"):
        costs.cost_summary(np.zeros(3, np.int32), np.zeros(4), np.zeros(3), np.zeros(3))


# ---- step quality ----


@pytest.fixture(scope="module")
def q_table():
    rng = np.random.default_rng(0)
    return rng.random((12, 4)).astype(np.float32)  # Q*(s, a) of 12 states x 4 actions


def test_optimal_policy_beats_suboptimal_base_everywhere(q_table):
    rng = np.random.default_rng(1)
    best_a = q_table.argmax(1)
    base_actions = rng.integers(0, 4, (12, 16))
    base_actions[:3] = best_a[:3, None]  # on 3 states base is optimal too
    q_base = np.take_along_axis(q_table, base_actions, 1)
    q_rl = np.repeat(q_table.max(1, keepdims=True), 16, 1)
    valid = np.ones((12, 16), bool)
    out = step_quality.step_quality(q_base, valid, q_rl, valid)
    base_suboptimal = q_base.mean(1) < q_table.max(1)
    assert base_suboptimal.sum() == 9
    assert float(out["share_rl_better"]) == pytest.approx(9 / 12)
    assert float(out["share_equal"]) == pytest.approx(3 / 12)
    assert float(out["share_rl_worse"]) == 0.0
    sub = step_quality.step_quality(q_base, valid, q_rl, valid, state_mask_I=base_suboptimal)
    assert float(sub["share_rl_better"]) == 1.0  # 100% of states where base is suboptimal
    assert float(out["mean_q_rl"]) == pytest.approx(q_table.max(1).mean(), rel=1e-6)
    assert float(out["mean_q_base"]) == pytest.approx(q_base.mean(), rel=1e-6)


def test_identical_policies_tie_everywhere(q_table):
    q = np.repeat(q_table[:, :1], 5, 1)
    valid = np.ones_like(q, bool)
    out = jax.jit(step_quality.step_quality)(q, valid, q, valid)
    assert float(out["share_equal"]) == 1.0
    assert float(out["share_rl_better"]) == 0.0 and float(out["share_rl_worse"]) == 0.0
    assert float(out["mean_q_base"]) == float(out["mean_q_rl"])


def test_invalid_reply_is_scored_as_invalid_not_as_staying_put():
    """A policy whose replies are all invalid gets the worst value (0) at every state, exactly and sampled,
    even where staying put would have kept a positive gamma V* (a collapsed seed)."""
    q = np.asarray([[0.9, 0.5, 0.7, 0.6], [0.2, 0.0, 0.1, 0.0]], np.float32)
    collapsed = np.asarray([[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 1.0]], np.float32)
    mixed = np.asarray([[0.5, 0, 0, 0, 0.5], [0, 0, 1.0, 0, 0]], np.float32)
    draws = np.asarray([[4, 4, 0], [2, 2, 2]])
    out = step_quality.score_outcomes(collapsed, q, draws)
    np.testing.assert_array_equal(np.asarray(out["exact"]), [0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(out["invalid_mass"]), [1.0, 1.0])
    good = step_quality.score_outcomes(mixed, q, draws)
    np.testing.assert_allclose(np.asarray(good["exact"]), [0.45, 0.1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(good["sampled"]), [[0.0, 0.0, 0.9], [0.1, 0.1, 0.1]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(good["invalid_share"]), [2 / 3, 0.0], rtol=1e-6)
    assert step_quality.INVALID_VALUE == 0.0 and q.min() >= step_quality.INVALID_VALUE
    custom = step_quality.score_outcomes(mixed, q, draws, invalid_value=-1.0)
    np.testing.assert_allclose(np.asarray(custom["exact"]), [-0.05, 0.1], rtol=1e-5)
    with pytest.raises(ValueError, match="actions then 'invalid'"):
        step_quality.score_outcomes(mixed[:, :4], q, draws)
    with pytest.raises(ValueError, match="rows"):
        step_quality.score_outcomes(mixed, q, draws[:1])


def test_masks_and_tolerance():
    q_base = np.asarray([[0.5, 0.5, np.nan], [0.2, 0.4, 0.0]], np.float32)
    valid_base = np.asarray([[1, 1, 0], [1, 1, 0]], bool)
    q_rl = np.asarray([[0.51, 99.0, 0.51], [0.0, 0.0, 0.0]], np.float32)
    valid_rl = np.asarray([[1, 0, 1], [0, 0, 0]], bool)  # state 1: RL has no valid action -> unused
    exact = step_quality.step_quality(q_base, valid_base, q_rl, valid_rl)
    assert float(exact["n_states"]) == 1 and float(exact["share_rl_better"]) == 1.0
    assert float(exact["mean_q_rl"]) == pytest.approx(0.51)
    loose = step_quality.step_quality(q_base, valid_base, q_rl, valid_rl, tol=0.02)
    assert float(loose["share_equal"]) == 1.0
    with pytest.raises(ValueError, match="number of states"):
        step_quality.step_quality(q_base, valid_base, q_rl[:1], valid_rl[:1])
    with pytest.raises(ValueError, match="n_bins"):
        step_quality.step_quality_by_depth(q_base, valid_base, q_rl, valid_rl, np.zeros(2), n_bins=0)


def test_by_depth_hand_example():
    q_base = np.asarray([[0.5], [0.5], [0.2], [0.1]], np.float32)
    q_rl = np.asarray([[0.4], [0.5], [0.3], [0.9]], np.float32)
    valid = np.ones((4, 1), bool)
    depth = np.asarray([0.1, 0.3, 0.6, 1.0])  # bins of 5: 0, 1, 3, 4; bin 2 empty
    out = step_quality.step_quality_by_depth(q_base, valid, q_rl, valid, depth, n_bins=5)
    np.testing.assert_allclose(np.asarray(out["n_states"]), [1, 1, 0, 1, 1])
    np.testing.assert_allclose(np.asarray(out["share_rl_worse"])[[0, 1, 3, 4]], [1, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(out["share_equal"])[[0, 1, 3, 4]], [0, 1, 0, 0])
    np.testing.assert_allclose(np.asarray(out["mean_q_rl"])[[0, 1, 3, 4]], [0.4, 0.5, 0.3, 0.9], rtol=1e-6)
    assert np.isnan(np.asarray(out["share_rl_better"])[2])
    two = step_quality.step_quality_by_depth(q_base, valid, q_rl, valid, depth, n_bins=2)
    np.testing.assert_allclose(np.asarray(two["share_rl_better"]), [0.0, 1.0])
    np.testing.assert_allclose(np.asarray(two["bin_edges"]), [0.0, 0.5, 1.0])


def test_choose_error_action():
    choose = step_quality.choose_error_action
    assert int(choose(np.asarray([0.5, 0.9, 0.2, 0.9]), np.asarray([1, 1, 0, 1], bool))) == 0  # worst non-terminating
    assert int(choose(np.asarray([0.3, 0.3, 0.3, 0.3]), np.ones(4, bool))) == -1  # nothing below the best
    assert int(choose(np.asarray([1.0, 0.3, 0.3, 0.1]), np.asarray([0, 1, 1, 0], bool))) == 1  # best is terminating
    assert int(choose(np.asarray([0.9, 0.1, 0.8, 0.0]), np.asarray([1, 0, 1, 0], bool))) == 2
    assert int(choose(np.asarray([0.9, 0.1]), np.asarray([1, 1], bool), np.asarray([1, 0], bool))) == -1  # invalid action
    assert int(choose(np.asarray([0.9, 0.89, 0.5]), np.ones(3, bool), tol=0.05)) == 2  # 0.89 is within tol of best
    q_SxA = jnp.asarray([[0.5, 0.9, 0.2, 0.9], [0.3, 0.3, 0.3, 0.3]])
    got = jax.jit(jax.vmap(choose))(q_SxA, jnp.ones((2, 4), bool))
    np.testing.assert_array_equal(np.asarray(got), [2, -1])


def test_error_state_metrics():
    q_base = np.asarray([[0.1], [0.5], [0.5], [0.9]], np.float32)
    q_rl = np.asarray([[0.2], [0.5], [0.7], [0.1]], np.float32)
    valid = np.ones((4, 1), bool)
    succ_rl = np.asarray([[1, 1], [1, 0], [1, 1], [0, 0]], np.float32)
    succ_base = np.asarray([[0, 0], [1, 0], [0, 1], [0, 0]], np.float32)
    out = step_quality.error_state_metrics(q_base, valid, q_rl, valid, succ_base, succ_rl, jax.random.key(0), n_boot=200)
    assert float(out["share_rl_better"].mean) == pytest.approx(0.5)
    assert float(out["share_rl_worse"].mean) == pytest.approx(0.25)
    assert float(out["success_rl"].mean) == pytest.approx(5 / 8)
    assert float(out["success_base"].mean) == pytest.approx(2 / 8)
    assert float(out["success_diff"].mean) == pytest.approx(3 / 8)
    for ci in out.values():
        assert float(ci.lo) <= float(ci.mean) <= float(ci.hi)
    assert float(out["success_diff"].lo) >= -0.5 and float(out["success_diff"].hi) <= 1.0


# ---- likelihood ----


def _layout(rng, b, t, n_turns):
    """Turn ids like a rollout: prompt (-1), then per turn an action segment and an observation (-1)."""
    ids = np.full((b, t), -1, np.int32)
    for row in range(b):
        pos = int(rng.integers(1, 4))
        for turn in range(int(rng.integers(1, n_turns + 1))):
            length = int(rng.integers(1, 4))
            ids[row, pos:pos + length] = turn
            pos += length + int(rng.integers(0, 3))
            if pos >= t:
                break
    return ids


@pytest.fixture(scope="module")
def token_batch():
    rng = np.random.default_rng(7)
    ids = _layout(rng, 5, 30, 4)
    logp_base = np.log(rng.random((5, 30))).astype(np.float32)
    logp_rl = np.log(rng.random((5, 30))).astype(np.float32)
    return ids, logp_base, logp_rl


def test_action_nll_matches_numpy_loop(token_batch):
    ids, logp, _ = token_batch
    out = likelihood.action_nll(logp, ids, n_turns=4)
    want = np.zeros((5, 4))
    present = np.zeros((5, 4), bool)
    for b in range(5):
        for t in range(30):
            if ids[b, t] >= 0:
                want[b, ids[b, t]] -= logp[b, t]
                present[b, ids[b, t]] = True
    np.testing.assert_allclose(np.asarray(out["nll"]), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out["action_mask"]), present)
    assert float(out["mean_nll"]) == pytest.approx(want[present].mean(), rel=1e-5)
    with pytest.raises(ValueError, match="n_turns"):
        likelihood.action_nll(logp, ids, n_turns=2)


def test_llr_matches_numpy_loop_and_is_zero_against_itself(token_batch):
    ids, logp_base, logp_rl = token_batch
    llr = np.asarray(jax.jit(likelihood.cumulative_llr)(logp_rl, logp_base, ids))
    want = [sum(logp_rl[b, t] - logp_base[b, t] for t in range(30) if ids[b, t] >= 0) for b in range(5)]
    np.testing.assert_allclose(llr, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(likelihood.cumulative_llr(logp_rl, logp_rl, ids)), np.zeros(5))
    np.testing.assert_array_equal(np.asarray(likelihood.policy_token_counts(ids)), (ids >= 0).sum(1))
    rollout_turn_index = np.asarray([[-1, 0, 0, 0, 1, 1]])  # system prefix, then turn 0 obs+action, turn 1 ...
    rollout_policy = np.asarray([[0, 0, 1, 1, 0, 1]], bool)
    np.testing.assert_array_equal(np.asarray(likelihood.policy_turn_ids(rollout_turn_index, rollout_policy)),
                                  [[-1, -1, 0, 0, -1, 1]])


def test_length_matching_hand_example():
    #              rl0  rl1  rl2  rl3  rl4
    task_rl = np.asarray([0, 0, 1, 1, 2])
    succ_rl = np.asarray([1, 1, 1, 1, 0], bool)
    ntok_rl = np.asarray([100, 95, 50, 200, 100])
    #              b0   b1   b2   b3   b4
    task_base = np.asarray([0, 0, 1, 1, 2])
    succ_base = np.asarray([1, 1, 1, 0, 1], bool)
    ntok_base = np.asarray([90, 89, 54, 200, 100])
    out = likelihood.length_matched_pairs(task_rl, succ_rl, ntok_rl, task_base, succ_base, ntok_base)
    want_cand = np.zeros((5, 5), bool)
    want_cand[0, 0] = True  # 100 vs 90: gap 10 <= 10% of 100; 100 vs 89 is not
    want_cand[1, 0] = want_cand[1, 1] = True  # 95 vs 90 and 95 vs 89 (gap 6 <= 9.5)
    want_cand[2, 2] = True  # 50 vs 54: gap 4 <= 5.4; rl3 vs b3 fails (b3 unsuccessful); rl4 unsuccessful
    np.testing.assert_array_equal(np.asarray(out["candidates"]), want_cand)
    np.testing.assert_array_equal(np.asarray(out["match"]), [0, 1, 2, -1, -1])  # rl1 cannot reuse b0
    assert int(out["n_pairs"]) == 3 and int(out["n_tasks"]) == 2
    assert np.asarray(out["pair_mask"]).sum() == 3 and np.asarray(out["pair_mask"])[1, 1]
    diff = likelihood.matched_difference(np.asarray([10.0, 20.0, 30.0, 99.0, 99.0]), np.asarray([1.0, 2.0, 3.0, 4.0, 5.0]),
                                         out["match"], jax.random.key(1), n_boot=200)
    assert float(diff.mean) == pytest.approx((9 + 18 + 27) / 3)
    assert 9.0 <= float(diff.lo) <= float(diff.hi) <= 27.0


def test_greedy_matching_prefers_closest_length():
    out = likelihood.length_matched_pairs(np.zeros(1, np.int32), np.ones(1, bool), np.asarray([100]),
                                          np.zeros(3, np.int32), np.ones(3, bool), np.asarray([92, 99, 105]))
    assert int(out["match"][0]) == 1


# ---- dynamics ----


def test_r_multi_optimal_mass_and_optimal_mask():
    assert float(dynamics.r_multi(np.asarray([1, 0, 1, 1]))) == pytest.approx(0.75)
    assert float(dynamics.r_multi(np.asarray([1, 0, 1, 1]), np.asarray([1, 1, 0, 0]))) == pytest.approx(0.5)
    q = np.asarray([[0.1, 0.9, 0.9, 0.2], [0.5, 0.4, 0.3, 0.2]])
    optimal = dynamics.optimal_action_mask(q)
    np.testing.assert_array_equal(np.asarray(optimal), [[0, 1, 1, 0], [1, 0, 0, 0]])
    probs = np.asarray([[0.25, 0.25, 0.25, 0.25], [0.1, 0.6, 0.2, 0.1]])
    assert float(dynamics.optimal_action_mass(probs, optimal)) == pytest.approx((0.5 + 0.1) / 2)
    assert float(jax.jit(dynamics.optimal_action_mass)(probs, optimal, np.asarray([1.0, 0.0]))) == pytest.approx(0.5)


def test_dynamics_log_roundtrip(tmp_path):
    log = dynamics.DynamicsLog(tmp_path / "sub" / "dynamics.jsonl")
    assert log.read() == []
    for step, (rm, rs) in enumerate([(0.2, 0.6), (0.35, 0.55), (0.531, 0.503)]):
        log.append(step * 10, jnp.float32(rm), rs)
    records = log.read()
    assert [r["step"] for r in records] == [0, 10, 20]
    assert json.loads((tmp_path / "sub" / "dynamics.jsonl").read_text().splitlines()[1])["r_multi"] == pytest.approx(0.35)
    arrays = log.arrays()
    deltas = dynamics.dynamics_deltas(arrays["r_multi"], arrays["r_single"])
    assert float(deltas["r_multi_delta"]) == pytest.approx(0.331, abs=1e-6)
    assert float(deltas["r_single_delta"]) == pytest.approx(-0.097, abs=1e-6)
    with pytest.raises(ValueError, match="finite"):
        log.append(30, float("nan"), 0.5)
