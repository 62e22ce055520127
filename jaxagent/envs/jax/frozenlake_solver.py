"""Exact solver for FrozenLake maps: transition tensor, finite-horizon Q*, success probability, BFS.

Conventions follow gymnasium FrozenLake-v1 (gymnasium/envs/toy_text/frozen_lake.py, v1.4):
actions LEFT=0, DOWN=1, RIGHT=2, UP=3; state s = row * L + col; a move into the border leaves the
agent in place; holes and the goal are terminal (absorbing, reward 0 from then on); reward 1 on
ENTERING the goal. Slippery dynamics: the agent moves in direction b in {a-1, a, a+1} (mod 4) with
probability success_rate for b = a and (1 - success_rate) / 2 for each perpendicular b; success_rate
= 1 is the deterministic lake, gymnasium's is_slippery default is success_rate = 1/3.

Every function is written for ONE map and is jittable and vmappable over maps.
Dimension legend: L map side, X = L*L cells (the MDP's states), A = 4 actions, Hz = horizon + 1 (h = 0..horizon).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

FROZEN, HOLE, START, GOAL = 0, 1, 2, 3  # cell codes of an int8[L, L] map
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
N_ACTIONS = 4
UNREACHABLE = 1_000_000_000  # shortest_path_length sentinel
_DROW = (0, 1, 0, -1)
_DCOL = (-1, 0, 1, 0)


@functools.lru_cache(maxsize=None)
def next_state_table(size: int) -> np.ndarray:
    """int32[S, A]: the cell reached from s by moving in direction a (clamped at the border)."""
    rows, cols = np.divmod(np.arange(size * size), size)
    r_XxA = np.clip(rows[:, None] + np.asarray(_DROW)[None], 0, size - 1)
    c_XxA = np.clip(cols[:, None] + np.asarray(_DCOL)[None], 0, size - 1)
    return (r_XxA * size + c_XxA).astype(np.int32)


class MapMDP(NamedTuple):
    """The MDP of one map: P[s, a, s'], expected reward R[s, a], terminal and goal masks."""

    P_XxAxX: jax.Array
    reward_XxA: jax.Array
    terminal_X: jax.Array
    goal_X: jax.Array


def transition_tensor(map_LxL: jax.Array, success_rate) -> jax.Array:
    """P[s, a, s'] = sum_{k in -1,0,1} p_k [s' = next(s, (a + k) mod 4)] for non-terminal s,
    P[s, a, s] = 1 for terminal s; p_0 = success_rate, p_{+-1} = (1 - success_rate) / 2.
    Equals gymnasium's ``env.unwrapped.P`` with the probabilities of equal s' summed."""
    size = map_LxL.shape[0]
    n = size * size
    nxt_XxA = jnp.asarray(next_state_table(size))
    sr = jnp.asarray(success_rate, jnp.float32)
    P_XxAxX = jnp.zeros((n, N_ACTIONS, n), jnp.float32)
    for k, p in ((-1, (1.0 - sr) / 2.0), (0, sr), (1, (1.0 - sr) / 2.0)):
        dirs_A = (jnp.arange(N_ACTIONS) + k) % N_ACTIONS
        P_XxAxX = P_XxAxX + p * jax.nn.one_hot(nxt_XxA[:, dirs_A], n, dtype=jnp.float32)
    cells_X = map_LxL.reshape(n)
    terminal_X = (cells_X == HOLE) | (cells_X == GOAL)
    stay_XxAxX = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32)[:, None, :], P_XxAxX.shape)
    return jnp.where(terminal_X[:, None, None], stay_XxAxX, P_XxAxX)


def mdp_from_map(map_LxL: jax.Array, success_rate) -> MapMDP:
    """R[s, a] = sum_s' P[s, a, s'] [s' is goal] for non-terminal s (reward 1 on entering the goal)."""
    cells_X = map_LxL.reshape(-1)
    goal_X = cells_X == GOAL
    terminal_X = goal_X | (cells_X == HOLE)
    P_XxAxX = transition_tensor(map_LxL, success_rate)
    reward_XxA = jnp.where(terminal_X[:, None], 0.0, P_XxAxX @ goal_X.astype(jnp.float32))
    return MapMDP(P_XxAxX, reward_XxA, terminal_X, goal_X)


