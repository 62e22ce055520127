"""Tests for jaxagent.envs.jax.frozenlake_solver against gymnasium 1.4's FrozenLakeEnv and hand values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS, FrozenLakeEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.jax import frozenlake_solver as fls

CODE = {"F": fls.FROZEN, "H": fls.HOLE, "S": fls.START, "G": fls.GOAL}
HORIZON = 8
_mdp = jax.jit(fls.mdp_from_map)
_q_star = jax.jit(fls.q_star, static_argnames="horizon")
_q_star_at = jax.jit(fls.q_star_at)
_within = jax.jit(fls.success_prob_within, static_argnames="horizon")
_shortest = jax.jit(fls.shortest_path_length)


def to_map(desc):
    return jnp.asarray([[CODE[c] for c in row] for row in desc], jnp.int8)


def gym_P(desc, success_rate):
    """Dense P[s, a, s'] and the transition list of gymnasium (is_slippery=False for rate 1)."""
    env = FrozenLakeEnv(desc=desc, is_slippery=success_rate < 1.0, success_rate=success_rate)
    n = env.observation_space.n
    P = np.zeros((n, 4, n))
    for s in range(n):
        for a in range(4):
            for p, s2, _, _ in env.P[s][a]:
                P[s, a, s2] += p
    return P, env.P


def gym_value_iteration(P_list, n, horizon, gamma):
    """Independent numpy finite-horizon DP over gymnasium's (p, s', r, terminated) lists."""
    Q = np.zeros((horizon + 1, n, 4))
    for h in range(horizon):
        V = Q[h].max(-1)
        for s in range(n):
            for a in range(4):
                Q[h + 1, s, a] = sum(p * (r + (0.0 if term else gamma * V[s2]))
                                     for p, s2, r, term in P_list[s][a])
    return Q


@st.composite
def random_desc(draw):
    size = draw(st.integers(2, 5))
    cells = draw(st.lists(st.sampled_from("FFH"), min_size=size * size, max_size=size * size))
    cells[0], cells[-1] = "S", "G"
    return ["".join(cells[r * size:(r + 1) * size]) for r in range(size)]


@settings(max_examples=25, deadline=None)
@given(desc=random_desc(), success_rate=st.sampled_from([1.0, 1.0 / 3.0, 0.75]))
def test_transition_tensor_equals_gymnasium(desc, success_rate):
    P_ref, _ = gym_P(desc, success_rate)
    mdp = _mdp(to_map(desc), success_rate)
    np.testing.assert_allclose(np.asarray(mdp.P_XxAxX), P_ref, atol=1e-6)
    np.testing.assert_allclose(np.asarray(mdp.P_XxAxX).sum(-1), 1.0, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(desc=random_desc(), success_rate=st.sampled_from([1.0, 1.0 / 3.0, 0.6]))
def test_q_star_equals_numpy_value_iteration(desc, success_rate):
    _, P_list = gym_P(desc, success_rate)
    n = len(desc) ** 2
    Q_ref = gym_value_iteration(P_list, n, HORIZON, 0.95)
    mdp = _mdp(to_map(desc), success_rate)
    Q = _q_star(mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X, horizon=HORIZON, gamma=0.95)
    assert Q.shape == (HORIZON + 1, n, 4)
    np.testing.assert_allclose(np.asarray(Q), Q_ref, atol=1e-5)
    np.testing.assert_allclose(np.asarray(fls.v_star(Q)), Q_ref.max(-1), atol=1e-5)
    for h in (0, 3, HORIZON):
        Qh = _q_star_at(mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X, h, 0.95)
        np.testing.assert_allclose(np.asarray(Qh), Q_ref[h], atol=1e-5)


def test_q_star_hand_values_deterministic_corridor():
    # S F G in one row of a 3x3 lake with holes below: the best Q from S is gamma^1 (two moves).
    desc = ["SFG", "HHH", "HHH"]
    mdp = _mdp(to_map(desc), 1.0)
    Q = np.asarray(_q_star(mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X, horizon=3, gamma=0.95))
    assert Q[1, 1, fls.RIGHT] == pytest.approx(1.0)
    assert Q[1, 0].max() == pytest.approx(0.0)  # one step is not enough from S
    assert Q[2, 0, fls.RIGHT] == pytest.approx(0.95)
    assert Q[2, 0, fls.DOWN] == pytest.approx(0.0)  # falls into a hole
    assert Q[3, 0, fls.LEFT] == pytest.approx(0.95 ** 2)  # bump the wall, then two moves
    assert np.all(Q[:, 2] == 0.0) and np.all(Q[:, 3] == 0.0)  # terminal goal / hole


def test_success_prob_within_hand_values():
    # 2x2 "SF/FG", slippery 1/3: W1 at the goal's neighbours is 1/3, W2(S) = 2/9.
    mdp = _mdp(to_map(["SF", "FG"]), 1.0 / 3.0)
    W = np.asarray(_within(mdp.P_XxAxX, mdp.goal_X, mdp.terminal_X, horizon=3))
    assert W.shape == (4, 4)
    np.testing.assert_allclose(W[0], [0, 0, 0, 1], atol=1e-6)
    np.testing.assert_allclose(W[1], [0, 1 / 3, 1 / 3, 1], atol=1e-6)
    assert W[2, 0] == pytest.approx(2 / 9, abs=1e-6)
    # deterministic: reachable from S in exactly 2 steps
    mdp1 = _mdp(to_map(["SF", "FG"]), 1.0)
    W1 = np.asarray(_within(mdp1.P_XxAxX, mdp1.goal_X, mdp1.terminal_X, horizon=3))
    assert W1[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_success_prob_within_is_zero_at_holes_and_monotone():
    desc = MAPS["4x4"]
    mdp = _mdp(to_map(desc), 1.0 / 3.0)
    W = np.asarray(_within(mdp.P_XxAxX, mdp.goal_X, mdp.terminal_X, horizon=30))
    holes = np.asarray(mdp.terminal_X & ~mdp.goal_X)
    assert np.all(W[:, holes] == 0.0)
    assert np.all(np.diff(W, axis=0) >= -1e-6)
    assert 0.0 < W[30, 0] < 1.0


def test_shortest_path_hand_maps():
    assert int(_shortest(to_map(MAPS["4x4"]))) == 6
    assert int(_shortest(to_map(MAPS["8x8"]))) == 14
    assert int(_shortest(to_map(["SH", "HG"]))) == fls.UNREACHABLE
    assert int(_shortest(to_map(["SF", "FG"]))) == 2
    assert int(_shortest(to_map(["SFFF", "HHHF", "GFFF", "HHHH"]))) == 8  # detour
    snake = to_map(["SFF", "HHF", "GFF"])
    assert int(_shortest(snake)) == 6


@settings(max_examples=15, deadline=None)
@given(desc=random_desc())
def test_deterministic_within_matches_shortest_path(desc):
    m = to_map(desc)
    mdp = _mdp(m, 1.0)
    W = np.asarray(_within(mdp.P_XxAxX, mdp.goal_X, mdp.terminal_X, horizon=30))
    d = int(_shortest(m))
    assert W[:, 0].tolist() == [float(h >= d) for h in range(31)]


def test_vmap_over_maps():
    descs = [["SF", "FG"], ["SH", "FG"], ["SH", "HG"]]
    maps = jnp.stack([to_map(d) for d in descs])

    @jax.jit
    def solve(maps_NxLxL, h_N):
        mdps = jax.vmap(fls.mdp_from_map, in_axes=(0, None))(maps_NxLxL, 1.0)
        W = jax.vmap(lambda P, g, t: fls.success_prob_within(P, g, t, 2))(
            mdps.P_XxAxX, mdps.goal_X, mdps.terminal_X)
        Qh = jax.vmap(fls.q_star_at, in_axes=(0, 0, 0, 0, None))(
            mdps.P_XxAxX, mdps.reward_XxA, mdps.terminal_X, h_N, 0.95)  # per-map horizon
        return W, Qh, jax.vmap(fls.shortest_path_length)(maps_NxLxL)

    W, Qh, dist = solve(maps, jnp.asarray([1, 2, 3]))
    assert np.asarray(W[:, 2, 0]).tolist() == [1.0, 1.0, 0.0]
    assert np.asarray(dist).tolist() == [2, 2, fls.UNREACHABLE]
    np.testing.assert_allclose(np.asarray(Qh[:, 0].max(-1)), [0.0, 0.95, 0.0], atol=1e-6)
