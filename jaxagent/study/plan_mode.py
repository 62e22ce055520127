"""Plan mode: FrozenLake's single-shot R_single (docs/study.md finding 6 and "jaxagent's definitions", R_single).

Definition. For a held-out map m, a budget T (the study's T_max) and a policy pi:
    prompt(m, T) = the system turn + the multi-turn episode's FIRST user turn (budget text and map) followed by
                   PLAN_INSTRUCTION ("Plan : Answer with all moves at once .") + the assistant opener;
    reply ~ pi(. | prompt(m, T)), ONE reply of at most T action strings and a stop token, no feedback;
    plan(reply) = the moves a_1 .. a_n (n >= 1) when the reply, up to its stop token, is exactly a sequence of
                  action strings; otherwise (anything else, no move, no stop token) the reply has no plan;
    success(m, reply) = 1 iff there is a plan and executing a_1 .. a_min(n, T) from the start cell
                  (`FrozenLake.step_action`; holes and the goal end the walk) reaches the goal, else 0;
    R_single = mean over held-out maps and Z samples per map of success.
It is the analogue of the paper's single-turn reward (coding: one reply judged without execution feedback).
The base learns the format from SFT plan episodes (`stages.BaseSettings.plan_fraction`, `plan_sft_rows`).

Dimension legend (CONVENTIONS.md): P tasks, Z samples per task, R = P*Z reply rows, W prompt slots, M reply
tokens, N moves (T_max), Fa accepted action forms, Pa tokens per form, C plan-chunk tokens.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.frozenlake import ACTION_STRINGS
from jaxagent.envs.jax.text_codec import concat, render
from jaxagent.rollout.episode import write_span
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import bucket, generate

PLAN_INSTRUCTION = "Plan : Answer with all moves at once ."
PLAN_WORDS = tuple(PLAN_INSTRUCTION.split())  # the toy tokenizer and every FrozenLake codec carry them


# ----------------------------------------------------------------------------- prompts
def instruction_ids(codec) -> np.ndarray:
    """The instruction's codec word ids (host-side); ValueError naming the missing words when the codec
    was built without `PLAN_WORDS` (`study.toy.make_toy_world` includes them)."""
    missing = [w for w in PLAN_WORDS if w not in codec.words]
    if missing:
        raise ValueError(f"the world's codec lacks the plan instruction's words {missing}: build the codec over "
                         "FrozenLake's vocabulary plus plan_mode.PLAN_WORDS (study.toy.make_toy_world does)")
    return codec.word_ids(PLAN_WORDS)


def plan_chunk_width(world, t_max: int) -> int:
    """Most tokens of a plan chunk (`plan_chunk`) in a study with that T_max."""
    layout, env = world.layout, world.env
    return (layout.open_width + world.fmt.words_for(t_max) * env.codec.tokens_per_word + env.obs_size
            + len(PLAN_WORDS) * env.codec.tokens_per_word + len(layout.close))


def plan_chunk(layout, fmt, env, obs, budget, instr_ids):
    """One task's plan chunk: the first user turn of the multi-turn episode (opener, budget text of turn 0,
    observation) with the instruction appended, then the assistant opener: (tokens int32[C], length)."""
    open_arr, open_len, close = (jnp.asarray(x) for x in layout.pieces())
    words, n_words = budgets_lib.budget_words(0, budget, budget, fmt)
    btoks, blen = render(env.codec, words, n_words)
    itoks, ilen = render(env.codec, jnp.asarray(instr_ids, jnp.int32), len(instr_ids))
    toks, n = concat(open_arr[0], open_len[0], btoks, blen, pad_id=layout.pad_id)
    toks, n = concat(toks, n, obs.tokens, obs.length, pad_id=layout.pad_id)
    toks, n = concat(toks, n, itoks, ilen, pad_id=layout.pad_id)
    return concat(toks, n, close, close.shape[0], pad_id=layout.pad_id)


@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt", "instr", "width"))
def _prompts_jit(maps, budget_P, env_params, *, env, layout, fmt, instr, width):
    system = jnp.asarray(layout.system, jnp.int32)

    def one(task, budget):
        _, obs = env.reset(jax.random.key(0), task, env_params)
        chunk, clen = plan_chunk(layout, fmt, env, obs, budget, instr)
        row = jnp.full((width,), layout.pad_id, jnp.int32).at[:system.shape[0]].set(system)
        return write_span(row, chunk, system.shape[0], clen), system.shape[0] + clen

    return jax.vmap(one)(maps, budget_P)


def plan_generate_shape(world, t_max: int) -> tuple[int, int]:
    """(W, M) of `plan_success`'s `generate` calls at that T_max: the prompt slots (the bucket of the longest plan
    prompt, `plan_prompts`' width) and the reply buffer (`max_plan_tokens`, generate's max_steps)."""
    return (bucket(len(world.layout.system) + plan_chunk_width(world, t_max)),
            max_plan_tokens(world.codec, t_max))


def plan_prompts(world, tasks, budgets, env_params, *, width: Optional[int] = None):
    """The plan prompt of each task with its budget (int or int[P]): tokens int32[P, W] (padded with
    pad_id) and lengths int32[P]. `width` defaults to the smallest bucket holding any plan prompt."""
    tasks = jnp.asarray(tasks)
    budget_P = jnp.broadcast_to(jnp.asarray(budgets, jnp.int32), (tasks.shape[0],))
    t_max = int(jnp.max(budget_P))
    need = len(world.layout.system) + plan_chunk_width(world, t_max)
    width = bucket(need) if width is None else int(width)
    if width < need:
        raise ValueError(f"width {width} cannot hold a plan prompt ({need} tokens)")
    instr = tuple(int(i) for i in instruction_ids(world.codec))
    return _prompts_jit(tasks, budget_P, env_params, env=world.env, layout=world.layout, fmt=world.fmt,
                        instr=instr, width=width)


# ----------------------------------------------------------------------------- replies
def max_plan_tokens(codec, t_max: int) -> int:
    """Reply tokens a plan of t_max moves needs: t_max of the longest action form, plus the stop token."""
    return int(t_max) * int(np.max(np.asarray(codec.match_lens_Fa))) + 1


def plan_reply(codec, stop_id: int, actions_N, n_actions, m: int):
    """One plan reply from env actions: the canonical text of actions[:n] in order, then `stop_id`:
    (tokens int32[m] padded with codec.pad_id, length). Actions outside 0..3 are not expected (experts)."""
    table, lens = codec.action_tokens_AxPa, codec.action_lens_A
    actions_N, n_actions = jnp.asarray(actions_N, jnp.int32), jnp.asarray(n_actions, jnp.int32)
    buf = jnp.full((m,), codec.pad_id, jnp.int32)

    def body(i, carry):
        buf, pos = carry
        a = jnp.clip(actions_N[i], 0, table.shape[0] - 1)
        n = jnp.where(i < n_actions, lens[a], 0)
        return write_span(buf, table[a], pos, n), pos + n

    buf, pos = jax.lax.fori_loop(0, actions_N.shape[0], body, (buf, jnp.asarray(0, jnp.int32)))
    return write_span(buf, jnp.asarray([stop_id], jnp.int32), pos, 1), pos + 1


def parse_plan(codec, tokens_M, length, stopped, n_max: int):
    """The moves of one reply (codec action indices mapped to FrozenLake's): (actions int32[n_max] (-1 past
    n), n, ok). ok iff the reply `stopped` on a stop token and its tokens before it (length - 1 of them)
    are one or more accepted action forms back to back (at each position the longest form that matches
    is taken). Moves past n_max are dropped (they are never executed)."""
    m = tokens_M.shape[0]
    forms, flens, fact = codec.match_tokens_FaxPa, codec.match_lens_Fa, codec.match_action_Fa
    pa = forms.shape[1]
    to_env = jnp.asarray([ACTION_STRINGS.index(a) if a in ACTION_STRINGS else -1 for a in codec.actions], jnp.int32)
    content = jnp.where(stopped, jnp.asarray(length, jnp.int32) - 1, 0)
    tok = tokens_M.astype(jnp.int32)
    used_FaxPa = jnp.arange(pa)[None, :] < flens[:, None]

    def body(_, carry):
        pos, n, ok, acts = carry
        win = tok[jnp.clip(pos + jnp.arange(pa), 0, m - 1)]
        hit_Fa = jnp.all((win[None, :] == forms) | ~used_FaxPa, axis=-1) & (pos + flens <= content)
        best = jnp.argmax(jnp.where(hit_Fa, flens, -1))
        a = to_env[fact[best]]
        live = ok & (pos < content)
        good = jnp.any(hit_Fa) & (a >= 0)
        take = live & good
        acts = acts.at[jnp.where(take, n, n_max)].set(a, mode="drop")
        return pos + jnp.where(take, flens[best], 0), n + take, ok & (~live | good), acts

    init = (jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32), jnp.asarray(stopped, bool),
            jnp.full((n_max,), -1, jnp.int32))
    _, n, ok, acts = jax.lax.fori_loop(0, m, body, init)
    ok = ok & (n >= 1)
    return acts, jnp.minimum(n, n_max), ok


def execute_plan(env, task, actions_N, n_actions, budget, key, env_params):
    """success (bool) of walking actions[:min(n, budget)] from the task's start (`FrozenLake.step_action`;
    a hole or the goal ends the walk), and the number of moves made."""
    state, _ = env.reset(key, task, env_params)
    limit = jnp.minimum(jnp.asarray(n_actions, jnp.int32), jnp.asarray(budget, jnp.int32))

    def body(i, st):
        new = env.step_action(st, actions_N[i], env_params).state
        return jax.tree.map(lambda a, b: jnp.where(i < limit, a, b), new, st)

    state = jax.lax.fori_loop(0, actions_N.shape[0], body, state)
    return state.success, state.t


@functools.partial(jax.jit, static_argnames=("env", "n_max"))
def _outcomes_jit(maps_R, reply_RxM, length_R, stopped_R, budget_R, key, env_params, *, env, n_max):
    keys = jax.random.split(key, maps_R.shape[0])

    def one(task, reply, length, stopped, budget, k):
        acts, n, ok = parse_plan(env.codec, reply, length, stopped, n_max)
        success, _ = execute_plan(env, task, acts, jnp.where(ok, n, 0), budget, k, env_params)
        return success & ok, ok

    return jax.vmap(one)(maps_R, reply_RxM, length_R, stopped_R, budget_R, keys)


def plan_outcomes(world, tasks, replies, lengths, stopped, budgets, key, env_params):
    """(success bool[R], parsed bool[R]) of given replies (tokens int32[R, M], lengths int32[R], stopped
    bool[R]: ended on a stop token) to the plan prompts of `tasks` int8[R, L, L] with `budgets` (int or
    int[R]). Success as in the module docstring; `key` draws the slippery moves (none when deterministic)."""
    tasks = jnp.asarray(tasks)
    r = tasks.shape[0]
    budget_R = jnp.broadcast_to(jnp.asarray(budgets, jnp.int32), (r,))
    n_max = int(np.max(np.asarray(budget_R)))
    return _outcomes_jit(tasks, jnp.asarray(replies, jnp.int32), jnp.asarray(lengths, jnp.int32),
                         jnp.asarray(stopped, bool), budget_R, key, env_params, env=world.env, n_max=n_max)


# ----------------------------------------------------------------------------- R_single
def plan_call_rows(rows: int, batch_size: Optional[int]) -> int:
    """Rows of each of `plan_success`'s `generate` calls over `rows` replies in batches of `batch_size`."""
    return rows if batch_size is None else max(1, min(int(batch_size), rows))


