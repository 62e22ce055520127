"""One home for an episode's rules: its settings, its context, its budget text and its status.

The JAX and host loops, the evaluation drivers and the RL loop import these; none restates them (STYLE.md principle 14).
Context: Qwen3's chat format, append-only (`layout`); turn t appends the chunk [turn opener, budget text,
observation, assistant opener] (`prompt_chunk` from codec word ids in the graph; `host_first_chunk`,
`host_next_chunk` from text on the host), then the reply. Budget text: `budgets.BUDGET_TEMPLATE` ("Turn {turn} of
{budget}. {remaining} turns left.", turn 1-based, remaining counting this turn), as text (`budget_text`) or word ids.
Truncated replies: a reply not ending with <|im_end|> (`reply_closed` False) is closed by <|im_end|> at the head of
the next chunk: context, not policy (outside `policy_mask`, log-prob 0, turn t + 1); none after the last turn.
Status (codes in `types`): RUNNING until CONTEXT_EXHAUSTED (turn t < budget cannot hold its chunk and a full
reply; `turn_start`), SUCCESS or FAILED (the env ends it, by its success flag; `after_step`), or BUDGET_EXHAUSTED
(not done after its budget's last turn). episode_return = the sum of rewards if SUCCESS or FAILED, else 0. The
rules take numpy or jax arrays and return the same kind. Why so: docs/host_rollout.md, "The episode's rules".

Dimension legend (CONVENTIONS.md): B episodes, S context slots, C chunk tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import base
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.budgets import BudgetFormat
from jaxagent.envs.jax.text_codec import concat, render
from jaxagent.models import chat
from jaxagent.models.tokenizer import TOOL_RESPONSE, TOOL_RESPONSE_END, Tokenizer
from jaxagent.rollout import types
from jaxagent.rollout.layout import ChatLayout
from jaxagent.sampling import Sampler


# ----------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Settings every rollout has (hashable): turns, reply length, context slots, sampler."""

    t_max: int
    max_action_tokens: int = 16
    max_context: int = 1024            # KV-cache slots per episode; full -> context_exhausted
    sampler: Sampler = Sampler()

    def __post_init__(self):
        if self.t_max < 1:
            raise ValueError(f"t_max must be >= 1, got {self.t_max}")
        if self.max_action_tokens < 1:
            raise ValueError(f"max_action_tokens must be >= 1, got {self.max_action_tokens}")


# ----------------------------------------------------------------------------- status
def _xp(x):
    return np if isinstance(x, (np.ndarray, np.generic)) else jnp


def finished(status):
    """The episode ended by the env (SUCCESS or FAILED), not by its budget or its context."""
    return (status == types.SUCCESS) | (status == types.FAILED)


def turn_start(status_B, t, budget_B, fits_B):
    """(status, active) at the start of turn t: an episode plays if it is RUNNING with t < budget and its
    chunk plus a full reply fits; a running episode with budget left that does not fit ends
    CONTEXT_EXHAUSTED."""
    xp = _xp(status_B)
    playing = (status_B == types.RUNNING) & (t < budget_B)
    status_B = xp.where(playing & ~fits_B, types.CONTEXT_EXHAUSTED, status_B).astype(status_B.dtype)
    return status_B, playing & fits_B


def out_of_budget(t, budget):
    """Turn t (0-based) was the last turn of the budget."""
    return t + 1 >= budget


def after_step(status_B, active_B, done_B, success_B, out_of_budget_B):
    """Status after the env stepped the active episodes: done -> SUCCESS / FAILED by success; not done
    after the budget's last turn (`out_of_budget`) -> BUDGET_EXHAUSTED; otherwise unchanged."""
    xp = _xp(status_B)
    status_B = xp.where(active_B & done_B, xp.where(success_B, types.SUCCESS, types.FAILED), status_B)
    return xp.where(active_B & ~done_B & out_of_budget_B, types.BUDGET_EXHAUSTED, status_B).astype(status_B.dtype)


def episode_return(status_B, reward_BxN):
    """sum_n reward[b, n] if episode b finished (success or failed), else 0 (ran out of budget or context)."""
    xp = _xp(reward_BxN)
    return xp.where(finished(status_B), xp.sum(reward_BxN, axis=1), 0.0)


# ----------------------------------------------------------------------------- truncated replies
def reply_closed(reply_M, length, end_of_turn: int):
    """The reply ended with the end-of-turn token: reply[length - 1] == <|im_end|> (length 0: not closed).
    `reply_M` [..., M] with `length` [...]: numpy (the host loop) or jax (the JAX loop) alike. A reply
    that is not closed gets <|im_end|> at the head of the next chunk (module docstring)."""
    xp = _xp(reply_M)
    reply_M, length = xp.asarray(reply_M), xp.asarray(length)
    last = xp.take_along_axis(reply_M, xp.maximum(length - 1, 0)[..., None].astype(xp.int32), axis=-1)[..., 0]
    return (length > 0) & (last == end_of_turn)


