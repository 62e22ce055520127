"""Pure-JAX text FrozenLake: one episode's reset/step on a token codec, vmappable over episodes.

Dynamics, rewards and map generation follow gymnasium FrozenLake-v1 (toy_text/frozen_lake.py, v1.4):
start top-left, goal bottom-right, actions Left=0 Down=1 Right=2 Up=3, reward 1 on reaching the goal,
holes and goal terminal, slippery moves as in ``frozenlake_solver``. Text layer (jaxagent's):
the observation is [message words] + the grid row by row ("P" you, "F" frozen, "S" start, "H" hole,
"G" goal, rows separated by "|"), rendered to tokens through a ``TextCodec``; the action is the LAST
"<answer>Move</answer>" in the generated tokens. An unparseable action: no move, the message
"Invalid action .", reward -format_penalty, not done.

A task is a map int8[L, L] (cell codes in ``frozenlake_solver``); ``sample_tasks`` draws solvable ones.
Dimension legend: L map side, X = L*L cells, A env actions, Pa tokens per action string, O observation
tokens, P tasks.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import budgets
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.base import EnvStep, Obs
from jaxagent.envs.jax.text_codec import TextCodec, concat, parse_action, render

ACTION_NAMES = ("Left", "Down", "Right", "Up")
ACTION_STRINGS = tuple(f"<answer>{n}</answer>" for n in ACTION_NAMES)
CELL_WORDS = ("F", "H", "S", "G")  # indexed by cell code FROZEN, HOLE, START, GOAL
PLAYER_WORD, ROW_SEP_WORD = "P", "|"
MSG_NONE, MSG_INVALID, MSG_GOAL, MSG_HOLE = 0, 1, 2, 3
MESSAGES = ((), ("Invalid", "action", "."), ("You", "reached", "the", "goal", "."),
            ("You", "fell", "into", "a", "hole", "."))
SYSTEM_PROMPT = (
    "You are walking on a frozen lake grid . Reach the goal G without falling into a hole H . "
    "The map is shown row by row , rows separated by | ; P is you , S is the start , F is frozen "
    "ice . Moves : Left Down Right Up . Moving into the edge leaves you in place . The ice may be "
    "slippery : you may slide to a side instead of the intended direction . The budget says how "
    "many turns are left . Answer with exactly one move in the format <answer>Left</answer> .")


class FrozenLakeParams(NamedTuple):
    """Dynamic env parameters (a pytree; may be traced or vmapped)."""

    success_rate: float = 1.0  # P(intended move); 1 deterministic, 1/3 = gymnasium's slippery
    frozen_prob: float = 0.8  # P(a random cell is frozen) in generate_map
    format_penalty: float = 0.0  # reward is -format_penalty on an invalid action
    horizon: int = 10  # default steps-to-go of process_reward / q_values: horizon - state.t
    gamma: float = 0.95  # discount of Q*


class FrozenLakeState(NamedTuple):
    map_LxL: jax.Array  # int8 cell codes
    pos: jax.Array  # int32 flat cell index of the player
    t: jax.Array  # int32 steps taken
    done: jax.Array  # bool: in a hole or at the goal
    success: jax.Array  # bool: reached the goal
    key: jax.Array  # PRNG key for slippery moves


def _reachable(map_LxL):
    return fls.shortest_path_length(map_LxL) < fls.UNREACHABLE


def generate_map(key: jax.Array, size: int, frozen_prob, max_tries: int = 1000,
                 random_start: bool = False) -> jax.Array:
    """A random solvable int8[size, size] map, as gymnasium's ``generate_random_map``: each cell
    frozen with probability ``frozen_prob`` else a hole, start (0, 0), goal (size-1, size-1),
    redrawn (lax.while_loop) until the goal is reachable. After ``max_tries`` draws (only for
    frozen_prob near 0) it returns the all-frozen map, so the loop always ends. ``random_start``
    (jaxagent's extension) puts the start on a uniformly random non-goal cell instead of (0, 0), so
    shortest paths vary from 1 to 2*(size-1) moves and tight budgets are sometimes enough."""
    if size < 2:
        raise ValueError(f"FrozenLake size must be >= 2, got {size}")
    p = jnp.clip(jnp.asarray(frozen_prob, jnp.float32), 0.0, 1.0)

    def draw(k):
        k_cells, k_start = jax.random.split(k)
        frozen = jax.random.bernoulli(k_cells, p, (size, size))
        m = jnp.where(frozen, fls.FROZEN, fls.HOLE).astype(jnp.int8).reshape(-1)
        start = jax.random.randint(k_start, (), 0, size * size - 1) if random_start else 0
        return m.at[start].set(fls.START).at[-1].set(fls.GOAL).reshape(size, size)

    def body(carry):
        k, _, _, i = carry
        k, sub = jax.random.split(k)
        m = draw(sub)
        return k, m, _reachable(m), i + 1

    fallback = jnp.full((size, size), fls.FROZEN, jnp.int8).at[0, 0].set(fls.START)
    fallback = fallback.at[-1, -1].set(fls.GOAL)
    init = (key, fallback, jnp.asarray(False), jnp.asarray(0, jnp.int32))
    _, m, ok, _ = jax.lax.while_loop(lambda c: ~c[2] & (c[3] < max_tries), body, init)
    return jnp.where(ok, m, fallback)


@functools.partial(jax.jit, static_argnames=("n", "size", "random_start"))
def sample_tasks(key: jax.Array, n: int, size: int = 4, frozen_prob=0.8, random_start: bool = False) -> jax.Array:
    """int8[n, size, size] solvable maps, one per split key (vmapped ``generate_map``); jitted, since the
    redraw loop run op by op would compile every primitive on each call."""
    return jax.vmap(lambda k: generate_map(k, size, frozen_prob, random_start=random_start))(jax.random.split(key, n))


class FrozenLake:
    """Static structure: codec, map side, observation size. Methods are pure, for one episode."""

    jittable = True
    ACTION_NAMES = ACTION_NAMES
    ACTION_STRINGS = ACTION_STRINGS

    def __init__(self, codec: TextCodec, size: int = 4, max_obs_words: int | None = None):
        if size < 2:
            raise ValueError(f"FrozenLake size must be >= 2, got {size}")
        missing = [a for a in ACTION_STRINGS if a not in codec.actions]
        if missing:
            raise ValueError(f"codec.actions lacks the FrozenLake actions {missing}")
        self.codec, self.size, self.n_cells = codec, int(size), int(size) * int(size)
        self._codec_to_env = jnp.asarray(
            [ACTION_STRINGS.index(a) if a in ACTION_STRINGS else -1 for a in codec.actions], jnp.int32)
        self._cell_ids = jnp.asarray(codec.word_ids(CELL_WORDS))
        self._player_id, self._sep_id = codec.word_id(PLAYER_WORD), codec.word_id(ROW_SEP_WORD)
        self._msg_max = max(len(m) for m in MESSAGES)
        msg = np.zeros((len(MESSAGES), self._msg_max), np.int32)
        for i, m in enumerate(MESSAGES):
            msg[i, : len(m)] = codec.word_ids(m) if m else []
        self._msg_ids, self._msg_lens = jnp.asarray(msg), jnp.asarray([len(m) for m in MESSAGES])
        self._grid_words = self.size * (self.size + 1) - 1
        needed = self._msg_max + self._grid_words
        self.max_obs_words = needed if max_obs_words is None else int(max_obs_words)
        if self.max_obs_words < needed:
            raise ValueError(f"max_obs_words={max_obs_words} < {needed} words a {size}x{size} "
                             "observation can need")
        self.obs_size = self.max_obs_words * codec.tokens_per_word  # O_max
        self._next_SxA = jnp.asarray(fls.next_state_table(self.size))
        self._pos_bits = max(1, math.ceil(math.log2(self.n_cells)))
        powers = np.ones(self.n_cells, np.uint64)
        for i in range(1, self.n_cells):
            powers[i] = (powers[i - 1] * np.uint64(16777619)) % np.uint64(2**32)
        self._hash_pows = jnp.asarray(powers.astype(np.uint32))

    # --- text -------------------------------------------------------------------------------
    @staticmethod
    def system_prompt() -> str:
        """Rules and answer format, as whitespace-separated words (all in ``vocabulary``)."""
        return SYSTEM_PROMPT

    @staticmethod
    def vocabulary() -> tuple[str, ...]:
        """Every word the env, its system prompt and the default budget text can emit, plus the
        action strings (for a word-level tokenizer with a whitespace-split pre-tokenizer)."""
        words = list(CELL_WORDS) + [PLAYER_WORD, ROW_SEP_WORD]
        words += [w for m in MESSAGES for w in m] + SYSTEM_PROMPT.split() + list(ACTION_STRINGS)
        return tuple(dict.fromkeys(words + list(budgets.vocabulary())))

    def _observe(self, map_LxL, pos, msg) -> Obs:
        L = self.size
        cells_X = map_LxL.reshape(self.n_cells).astype(jnp.int32)
        words_X = jnp.where(jnp.arange(self.n_cells) == pos, self._player_id, self._cell_ids[cells_X])
        sep_Lx1 = jnp.full((L, 1), self._sep_id, jnp.int32)
        grid = jnp.concatenate([words_X.reshape(L, L), sep_Lx1], axis=1).reshape(-1)[: self._grid_words]
        words, n = concat(self._msg_ids[msg], self._msg_lens[msg], grid, self._grid_words)
        words = jnp.pad(words, (0, self.max_obs_words - words.shape[0]))
        return Obs(*render(self.codec, words, n))

    # --- env interface ----------------------------------------------------------------------
    def reset(self, key: jax.Array, task: jax.Array, env_params: FrozenLakeParams
              ) -> tuple[FrozenLakeState, Obs]:
        """Start on ``task`` (int8[L, L] map) at its start cell."""
        task = jnp.asarray(task)
        if tuple(task.shape) != (self.size, self.size):
            raise ValueError(f"task map has shape {tuple(task.shape)}, env expects "
                             f"{(self.size, self.size)}")
        map_LxL = task.astype(jnp.int8)
        pos = jnp.argmax(map_LxL.reshape(-1) == fls.START).astype(jnp.int32)
        state = FrozenLakeState(map_LxL, pos, jnp.asarray(0, jnp.int32), jnp.asarray(False),
                                jnp.asarray(False), key)
        return state, self._observe(map_LxL, pos, MSG_NONE)

    def anchor(self, state: FrozenLakeState) -> jax.Array:
        """int32 id of (map, position): ((hash(map) << pos_bits) | pos) & 0x7fffffff, distinct for
        distinct positions of one map (hash: polynomial over cell codes mod 2^32)."""
        cells = state.map_LxL.reshape(-1).astype(jnp.uint32) + jnp.uint32(1)
        h = jnp.sum(cells * self._hash_pows, dtype=jnp.uint32)
        a = (h << jnp.uint32(self._pos_bits)) | state.pos.astype(jnp.uint32)
        return jax.lax.bitcast_convert_type(a & jnp.uint32(0x7FFFFFFF), jnp.int32)

    def parse(self, action_tokens_M: jax.Array, action_len) -> jax.Array:
        """Env action index (0..3) of the last answer in the tokens, -1 if none."""
        k = parse_action(self.codec, action_tokens_M, action_len)
        return jnp.where(k >= 0, self._codec_to_env[jnp.maximum(k, 0)], -1).astype(jnp.int32)

    def step(self, state: FrozenLakeState, action_tokens_M: jax.Array, action_len,
             env_params: FrozenLakeParams) -> EnvStep:
        """Parse the generated tokens, then ``step_action``."""
        return self.step_action(state, self.parse(action_tokens_M, action_len), env_params)

    def step_action(self, state: FrozenLakeState, action_index, env_params: FrozenLakeParams
                    ) -> EnvStep:
        """Apply action index a (anything outside 0..3 is invalid). Slippery: direction a with
        probability success_rate, (a-1)%4 or (a+1)%4 with (1-success_rate)/2 each."""
        a = jnp.asarray(action_index, jnp.int32)
        valid = (a >= 0) & (a < fls.N_ACTIONS)
        key, sub = jax.random.split(state.key)
        u = jax.random.uniform(sub)
        sr = jnp.asarray(env_params.success_rate, jnp.float32)
        offset = jnp.where(u < sr, 0, jnp.where(u < sr + (1.0 - sr) / 2.0, -1, 1))
        direction = (jnp.clip(a, 0, 3) + offset) % fls.N_ACTIONS
        moving = valid & ~state.done
        pos = jnp.where(moving, self._next_SxA[state.pos, direction], state.pos)
        cell = state.map_LxL.reshape(-1)[pos]
        reached, fell = moving & (cell == fls.GOAL), moving & (cell == fls.HOLE)
        penalty = 0.0 - jnp.asarray(env_params.format_penalty, jnp.float32)  # no -0.0
        reward = jnp.where(state.done, 0.0, jnp.where(valid, reached.astype(jnp.float32), penalty))
        done = state.done | reached | fell
        msg = jnp.where(~valid & ~state.done, MSG_INVALID,
                        jnp.where(cell == fls.GOAL, MSG_GOAL,
                                  jnp.where(cell == fls.HOLE, MSG_HOLE, MSG_NONE)))
        new = FrozenLakeState(state.map_LxL, pos, state.t + jnp.where(state.done, 0, 1), done,
                              state.success | reached, key)
        info = dict(valid=valid, action=jnp.where(valid, a, -1), success=new.success,
                    anchor=self.anchor(state), fell=fell,
                    direction=jnp.where(moving, direction, -1).astype(jnp.int32))
        return EnvStep(new, self._observe(state.map_LxL, pos, msg), reward.astype(jnp.float32),
                       done, info)

    # --- oracle -------------------------------------------------------------------------------
    def _q_pair(self, state, remaining_horizon, env_params):
        h = (env_params.horizon - state.t) if remaining_horizon is None else remaining_horizon
        h = jnp.asarray(h, jnp.int32)
        mdp = fls.mdp_from_map(state.map_LxL, env_params.success_rate)
        args = (mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X)
        Q_prev = fls.q_star_at(*args, h - 1, env_params.gamma)
        Q_h = jnp.where(h >= 1, fls.bellman_backup(Q_prev, *args, env_params.gamma), 0.0)
        return h, Q_prev[state.pos], Q_h[state.pos]

    def q_values(self, state: FrozenLakeState, remaining_horizon, env_params: FrozenLakeParams
                 ) -> jax.Array:
        """float32[4] Q*_h(s, .) at the current cell, h = remaining_horizon (None: horizon - t)."""
        return self._q_pair(state, remaining_horizon, env_params)[2]

    def process_reward(self, state: FrozenLakeState, action_index, remaining_horizon,
                       env_params: FrozenLakeParams) -> jax.Array:
        """Oracle process reward r = Q*_h(s, a) - V*_h(s) <= 0 (docs/study.md, definition of the oracle
        process reward; finding 7), h = remaining_horizon (None: horizon - t). An invalid action is
        valued as staying put: Q = gamma V*_{h-1}(s) (its format penalty is in the env reward)."""
        a = jnp.asarray(action_index, jnp.int32)
        h, Q_prev_A, Q_h_A = self._q_pair(state, remaining_horizon, env_params)
        stay = jnp.where(h >= 1, env_params.gamma * jnp.max(Q_prev_A), 0.0)
        valid = (a >= 0) & (a < fls.N_ACTIONS)
        q = jnp.where(valid, Q_h_A[jnp.clip(a, 0, 3)], stay)
        return jnp.where(state.done, 0.0, q - jnp.max(Q_h_A)).astype(jnp.float32)