def plan_success(world, cfg, params, tasks, key, *, t_max: int, n_samples: int, env_params, max_context: int,
                 batch_size: Optional[int] = None, mesh=None, compute_dtype=None, sampler: Sampler = Sampler()
                 ) -> np.ndarray:
    """success float32[P, Z] (0/1) of Z = n_samples plan replies sampled per task (module docstring) at the
    budget t_max. R_single = its mean.

    The replies are sampled by `generate` (temperature 1 by default, as the training rollouts; stop ids the
    layout's; reply limit `max_plan_tokens`; shapes `plan_generate_shape`), `batch_size` rows at a time (None: all
    P*Z rows at once; the study passes its rollout batch, so the program fits wherever its rollouts do);
    `mesh` / `compute_dtype`: `generate`'s. `key` is split into the sampling and the slippery-move keys: a
    fixed key gives common random numbers across the policies measured with it. `max_context`: the
    episode's context slots; the plan prompt plus its longest reply must fit them, as a first turn must.
    """
    if isinstance(n_samples, bool) or int(n_samples) != n_samples or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    tasks = np.asarray(tasks)
    p, z = tasks.shape[0], int(n_samples)
    width, m = plan_generate_shape(world, t_max)
    prompts, plen = plan_prompts(world, tasks, t_max, env_params, width=width)
    need = int(np.max(np.asarray(plen))) + m
    if need > max_context:
        raise ValueError(f"max_context={max_context} cannot hold a plan prompt and its reply ({need} tokens)")
    rows = p * z
    idx = np.repeat(np.arange(p), z)                  # row r = task r // Z, sample r % Z
    prompts, plen = np.asarray(prompts)[idx], np.asarray(plen)[idx]
    mask = np.arange(prompts.shape[1])[None, :] < plen[:, None]
    k_gen, k_env = jax.random.split(key)
    bs = plan_call_rows(rows, batch_size)
    replies, lengths, stopped = [], [], []
    for i, start in enumerate(range(0, rows, bs)):
        sl = np.arange(start, start + bs) % rows      # the last batch wraps: one compiled shape
        gen = generate(params, cfg, prompts[sl], jax.random.fold_in(k_gen, i), max_new_tokens=m,
                       prompt_mask_BxL=mask[sl], max_steps=m, sampler=sampler, stop_ids=world.layout.stop_ids,
                       pad_id=world.layout.pad_id, mesh=mesh, compute_dtype=compute_dtype)
        take = min(bs, rows - start)
        replies.append(np.asarray(gen.tokens)[:take])
        lengths.append(np.asarray(gen.lengths)[:take])
        stopped.append(np.asarray(gen.stopped)[:take])
    success, _ = plan_outcomes(world, tasks[idx], np.concatenate(replies), np.concatenate(lengths),
                               np.concatenate(stopped), t_max, k_env, env_params)
    return np.asarray(success, np.float32).reshape(p, z)


