"""The envs' side of the host rollout (`host_loop`): what runs on the worker threads (`EnvSide`: reset or
step one episode, tokenising its next chunk there), and the episode groups that take turns with the model.
The worker threads with a time limit per call are `host_env_calls`; the per-turn wall-clock split is
`host_timing`.

Groups (`episode_groups`). With G groups, episode b belongs to group b % G (interleaved, so a task's
G rollouts, which sit next to each other, spread over the groups and their step times balance); each
group has the same number of policy rows, ceil(B / G), the last rows of a short group padded with
-1 (never active), so the model compiles once per rollout.

Dimension legend (CONVENTIONS.md): N turns (T_max), B episodes (the rows of a group's policy).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from jaxagent.envs.jax.budgets import budget_text
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout import episode


def error_text(where: str, err: BaseException) -> str:
    return f"{where}: {getattr(err, 'type_name', type(err).__name__)}: {err}"


@dataclasses.dataclass(frozen=True)
class EnvSide:
    """What runs on the worker threads: reset or step one episode and build its next chunk (thread-safe:
    no shared state is written; an env exception is returned, an infrastructure error raised)."""

    env: Any
    tokenizer: Tokenizer
    pieces: Any                 # chat.turn_pieces
    tasks: list
    seeds: list
    budget_B: np.ndarray
    hide_budget: bool
    budget_template: str
    system_fn: Callable          # (env, task) -> (system content, tools)
    process_reward_fn: Optional[Callable]  # (env, state, action_text, remaining) -> float

    def budget(self, b: int, t: int) -> Optional[str]:
        return None if self.hide_budget else budget_text(t, int(self.budget_B[b]), self.budget_template)

    def reset(self, b):
        """Reset episode b and build its first chunk: (state, obs, system ids, rest) or the exception."""
        try:
            state, obs = self.env.reset(self.seeds[b], self.tasks[b])
            content, tools = self.system_fn(self.env, self.tasks[b])
            sys_ids = chat.system_turn(self.tokenizer, content, tools)
            return state, obs, sys_ids, episode.host_first_chunk(self.tokenizer, self.pieces, obs, self.budget(b, 0))
        except Exception as err:  # noqa: BLE001 -- an env failure ends only its own episode
            if getattr(err, "infrastructure_error", False):
                raise  # the sandbox failed, not the model: never score it as the model's 0
            return err

    def step(self, b, t, state, text, closed):
        """Step episode b at turn t and build its next chunk (None when the episode ends here):
        (state, obs, info, (reward, done, valid, success, anchor, process reward), chunk) or the
        exception raised (by the env, or on its malformed output)."""
        try:
            remaining = int(self.budget_B[b]) - t
            proc = 0.0 if self.process_reward_fn is None else float(
                self.process_reward_fn(self.env, state, text, remaining))
            state, obs, reward, done, info = self.env.step(state, text)
            if not isinstance(info, dict):
                raise TypeError(f"env.step returned info of type {type(info).__name__}, expected dict")
            nums = (float(reward), bool(done), bool(info.get("valid", True)), bool(info.get("success", False)),
                    int(info.get("anchor", -1)), proc)
            chunk = None
            if not nums[1] and not episode.out_of_budget(t, self.budget_B[b]):
                chunk = episode.host_next_chunk(self.tokenizer, self.pieces, obs, info.get("obs_role", "user"),
                                                self.budget(b, t + 1), closed)
            return state, obs, info, nums, chunk
        except Exception as err:  # noqa: BLE001
            if getattr(err, "infrastructure_error", False):
                raise
            return err


class InFlight(NamedTuple):
    """A group's turn whose env steps are running."""

    t: int
    idx: np.ndarray             # the active episodes
    calls: list                 # their env calls (`host_env_calls.EnvCalls.submit_for`: None: another process)
    start_slot: np.ndarray
    replies: tuple
    texts: dict
    is_forced: np.ndarray


@dataclasses.dataclass
class Group:
    """Episodes that take their turns together: policy rows (episode ids, -1 pads), the group's policy
    (None with `generate_fn`), its next turn and its turn in flight."""

    rows: np.ndarray
    member: np.ndarray          # bool [B]
    policy: Any                 # HostPolicy, or None
    t: int = 0
    inflight: Optional[InFlight] = None





def episode_groups(n_ep: int, n_groups: int) -> list:
    """The episodes of each group as policy rows: int arrays [ceil(n_ep / G)], -1 for padding rows."""
    n_groups = max(1, min(n_groups, n_ep))
    rows = -(-n_ep // n_groups)
    out = []
    for g in range(n_groups):
        eps = np.arange(g, n_ep, n_groups)
        out.append(np.concatenate([eps, np.full((rows - len(eps),), -1, eps.dtype)]).astype(np.int64))
    return out
