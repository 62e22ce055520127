"""One turn of the host rollout (`host_loop`) on the episodes' buffers: the named steps `host_rollout`
runs per episode group and turn (its module docstring has the turn's rules).

  `reset_all`       every episode reset, its first chunk (system turn + first user turn) pending;
  1 `write_chunks`  who plays turn t, their pending chunks written into their rows;
  2 `group_replies` the group's replies (given, scripted or sampled), `write_replies` writes them;
  3 `submit_steps`  the env steps on the replies' texts, submitted to the worker threads;
    `finish_steps`  their results recorded and the statuses moved on (`episode.after_step`).

`EpisodeBuffers` holds the Rollout's arrays, built on the host, and the per-episode bookkeeping.

Dimension legend (CONVENTIONS.md): B episodes, S context slots (= KV-cache slots), N turns (T_max),
M action tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp
import numpy as np

from jaxagent.envs.host.base import stable_hash
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout import episode, types
from jaxagent.rollout.episode import EpisodeConfig, action_text
from jaxagent.rollout.host_env_calls import EnvCalls, EnvTimeout, span
from jaxagent.rollout.host_policy import given_replies
from jaxagent.rollout.host_schedule import EnvSide, Group, InFlight, error_text
from jaxagent.rollout.host_timing import TurnClock


@dataclasses.dataclass
class EpisodeBuffers:
    """The Rollout's arrays, built on the host, and per-episode bookkeeping."""

    tokens: np.ndarray          # int32 [B, S]
    policy: np.ndarray          # bool [B, S]
    turn_index: np.ndarray      # int32 [B, S]
    logp: np.ndarray            # f32 [B, S]
    length: np.ndarray          # int32 [B]
    status: np.ndarray          # int32 [B]
    rec: dict                   # Turns fields, [B, N] each
    trace: Any                  # host_loop.HostTrace, its lists filled in as the episodes run
    states: list                # env state per episode
    pending: list               # ids of each episode's next chunk
    n_system: np.ndarray        # int32 [B] system-turn tokens at the head of chunk 0

    @classmethod
    def empty(cls, hcfg: EpisodeConfig, pad_id: int, trace) -> "EpisodeBuffers":
        """Buffers for the episodes of `trace` (a `host_loop.HostTrace` with empty per-episode lists)."""
        n_ep, s, n_turns = len(trace.tasks), hcfg.max_context, hcfg.t_max
        rec = {name: np.zeros((n_ep, n_turns), dtype) for name, dtype in (
            ("active", bool), ("reward", np.float32), ("process_reward", np.float32), ("valid", bool),
            ("span_start", np.int32), ("span_len", np.int32), ("stopped", bool), ("remaining", np.int32),
            ("forced", bool))}
        rec["action"] = np.full((n_ep, n_turns), -1, np.int32)
        rec["anchor"] = np.full((n_ep, n_turns), -1, np.int32)
        return cls(tokens=np.full((n_ep, s), pad_id, np.int32), policy=np.zeros((n_ep, s), bool),
                   turn_index=np.full((n_ep, s), -1, np.int32), logp=np.zeros((n_ep, s), np.float32),
                   length=np.zeros((n_ep,), np.int32), status=np.full((n_ep,), types.RUNNING, np.int32), rec=rec,
                   trace=trace, states=[None] * n_ep, pending=[[] for _ in range(n_ep)],
                   n_system=np.zeros((n_ep,), np.int32))

    def to_rollout(self, budget_B, put: Callable = jnp.asarray) -> types.Rollout:
        """The Rollout, each host array turned into a jax array by `put` (several processes: replicated on
        the mesh)."""
        rec, status = self.rec, self.status
        ret = episode.episode_return(status, rec["reward"]).astype(np.float32)
        return types.Rollout(
            tokens=put(self.tokens), policy_mask=put(self.policy),
            turn_index=put(self.turn_index), logprobs=put(self.logp), length=put(self.length),
            turns=types.Turns(**{k: put(v) for k, v in rec.items()}), env_states=None, final_state=None,
            episode_return=put(ret), success=put(status == types.SUCCESS),
            turns_used=put(rec["active"].sum(1).astype(np.int32)), budget=put(np.asarray(budget_B)),
            status=put(status), generated_tokens=put(self.policy.sum(1).astype(np.int32)))