def bellman_backup(Q_XxA, P_XxAxX, reward_XxA, terminal_X, gamma):
    """Q_{h+1}(s,a) = R(s,a) + gamma sum_s' P(s,a,s') V_h(s'), V_h = max_a Q_h; 0 at terminal s."""
    V_X = jnp.max(Q_XxA, axis=-1)
    Q_next = reward_XxA + gamma * jnp.einsum("sat,t->sa", P_XxAxX, V_X)
    return jnp.where(terminal_X[:, None], 0.0, Q_next)


def q_star(P_XxAxX, reward_XxA, terminal_X, horizon: int, gamma=0.95) -> jax.Array:
    """Finite-horizon optimal action values Q[h, s, a], h = 0..horizon (static), Q_0 = 0.

    Backward induction (Bellman 1957; Puterman 1994, sec. 4.5), recursion of ``bellman_backup``:
    Q*_h(s, a) is the best expected discounted return of taking a in s with h steps left.
    """
    Q0_XxA = jnp.zeros_like(reward_XxA, jnp.float32)

    def body(Q_XxA, _):
        Q_next = bellman_backup(Q_XxA, P_XxAxX, reward_XxA, terminal_X, gamma)
        return Q_next, Q_next

    _, Qs_HzxXxA = jax.lax.scan(body, Q0_XxA, None, length=int(horizon))
    return jnp.concatenate([Q0_XxA[None], Qs_HzxXxA], axis=0)


def q_star_at(P_XxAxX, reward_XxA, terminal_X, h, gamma=0.95) -> jax.Array:
    """Q*_h[s, a] for a dynamic (traced, batchable) number of steps left h >= 0 (h <= 0 gives 0)."""
    Q0_XxA = jnp.zeros_like(reward_XxA, jnp.float32)
    step = lambda _, Q: bellman_backup(Q, P_XxAxX, reward_XxA, terminal_X, gamma)
    return jax.lax.fori_loop(0, jnp.maximum(jnp.asarray(h, jnp.int32), 0), step, Q0_XxA)


def v_star(Q_xSxA: jax.Array) -> jax.Array:
    """V*_h(s) = max_a Q*_h(s, a) (0 at terminal states, whose Q is 0)."""
    return jnp.max(Q_xSxA, axis=-1)


def success_prob_within(P_XxAxX, goal_X, terminal_X, horizon: int) -> jax.Array:
    """W[h, s]: the highest probability any policy reaches the goal within h steps from s.

    Undiscounted DP: W_0(s) = [s is goal];
    W_{h+1}(s) = 1 at the goal, 0 at holes, else max_a sum_s' P(s,a,s') W_h(s').
    """
    goal_f = goal_X.astype(jnp.float32)

    def body(W_X, _):
        best_X = jnp.max(jnp.einsum("sat,t->sa", P_XxAxX, W_X), axis=-1)
        W_next = jnp.where(goal_X, 1.0, jnp.where(terminal_X, 0.0, best_X))
        return W_next, W_next

    _, Ws_HzxX = jax.lax.scan(body, goal_f, None, length=int(horizon))
    return jnp.concatenate([goal_f[None], Ws_HzxX], axis=0)


def _dilate(reach_LxL: jax.Array) -> jax.Array:
    """Cells one move away from ``reach`` (4-neighbourhood; moves into the border add nothing)."""
    p = jnp.pad(reach_LxL, 1)
    return p[:-2, 1:-1] | p[2:, 1:-1] | p[1:-1, :-2] | p[1:-1, 2:]


def shortest_path_length(map_LxL: jax.Array) -> jax.Array:
    """Fewest moves from the start cell to a goal cell on the deterministic lake, by BFS layers:
    cells first entered at layer k, from reached NON-terminal cells (holes and goal stop the walk),
    have distance k. Returns int32, ``UNREACHABLE`` when no path exists (or the map has no start)."""
    size = map_LxL.shape[0]
    terminal = (map_LxL == HOLE) | (map_LxL == GOAL)
    reach0 = map_LxL == START
    dist0 = jnp.where(reach0, 0, UNREACHABLE).astype(jnp.int32)

    def layer(k, carry):
        reach, dist = carry
        new = _dilate(reach & ~terminal) & ~reach
        return reach | new, jnp.where(new, k, dist)

    _, dist = jax.lax.fori_loop(1, size * size, layer, (reach0, dist0))
    return jnp.min(jnp.where(map_LxL == GOAL, dist, UNREACHABLE)).astype(jnp.int32)