# ----------------------------------------------------------------------------- contexts of jittable envs
def prompt_chunk(layout: ChatLayout, fmt: BudgetFormat, env, obs, t, budget, hide, closed=True):
    """One episode's prompt chunk for turn t: (tokens int32[C], length); `hide` (may be traced) drops the
    budget text; `closed` (may be traced): the previous reply ended with <|im_end|> (`reply_closed`); if not,
    the chunk of a turn t > 0 starts with it."""
    open_arr, open_len, close = (jnp.asarray(x) for x in layout.pieces())
    which = jnp.where(t == 0, 0, jnp.where(closed, 1, 2))
    words, n_words = budgets_lib.budget_words(t, budget, budget - t, fmt, hidden=hide)
    btoks, blen = render(env.codec, words, n_words)
    toks, n = concat(open_arr[which], open_len[which], btoks, blen, pad_id=layout.pad_id)
    toks, n = concat(toks, n, obs.tokens, obs.length, pad_id=layout.pad_id)
    return concat(toks, n, close, close.shape[0], pad_id=layout.pad_id)


def max_chunk(layout: ChatLayout, fmt: BudgetFormat, env, t_max: Optional[int] = None,
              obs_size: Optional[int] = None) -> int:
    """Most tokens a turn's prompt chunk can have (with `t_max`: in a rollout with that T_max, whose
    budget numbers have at most len(str(t_max)) digits). `obs_size`: the env's O_max (default
    `env.obs_size`; `observation_size` reads it from the env's reset)."""
    words = fmt.max_words if t_max is None else fmt.words_for(t_max)
    o_max = env.obs_size if obs_size is None else int(obs_size)
    return layout.open_width + words * env.codec.tokens_per_word + o_max + len(layout.close)


def observation_size(env, tasks, env_params) -> int:
    """O_max of a jittable env: its `obs_size` attribute, else the length of the Obs its reset returns for
    the first task (`jax.eval_shape`: traced, not run)."""
    if hasattr(env, "obs_size"):
        return int(env.obs_size)
    task = jax.tree.map(lambda x: x[0], tasks)
    obs = base.check_reset(env, jax.eval_shape(env.reset, jax.random.key(0), task, env_params))
    return int(obs.tokens.shape[-1])


def write_span(buf_S, values_K, start, count):
    """buf[start:start+count] = values[:count] for one row; writes past the end are dropped."""
    k = jnp.arange(values_K.shape[0])
    slots = jnp.where(k < count, start + k, buf_S.shape[0])
    return buf_S.at[slots].set(values_K.astype(buf_S.dtype), mode="drop")


# ----------------------------------------------------------------------------- contexts of host envs
def observation_turn(tokenizer: Tokenizer, obs: str, role: str, budget: Optional[str]) -> list[int]:
    """Ids of the user turn that carries `obs` (role 'user' or 'tool'), the budget text first if given.
    Without budget text a 'tool' turn equals `chat.tool_turn` of its results."""
    if not isinstance(obs, str):
        raise TypeError(f"an observation must be a str, got {type(obs).__name__}")
    if role == "tool":
        body = obs.strip("\n")
        if not (body.startswith(TOOL_RESPONSE) and body.endswith(TOOL_RESPONSE_END)):
            body = f"{TOOL_RESPONSE}\n{obs}\n{TOOL_RESPONSE_END}"
    elif role == "user":
        body = obs
    else:
        raise ValueError(f"obs_role must be 'user' or 'tool', got {role!r}")
    return chat.user_turn(tokenizer, body if budget is None else f"{budget}\n{body}")


def host_first_chunk(tokenizer: Tokenizer, pieces, obs: str, budget: Optional[str]) -> list[int]:
    """Turn 0's chunk after the system turn: the first user turn (budget text, observation) and the
    generation prompt (`chat.turn_pieces`)."""
    return observation_turn(tokenizer, obs, "user", budget) + list(pieces.generation_prompt)


def host_next_chunk(tokenizer: Tokenizer, pieces, obs: str, role: str, budget: Optional[str],
                    closed: bool) -> list[int]:
    """Turn t + 1's chunk: <|im_end|> if the reply was not `closed` (`reply_closed`; module docstring,
    "Truncated replies"), the newline after a reply, the user / tool turn and the generation prompt."""
    return (([] if closed else [tokenizer.im_end_id]) + list(pieces.after_reply)
            + observation_turn(tokenizer, obs, role, budget) + list(pieces.generation_prompt))


def text_reply(tokenizer: Tokenizer, text: str, m: int) -> tuple[list[int], bool]:
    """A given reply as tokens: encode(text) + <|im_end|>, cut at m; (ids, ended on the stop token)."""
    if not isinstance(text, str):
        raise ValueError(f"a given reply must be a str, got {type(text).__name__}")
    full = tokenizer.encode(text) + [tokenizer.im_end_id]
    return full[:m], len(full) <= m


def action_text(tokenizer: Tokenizer, ids, stopped: bool) -> str:
    """A reply's text without its stop token. Ids the tokenizer lacks (a model's vocabulary may be
    padded past the tokenizer's) have no text and are dropped."""
    ids = list(ids)[:-1] if stopped and len(ids) else list(ids)
    return tokenizer.decode([int(i) for i in ids if 0 <= i < tokenizer.vocab_size])