def reset_all(buf: EpisodeBuffers, envs: EnvSide, calls: EnvCalls, hcfg: EpisodeConfig):
    """Reset every episode (this process's: `EnvCalls.submit_for`): its first chunk (system turn + first user
    turn) becomes pending."""
    idx = range(len(envs.tasks))
    for b, res in enumerate(calls.results(idx, [calls.submit_for(b, envs.reset, b) for b in idx])):
        if isinstance(res, Exception):
            buf.status[b], buf.trace.errors[b] = types.FAILED, error_text("reset", res)
            continue
        buf.states[b], obs, sys_ids, first = res
        buf.trace.observations[b].append(obs)
        buf.pending[b], buf.n_system[b] = sys_ids + first, len(sys_ids)
    need = [len(p) + hcfg.max_action_tokens for b, p in enumerate(buf.pending) if buf.status[b] == types.RUNNING]
    if need and min(need) > hcfg.max_context:
        raise ValueError(f"max_context={hcfg.max_context} cannot hold even one turn of any episode (the shortest "
                         f"needs {min(need)} tokens: system prompt, first observation and a full reply)")


def write_chunks(buf: EpisodeBuffers, t: int, budget_B, hcfg: EpisodeConfig, member_B):
    """Step 1: who of the group (member_B) plays turn t (`episode.turn_start`); the players' pending chunks
    written into their rows. Returns (active [B], first reply slot [B])."""
    chunk_len = np.asarray([len(p) for p in buf.pending], np.int32)
    fits = buf.length + chunk_len + hcfg.max_action_tokens <= hcfg.max_context
    status, active = episode.turn_start(buf.status, t, budget_B, fits)
    buf.status, active = np.where(member_B, status, buf.status).astype(np.int32), active & member_B
    for b in np.flatnonzero(active):
        sl = slice(buf.length[b], buf.length[b] + chunk_len[b])
        buf.tokens[b, sl] = buf.pending[b]
        buf.turn_index[b, buf.length[b] + (buf.n_system[b] if t == 0 else 0):sl.stop] = t
    return active, buf.length + np.where(active, chunk_len, 0)


def group_replies(buf: EpisodeBuffers, group: Group, t: int, active, start_slot, given: dict,
                  generate_fn: Optional[Callable], tokenizer: Tokenizer, hcfg: EpisodeConfig):
    """Step 2: the group's replies of turn t, given (`forced_actions`), scripted (`generate_fn`) or sampled
    by the group's policy: numpy (tokens [B, M], logprobs [B, M], lengths [B], stopped [B])."""
    n_ep, m, pad = buf.tokens.shape[0], hcfg.max_action_tokens, tokenizer.pad_id
    idx = np.flatnonzero(active)
    if generate_fn is not None:
        script = list(generate_fn(t, active.copy(), [buf.tokens[b, :start_slot[b]] for b in range(n_ep)]))
        if len(script) != n_ep:
            raise ValueError(f"generate_fn returned {len(script)} replies for {n_ep} episodes")
        return given_replies({b: given.get(b, script[b]) for b in idx}, n_ep, tokenizer, m, pad)
    rows, live = group.rows, group.rows >= 0  # the policy's rows: episode ids, -1 for padding
    act_rows = np.zeros(rows.shape, bool)
    act_rows[live] = active[rows[live]]
    out_rows = group.policy.turn([buf.pending[b] if b >= 0 and active[b] else [] for b in rows], act_rows,
                                 {i: given[b] for i, b in enumerate(rows) if b in given}, tokenizer)
    out = given_replies({}, n_ep, tokenizer, m, pad)
    for x, x_rows in zip(out, out_rows):
        x[rows[live]] = x_rows[live]
    return out