# ----------------------------------------------------------------------------- SFT data
@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt", "instr", "width", "m"))
def _sft_rows_jit(maps, budget_P, actions_PxN, n_P, env_params, *, env, layout, fmt, instr, width, m):
    system = jnp.asarray(layout.system, jnp.int32)
    s0 = system.shape[0]

    def one(task, budget, actions, n):
        _, obs = env.reset(jax.random.key(0), task, env_params)
        chunk, clen = plan_chunk(layout, fmt, env, obs, budget, instr)
        reply, rlen = plan_reply(env.codec, layout.end_of_turn, actions, n, m)
        row = jnp.full((width,), layout.pad_id, jnp.int32).at[:s0].set(system)
        row = write_span(row, chunk, s0, clen)
        row = write_span(row, reply, s0 + clen, rlen)
        pos = jnp.arange(width)
        policy = (pos >= s0 + clen) & (pos < s0 + clen + rlen)
        return row, policy, s0 + clen + rlen

    return jax.vmap(one)(maps, budget_P, actions_PxN, n_P)


def plan_sft_rows(world, tasks, budgets, actions, n_actions, env_params, *, width: int):
    """SFT rows of plan episodes: the plan prompt of each task with its budget, then the moves actions[p, :n_p]
    (env action indices, e.g. an expert episode's) as ONE reply closed by <|im_end|>. Returns tokens int32[P,
    width], policy_mask bool[P, width] (the reply tokens: the SFT targets) and lengths int32[P]."""
    tasks, actions = jnp.asarray(tasks), jnp.asarray(actions, jnp.int32)
    budget_P = jnp.broadcast_to(jnp.asarray(budgets, jnp.int32), (tasks.shape[0],))
    m = max_plan_tokens(world.codec, actions.shape[1])
    need = len(world.layout.system) + plan_chunk_width(world, int(jnp.max(budget_P))) + m
    if width < need:
        raise ValueError(f"width {width} cannot hold a plan episode ({need} tokens)")
    instr = tuple(int(i) for i in instruction_ids(world.codec))
    return _sft_rows_jit(tasks, budget_P, actions, jnp.asarray(n_actions, jnp.int32), env_params, env=world.env,
                         layout=world.layout, fmt=world.fmt, instr=instr, width=int(width), m=m)


def plan_sft_width(world, t_max: int) -> int:
    """Token slots of the longest plan SFT row in a study with that T_max (multiple of 16)."""
    need = len(world.layout.system) + plan_chunk_width(world, t_max) + max_plan_tokens(world.codec, t_max)
    return int(math.ceil(need / 16) * 16)
