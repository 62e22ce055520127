"""Tests of jaxagent.eval.passk (unbiased pass@k, Pass@(K,T) modes, bootstrap) and jaxagent.eval.bounds."""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.eval import bounds, passk

N_MAX = 7


def brute_force_pass_at_k(n, c, k):
    """Share of all k-subsets of n samples (the first c successful) holding at least one success."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.fixture(scope="module")
def all_triples():
    triples = [(n, c, k) for n in range(1, N_MAX + 1) for c in range(n + 1) for k in range(1, n + 1)]
    return np.asarray(triples, np.int32)


def test_pass_at_k_matches_subset_enumeration(all_triples):
    got = np.asarray(jax.jit(passk.pass_at_k)(all_triples[:, 0], all_triples[:, 1], all_triples[:, 2]))
    want = np.asarray([brute_force_pass_at_k(*t) for t in all_triples.tolist()])
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_pass_at_k_edge_cases():
    n = 6
    assert float(passk.pass_at_k(n, 0, 3)) == 0.0  # c = 0
    assert float(passk.pass_at_k(n, n, 1)) == 1.0  # c = n
    assert float(passk.pass_at_k(n, 1, n)) == 1.0  # k = n, one success
    assert float(passk.pass_at_k(n, 0, n)) == 0.0  # k = n, no success
    assert float(passk.pass_at_k(n, 3, 4)) == 1.0  # n - c < k
    np.testing.assert_allclose(float(passk.pass_at_k(n, 2, 1)), 2 / 6, rtol=1e-6)  # pass@1 = c / n
    np.testing.assert_allclose(float(passk.pass_at_k(n, 2, 2)), 1 - math.comb(4, 2) / math.comb(6, 2), rtol=1e-6)
    assert np.isnan(float(passk.pass_at_k(n, 7, 1)))  # c > n
    assert np.isnan(float(passk.pass_at_k(n, 2, 7)))  # k > n
    # large n: the product form stays finite and matches the closed form
    np.testing.assert_allclose(float(passk.pass_at_k(500, 3, 50)), 1 - math.comb(497, 50) / math.comb(500, 50), rtol=1e-5)


def test_pass_at_k_vmaps_over_tasks():
    c = jnp.asarray([0, 1, 2, 5], jnp.int32)
    ks = jnp.asarray([1, 2, 5], jnp.int32)
    vm = jax.vmap(jax.vmap(passk.pass_at_k, in_axes=(None, 0, None)), in_axes=(None, None, 0))(5, c, ks)
    want = np.asarray([[brute_force_pass_at_k(5, int(ci), int(k)) for ci in c] for k in ks])
    np.testing.assert_allclose(np.asarray(vm), want, atol=2e-6)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="ks"):
        passk.pass_at_k_grid(np.zeros((2, 3, 4), bool), [1, 5])
    with pytest.raises(ValueError, match=r"pass_at_k_grid: success_UxPxZ must be .*\(rank 3\); got bool\[3, 4\]"):
        passk.pass_at_k_grid(np.zeros((3, 4), bool), [1])
    with pytest.raises(TypeError, match=r"pass_at_k_grid: success_UxPxZ must be a bool or integer .*; got float32"):
        passk.pass_at_k_grid(np.zeros((2, 3, 4), np.float32), [1])
    with pytest.raises(TypeError, match="pass_at_k: n must be an integer"):
        passk.pass_at_k(5.0, 1, 1)
    with pytest.raises(ValueError, match="alpha"):
        passk.bootstrap_ci(np.ones(4), jax.random.key(0), alpha=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        passk.bootstrap_ci(np.ones(4), jax.random.key(0), n_boot=0)
    with pytest.raises(ValueError, match="last axis"):
        passk.bootstrap_ci(np.float32(1.0), jax.random.key(0))
    with pytest.raises(ValueError, match="mask"):
        passk.bootstrap_ci(np.ones(4), jax.random.key(0), mask=np.ones(3))
    with pytest.raises(ValueError, match="p_star_UxP must hold probabilities"):
        bounds.pass_at_k_bound(np.full((2, 3), 1.5), [1])


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_monotone_in_k_and_in_t(seed):
    rng = np.random.default_rng(seed)
    turns = np.where(rng.random((5, 8)) < 0.6, rng.integers(1, 9, (5, 8)), -1).astype(np.int32)
    budgets = np.asarray([1, 2, 4, 6, 8], np.int32)
    ks = np.asarray([1, 2, 3, 5, 8], np.int32)
    grid_TxKxN = np.asarray(passk.pass_at_k_grid(passk.truncated_success(turns, budgets), ks))
    assert np.all(np.diff(grid_TxKxN, axis=1) >= -1e-6), "pass@k must not fall as K grows"
    assert np.all(np.diff(grid_TxKxN, axis=0) >= -1e-6), "truncated pass@k must not fall as T grows"
    # pass@1 is the plain success rate, pass@S is "any success"
    success = passk.truncated_success(turns, budgets)
    np.testing.assert_allclose(grid_TxKxN[:, 0], np.asarray(success).mean(-1), atol=1e-6)
    np.testing.assert_allclose(grid_TxKxN[:, -1], np.asarray(success).any(-1), atol=1e-6)


def _walk_turns(seed, goal, p_right, cap):
    """A budget-ignoring random walk on 0..goal (reflecting at 0): turns to reach goal within cap, else -1."""
    rng = np.random.default_rng(seed)
    pos = 0
    for turn in range(1, cap + 1):
        pos = pos + 1 if rng.random() < p_right else max(pos - 1, 0)
        if pos == goal:
            return turn
    return -1


def test_truncated_equals_announced_for_budget_ignoring_policy():
    n_tasks, n_samples, t_max = 4, 6, 12
    budgets = np.asarray([3, 6, 9, 12], np.int32)
    goals = np.asarray([2, 3, 5, 8])
    seed = lambda i, s: 1000 * i + s  # same trajectory whatever the budget: the policy ignores it
    announced = np.asarray([[[_walk_turns(seed(i, s), goals[i], 0.7, t) >= 0 for s in range(n_samples)]
                             for i in range(n_tasks)] for t in budgets])
    turns = np.asarray([[_walk_turns(seed(i, s), goals[i], 0.7, t_max) for s in range(n_samples)]
                        for i in range(n_tasks)], np.int32)
    truncated = passk.truncated_success(turns, budgets)
    np.testing.assert_array_equal(np.asarray(truncated), announced)
    ks = [1, 2, 4, 6]
    np.testing.assert_allclose(passk.pass_at_k_grid(truncated, ks), passk.pass_at_k_grid(announced, ks), atol=0)
    assert 0 < announced.mean() < 1  # the construction exercises both outcomes


def test_curves_are_slices_of_the_grid():
    rng = np.random.default_rng(0)
    success = rng.random((3, 5, 8)) < 0.4
    ks = [1, 2, 8]
    grid = np.asarray(passk.pass_at_k_grid(success, ks)).mean(-1)
    np.testing.assert_allclose(passk.pass_at_t_curve(success, 2), grid[:, 1], atol=1e-6)
    np.testing.assert_allclose(passk.pass_at_k_curve(success[2], ks), grid[2], atol=1e-6)


def test_valid_mask_changes_n():
    success = np.asarray([[1, 0, 1, 0]], bool)
    valid = np.asarray([[1, 1, 1, 0]], bool)
    got = passk.pass_at_k_per_task(success, [1, 2], valid)
    np.testing.assert_allclose(np.asarray(got)[:, 0], [2 / 3, 1.0], atol=1e-6)
    grid = passk.pass_at_k_grid(np.stack([success, success]), [1, 4], np.stack([valid, np.ones_like(valid)]))
    np.testing.assert_allclose(np.asarray(grid)[:, :, 0], [[2 / 3, np.nan], [0.5, 1.0]], atol=1e-6)  # k > n: NaN


def test_grid_jits_with_traced_ks():
    success = np.random.default_rng(2).random((2, 3, 6)) < 0.5
    ks = jnp.asarray([1, 3, 6], jnp.int32)
    jitted = jax.jit(passk.pass_at_k_grid)(success, ks)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(passk.pass_at_k_grid(success, ks)), atol=1e-7)


def test_bootstrap_ci():
    key = jax.random.key(3)
    values = (np.arange(400) % 2).astype(np.float32)  # mean 0.5, sd 0.5
    ci = passk.bootstrap_ci(values, key, n_boot=2000)
    assert float(ci.mean) == pytest.approx(0.5)
    half_width = (float(ci.hi) - float(ci.lo)) / 2
    assert 0.035 < half_width < 0.065  # normal approximation: 1.96 * 0.5 / 20 = 0.049
    again = passk.bootstrap_ci(values, key, n_boot=2000)
    assert float(again.lo) == float(ci.lo)  # deterministic in the key
    const = passk.bootstrap_ci(np.full((2, 4), 0.25), key, n_boot=200)
    np.testing.assert_allclose(np.asarray(const.lo), 0.25, atol=1e-7)
    np.testing.assert_allclose(np.asarray(const.hi), 0.25, atol=1e-7)
    masked = passk.bootstrap_ci(np.asarray([1.0, 3.0, np.nan, 100.0]), key, n_boot=200, mask=np.asarray([1, 1, 0, 0]))
    assert float(masked.mean) == pytest.approx(2.0)
    assert 1.0 <= float(masked.lo) <= float(masked.hi) <= 3.0
    assert np.isnan(float(passk.bootstrap_ci(np.ones(4), key, n_boot=200, mask=np.zeros(4)).mean))


# ---- bounds ----

def _reach_prob(p_right, goal, budgets):
    """Exact P(random walk on 0..goal, reflecting at 0, right w.p. p_right, reaches goal within T steps)."""
    dist = np.zeros(goal + 1)
    dist[0] = 1.0
    out, reached = [], 0.0
    for step in range(1, max(budgets) + 1):
        new = np.zeros_like(dist)
        new[1:] += p_right * dist[:-1]
        new[:-1] += (1 - p_right) * dist[1:]
        new[0] += (1 - p_right) * dist[0]
        reached += new[goal]
        new[goal] = 0.0
        dist = new
        if step in budgets:
            out.append(reached)
    return np.asarray(out)


def _expected_estimate(n, q, k):
    """Exact E[pass_at_k(n, C, k)] with C ~ Binomial(n, q): no Monte Carlo."""
    c = np.arange(n + 1, dtype=np.int32)
    pmf = np.asarray([math.comb(n, int(ci)) * q**ci * (1 - q) ** (n - ci) for ci in c])
    return float(np.sum(pmf * np.asarray(passk.pass_at_k(n, c, k))))


@settings(max_examples=20, deadline=None)
@given(goals=st.lists(st.integers(1, 6), min_size=3, max_size=3), p_right=st.floats(0.05, 0.95),
       seed=st.integers(0, 10_000))
def test_deterministic_bound_dominates_random_policies(goals, p_right, seed):
    budgets = np.asarray([1, 2, 4, 8], np.int32)
    ks = np.asarray([1, 2, 4, 6], np.int32)
    goals = np.asarray(goals, np.int32)
    turns = np.asarray([[_walk_turns(seed * 97 + 10 * i + s, g, p_right, 8) for s in range(6)]
                        for i, g in enumerate(goals)], np.int32)
    measured_TxK = np.asarray(passk.pass_at_k_grid(passk.truncated_success(turns, budgets), ks)).mean(-1)
    p_star = bounds.success_prob_from_min_turns(goals, budgets)  # shortest path = goal distance
    bound_TxK = np.asarray(bounds.pass_at_k_bound(p_star, ks))
    assert np.all(measured_TxK <= bound_TxK + 1e-6)
    optimal = np.where(np.ones((3, 6), bool), goals[:, None], -1).astype(np.int32)  # always-right policy
    tight_TxK = np.asarray(passk.pass_at_k_grid(passk.truncated_success(optimal, budgets), ks)).mean(-1)
    np.testing.assert_allclose(tight_TxK, bound_TxK, atol=1e-6)  # the bound is attained


@settings(max_examples=15, deadline=None)
@given(goal=st.integers(1, 5), slip=st.floats(0.0, 0.45), p_policy=st.floats(0.0, 1.0))
def test_slippery_bound_dominates_expected_pass_at_k(goal, slip, p_policy):
    budgets = [2, 4, 8]
    p_star = _reach_prob(1 - slip, goal, budgets)  # best policy: always push right
    p_right = slip + (1 - 2 * slip) * p_policy  # any stationary policy under slip
    q = _reach_prob(p_right, goal, budgets)
    bound_TxK = np.asarray(bounds.pass_at_k_bound(p_star[:, None], [1, 3, 6]))  # p* [U, P=1]
    n = 6
    for t in range(len(budgets)):
        for j, k in enumerate([1, 3, 6]):
            expected = _expected_estimate(n, q[t], k)
            assert expected == pytest.approx(1 - (1 - q[t]) ** k, abs=2e-5)  # the estimator is unbiased
            assert expected <= bound_TxK[t, j] + 2e-5


def test_bound_hand_values():
    p_star_UxP = np.asarray([[0.0, 1.0], [0.5, 1.0], [0.5, 0.0]])  # 3 tiers, 2 tasks
    got = np.asarray(bounds.pass_at_k_bound_per_task(p_star_UxP, [1, 2]))
    assert got.shape == (3, 2, 2)  # [U, J, P]
    np.testing.assert_allclose(got[1, :, 0], [0.5, 0.75])
    np.testing.assert_allclose(got[2, :, 1], [0.0, 0.0])
    np.testing.assert_allclose(bounds.pass_at_k_bound(p_star_UxP, [1, 2]),
                               [[0.5, 0.5], [0.75, 0.875], [0.25, 0.375]])
    ref = bounds.success_prob_from_min_turns(np.asarray([2, 5, -1]), np.asarray([1, 2, 5]))
    np.testing.assert_array_equal(np.asarray(ref), [[0, 0, 0], [1, 0, 0], [1, 1, 0]])  # [U, P]