def write_replies(buf: EpisodeBuffers, t: int, active, start_slot, replies, trains, tokenizer: Tokenizer) -> dict:
    """Step 2b: the replies written into the rows; returns their texts {b: text} (stop token dropped)."""
    r_tok, r_lp, r_len, r_stop = replies
    buf.length = start_slot + r_len
    texts = {}
    for b in np.flatnonzero(active):
        sl = slice(start_slot[b], start_slot[b] + r_len[b])
        buf.tokens[b, sl] = r_tok[b, :r_len[b]]
        buf.policy[b, sl] = trains[b]
        buf.turn_index[b, sl] = t
        buf.logp[b, sl] = r_lp[b, :r_len[b]]
        texts[b] = action_text(tokenizer, r_tok[b, :r_len[b]], bool(r_stop[b]))
    return texts


def submit_steps(buf: EpisodeBuffers, envs: EnvSide, calls: EnvCalls, t: int, active, start_slot, replies, texts: dict,
                 is_forced, tokenizer: Tokenizer) -> InFlight:
    """Step 3: the envs' steps on the replies' texts, submitted to the worker threads (this process's episodes)."""
    r_tok, _, r_len, _ = replies
    idx = np.flatnonzero(active)
    closed = [bool(episode.reply_closed(r_tok[b], r_len[b], tokenizer.im_end_id)) for b in idx]  # the shared rule
    steps = [calls.submit_for(b, envs.step, b, t, buf.states[b], texts[b], c) for b, c in zip(idx, closed)]
    return InFlight(t, idx, steps, start_slot, replies, texts, is_forced)


def finish_steps(buf: EpisodeBuffers, envs: EnvSide, calls: EnvCalls, turn: InFlight, clock: TurnClock):
    """Step 3b: the steps' results (all returned or timed out); the turn recorded and the statuses moved
    on (`episode.after_step`); an env exception or time-out fails its own episode."""
    t, (_, _, r_len, r_stop) = turn.t, turn.replies
    results = calls.results(turn.idx, turn.calls)
    clock.add_env(t, span(turn.calls))
    rec, trace, active = buf.rec, buf.trace, np.isin(np.arange(buf.status.shape[0]), turn.idx)
    stepped, done_B, success_B, errors = np.zeros_like(active), np.zeros_like(active), np.zeros_like(active), {}
    for b, res in zip(turn.idx, results):
        rec["active"][b, t], rec["forced"][b, t] = True, turn.is_forced[b]
        rec["span_start"][b, t], rec["span_len"][b, t] = turn.start_slot[b], r_len[b]
        rec["stopped"][b, t] = bool(r_stop[b])
        rec["remaining"][b, t] = envs.budget_B[b] - t
        trace.actions[b].append(turn.texts[b])
        buf.pending[b] = []
        if isinstance(res, Exception):
            errors[b] = error_text(f"step {t}", res)
            info = {"valid": False, "success": False, "error": errors[b]}
            if isinstance(res, EnvTimeout):  # the abandoned call may still change the state: drop it
                info.update(timeout=True, timeout_s=calls.timeout_s)
                buf.states[b] = None
            else:
                info["env_exception"] = True
            trace.infos[b].append(info)
            trace.dones[b].append(True)
            continue
        buf.states[b], obs, info, (reward, done, valid, success, anchor, proc), chunk = res
        trace.observations[b].append(obs)
        trace.infos[b].append(info)
        trace.dones[b].append(done)
        rec["reward"][b, t], rec["process_reward"][b, t], rec["valid"][b, t] = reward, proc, valid
        rec["action"][b, t] = stable_hash(turn.texts[b]) if valid else -1
        rec["anchor"][b, t] = anchor
        stepped[b], done_B[b], success_B[b] = True, done, success
        if chunk is not None:
            buf.pending[b] = chunk
    buf.status = episode.after_step(buf.status, stepped, done_B, success_B, episode.out_of_budget(t, envs.budget_B))
    for b, err in errors.items():
        buf.status[b], trace.errors[b] = types.FAILED, err
    clock.lap("host_s", t)
