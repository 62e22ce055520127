"""The multi-turn rollout for host (Python) environments: a Python turn loop around jitted generation.

Per episode the context is Qwen3's chat format, append-only, so the KV cache is reused across turns:

    <|im_start|>system\\n{system prompt}<|im_end|>\\n                      turn index -1
    <|im_start|>user\\n{budget text}\\n{first observation}<|im_end|>\\n     turn 0 (chunk 0)
    <|im_start|>assistant\\n[empty think]
    {reply_0 ... <|im_end|>}                                             reply tokens, turn 0
    [<|im_end|> if reply_0 did not end with it (token limit)]            turn 1 (chunk 1)
    \\n<|im_start|>user\\n{budget text}\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n[empty think]
    {reply_1 ... <|im_end|>} ...

An observation with info['obs_role'] == 'tool' becomes Qwen3's tool-result turn: the user turn's body
is `<tool_response>\\n...\\n</tool_response>` blocks (kept as they are when the env already wrote them,
as BFCL does; otherwise the observation is wrapped in one block). Chunks are tokenised on the host
with `chat.system_turn`, `chat.user_turn` and `chat.turn_pieces`, whose pieces start at, or end right
before, a control token, so the ids equal Qwen3's template (no BPE merge across a piece boundary).

Each turn, for all episodes at once:
  1. an episode is active if it is running and t < budget_b; an active episode whose chunk plus a full
     reply (`max_action_tokens`) does not fit into `max_context` slots ends with status
     context_exhausted instead (as in jax_loop);
  2. the active episodes' chunks are right-padded to one bucketed width (`sampling.bucket`, capped at
     `max_append_width`: a longer chunk, e.g. BFCL's system prompt, takes several calls of that width)
     and appended with one jitted `append` call that donates the KV cache;
  3. one jitted `decode` call (donating the cache) samples the replies of all active episodes;
  4. the replies are decoded to text and the envs stepped in a thread pool (`workers` threads: code and
     SQL steps spend ~0.2 s in subprocesses / SQLite, outside the GIL).
Statuses as in jax_loop: done -> success or failed (info['success']); not done after the last turn
of its budget -> budget_exhausted; episode_return = sum of rewards if the episode finished (success
or failed), else 0. An exception raised by the env (reset, system_prompt, step, or the process-reward
hook) or a malformed step result (an observation that is not a str, an info that is not a dict)
never stops the rollout: that episode ends with status failed, the error text in
`HostTrace.errors[b]` (a caller error, e.g. a bad `generate_fn` reply, still raises).

Replies not sampled from the model (`Turns.forced`, logprob 0), as in jax_loop's scripted and
forced paths: with `generate_fn` (a scripted policy replacing the model: it is the acting policy, so
its tokens are in `policy_mask`, the SFT targets) and with `forced_actions` (given texts that the
model then continues from, e.g. error prefixes: not in `policy_mask`). A given text is written as
encode(text) + <|im_end|>, cut at `max_action_tokens`.

Compiles: `append` once per distinct width (powers of two from 16 to `max_append_width`) and `decode`
once, per (batch size, max_context, model, sampler); never per turn.

Output: `HostRollout(rollout, trace)`. `rollout` is a `types.Rollout`, the pytree the jitted loop
returns (Turns [B, N]); `env_states` and `final_state` are None (host states are Python objects,
kept in `trace.final_states`). `Turns.action` is a stable hash in [0, 2**31) of a valid action's text
(equal texts, equal ids), -1 for invalid or inactive turns; `Turns.anchor` is info['anchor'] (-1 for
inactive turns and for a step that raised).

Legend: B episodes, S context slots (= KV-cache slots), N turns (T_max), W chunk width, M action
tokens, V vocab.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs import budgets as budgets_lib
from jaxagent.envs.host import stable_hash
from jaxagent.models import chat, qwen3
from jaxagent.models.tokenizer import TOOL_RESPONSE, TOOL_RESPONSE_END, Tokenizer
from jaxagent.rollout import types
from jaxagent.rollout.jax_loop import RolloutConfig
from jaxagent.sampling import append, bucket, decode
from jaxagent import xla_options

DEFAULT_BUDGET_TEMPLATE = "Turn {turn} of {budget}. {remaining} turns left."

# system_fn(env, task) -> (system content or None, tools list or None) for `chat.system_turn`.
SystemFn = Callable[[Any, Any], tuple[Optional[str], Optional[list]]]
# generate_fn(turn, active_B, contexts) -> a reply text per episode (entries where not active are
# ignored); contexts[b] is episode b's token ids so far, ending with the assistant generation prompt.
GenerateFn = Callable[[int, np.ndarray, list], Sequence[Optional[str]]]
# process_reward_fn(env, state_before, action_text, remaining_turns) -> float, called before the step
# (e.g. `lambda env, s, a, r: env.step_quality(s, a)`).
HostProcessRewardFn = Callable[[Any, Any, str, int], float]


def default_system(env, task) -> tuple[Optional[str], Optional[list]]:
    """The env's system prompt verbatim and no separate tool list: the host env with tools (BFCL)
    already lists them, with the tool-call protocol, in `system_prompt`; passing `env.tools(...)` too
    would list them twice. For an env whose prompt omits its tools, Qwen3's native tool layout is
    `system_fn=lambda env, task: (env.system_prompt(task), env.tools(task, 0))`."""
    return env.system_prompt(task), None


@dataclasses.dataclass
class HostTrace:
    """Host-side record of a host rollout; every field is a list over episodes b."""

    tasks: list
    seeds: list                 # the seed env.reset got
    errors: list                # None, or the exception the env raised ("where: Type: message")
    actions: list               # [b][t] the reply text the env was stepped with
    observations: list          # [b][k]: k = 0 the reset observation, k = t + 1 the one after turn t
    infos: list                 # [b][t] the env's info dict of each step
    dones: list                 # [b][t] the env's done flag of each step
    final_states: list          # env state after the last step (None if the reset failed)

    def trajectories(self, policy: str = "") -> list[dict]:
        """Per episode {task, seed, actions, infos, dones, policy}: the input of
        `bfcl_env.collect_error_prefixes` and similar host-side analyses."""
        return [dict(task=t, seed=s, actions=a, infos=i, dones=d, policy=policy)
                for t, s, a, i, d in zip(self.tasks, self.seeds, self.actions, self.infos, self.dones)]


class HostRollout(NamedTuple):
    rollout: types.Rollout      # the arrays RL and the diagnostics consume (as from the jitted loop)
    trace: HostTrace            # texts, infos, errors and final states, on the host


@functools.partial(xla_options.jit, static_argnames=("cfg",), donate_argnames=("cache", "logits_BxV"))
def _append_jit(params, cache, tokens_BxW, n_valid_B, logits_BxV, *, cfg):
    """Appends each row's first n_valid tokens; rows with n_valid 0 keep their previous logits."""
    new_BxV, cache = append(params, cfg, cache, tokens_BxW, n_valid_B)
    return jnp.where((n_valid_B > 0)[:, None], new_BxV, logits_BxV), cache


@functools.partial(xla_options.jit, static_argnames=("cfg", "max_steps", "sampler", "stop_ids", "pad_id"),
                   donate_argnames=("cache",))
def _decode_jit(params, cache, logits_BxV, key, active_B, *, cfg, max_steps, sampler, stop_ids, pad_id):
    return decode(params, cfg, cache, logits_BxV, key, max_steps, max_steps=max_steps, sampler=sampler,
                  stop_ids=stop_ids, pad_id=pad_id, active_B=active_B)


def budget_text(template: str, t: int, budget: int) -> str:
    """The announced budget of turn t (0-based, shown 1-based), e.g. "Turn 2 of 5. 4 turns left."."""
    return template.format(turn=t + 1, budget=budget, remaining=budget - t)


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


def _append_rows(params, cfg, cache, logits_BxV, rows: list, pad_id: int, max_width: int):
    """Appends rows[b] (a list of ids, maybe empty) to every row's cache with one jitted call of a
    bucketed width, or several calls of `max_width` for longer rows; returns (logits, cache)."""
    n_B = np.asarray([len(r) for r in rows], np.int32)
    n_max = int(n_B.max())
    width = min(bucket(n_max), max_width)
    for off in range(0, n_max, width):
        n_piece_B = np.clip(n_B - off, 0, width).astype(np.int32)
        piece_BxW = np.full((len(rows), width), pad_id, np.int32)
        for b in np.flatnonzero(n_piece_B):
            piece_BxW[b, :n_piece_B[b]] = rows[b][off:off + n_piece_B[b]]
        logits_BxV, cache = _append_jit(params, cache, jnp.asarray(piece_BxW), jnp.asarray(n_piece_B), logits_BxV,
                                        cfg=cfg)
    return logits_BxV, cache


def _given_replies(texts: dict, n_ep: int, tokenizer: Tokenizer, m: int, pad_id: int):
    """Replies from texts {b: text}: (tokens [B, M], logprobs [B, M] zeros, lengths [B], stopped [B])."""
    tok_BxM = np.full((n_ep, m), pad_id, np.int32)
    len_B, stop_B = np.zeros((n_ep,), np.int32), np.zeros((n_ep,), bool)
    for b, text in texts.items():
        ids, stop_B[b] = text_reply(tokenizer, text, m)
        tok_BxM[b, :len(ids)], len_B[b] = ids, len(ids)
    return tok_BxM, np.zeros((n_ep, m), np.float32), len_B, stop_B


def _error_text(where: str, err: BaseException) -> str:
    return f"{where}: {type(err).__name__}: {err}"


def host_rollout(params, cfg, env, tokenizer: Tokenizer, tasks: Sequence, budgets, key, rcfg: RolloutConfig, *,
                 hide_budget: bool = False, enable_thinking: bool = False, workers: int = 4,
                 budget_template: str = DEFAULT_BUDGET_TEMPLATE, system_fn: Optional[SystemFn] = None,
                 max_append_width: int = 1024, process_reward_fn: Optional[HostProcessRewardFn] = None,
                 generate_fn: Optional[GenerateFn] = None,
                 forced_actions: Optional[Sequence[Sequence[Optional[str]]]] = None) -> HostRollout:
    """Runs len(tasks) episodes of the host env `env`: episode b on tasks[b] with budget budgets[b].

    params, cfg: the Qwen3 policy (unused, may be None, with `generate_fn`).
    rcfg: t_max, max_action_tokens, max_context (KV slots per episode) and sampler are used; its
      jittable-env hooks (process_reward_fn, expert_fn) must be None: see the arguments below.
    hide_budget: no budget text in the prompts (the episodes still stop at their budgets).
    enable_thinking: False appends Qwen3's empty think block to every generation prompt.
    workers: threads that step the envs (1: in this thread).
    budget_template: str.format template with {turn} (1-based), {budget} and {remaining} (including
      this turn).
    system_fn: (env, task) -> (system content, tools) of the system turn; default `default_system`.
    max_append_width: the widest append call (a power of two >= 16); longer chunks take several.
    process_reward_fn: host hook (env, state_before, action_text, remaining) -> float, recorded in
      Turns.process_reward (it must not change the state).
    generate_fn: a scripted policy replacing the model (module docstring).
    forced_actions: [B][t] reply texts (None or a missing entry: the model replies) that episode b
      replies at turn t instead of sampling (module docstring).

    Returns HostRollout(rollout: types.Rollout, trace: HostTrace) (module docstring).
    Raises ValueError for a jittable env, a task/budget count mismatch, budgets outside [1, t_max],
    bad settings, or when no episode's first turn fits into max_context (an episode whose first turn
    alone does not fit ends with status context_exhausted after 0 turns).
    """
    if getattr(env, "jittable", False):
        raise ValueError("host_rollout runs host (Python) envs; use jaxagent.rollout.rollout for jittable envs")
    if rcfg.process_reward_fn is not None or getattr(rcfg, "expert_fn", None) is not None:
        raise ValueError("rcfg.process_reward_fn / rcfg.expert_fn are jittable-env hooks; for host envs pass "
                         "process_reward_fn=(env, state, action_text, remaining) -> float or generate_fn")
    tasks = list(tasks)
    budget_B = budgets_lib.validate_budgets(budgets, rcfg.t_max)
    if budget_B.ndim != 1 or budget_B.shape[0] != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but budgets has shape {budget_B.shape}; give one budget per task")
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if max_append_width < 16 or max_append_width & (max_append_width - 1):
        raise ValueError(f"max_append_width must be a power of two >= 16, got {max_append_width}")
    if forced_actions is not None and len(forced_actions) != len(tasks):
        raise ValueError(f"forced_actions has {len(forced_actions)} rows for {len(tasks)} tasks")
    system_fn = default_system if system_fn is None else system_fn

    n_ep, s, m, n_turns = len(tasks), rcfg.max_context, rcfg.max_action_tokens, rcfg.t_max
    pieces = chat.turn_pieces(tokenizer, enable_thinking=enable_thinking)
    stop_ids = tuple(int(i) for i in pieces.stop_ids)
    pad = tokenizer.pad_id
    k_reset, k_loop = jax.random.split(key)
    seeds = [int(x) for x in np.asarray(jax.random.randint(k_reset, (n_ep,), 0, 2**31 - 1))]

    def forced_text(b, t):
        row = forced_actions[b] if forced_actions is not None else ()
        return row[t] if t < len(row) else None

    # The Rollout's arrays, built on the host; then per-episode bookkeeping.
    tokens = np.full((n_ep, s), pad, np.int32)
    policy = np.zeros((n_ep, s), bool)
    turn_index = np.full((n_ep, s), -1, np.int32)
    logp = np.zeros((n_ep, s), np.float32)
    length = np.zeros((n_ep,), np.int32)
    status = np.full((n_ep,), types.RUNNING, np.int32)
    rec = {name: np.zeros((n_ep, n_turns), dtype) for name, dtype in (
        ("active", bool), ("reward", np.float32), ("process_reward", np.float32), ("valid", bool),
        ("span_start", np.int32), ("span_len", np.int32), ("stopped", bool), ("remaining", np.int32),
        ("forced", bool))}
    rec["action"] = np.full((n_ep, n_turns), -1, np.int32)
    rec["anchor"] = np.full((n_ep, n_turns), -1, np.int32)
    trace = HostTrace(tasks=tasks, seeds=seeds, errors=[None] * n_ep, actions=[[] for _ in range(n_ep)],
                      observations=[[] for _ in range(n_ep)], infos=[[] for _ in range(n_ep)],
                      dones=[[] for _ in range(n_ep)], final_states=[None] * n_ep)
    states: list = [None] * n_ep
    pending: list = [[] for _ in range(n_ep)]   # ids of each episode's next chunk
    n_system = np.zeros((n_ep,), np.int32)       # system-turn tokens at the head of chunk 0

    def start(b):
        """Reset episode b and build its first chunk: (state, obs, system ids, rest) or the exception."""
        try:
            state, obs = env.reset(seeds[b], tasks[b])
            content, tools = system_fn(env, tasks[b])
            sys_ids = chat.system_turn(tokenizer, content, tools)
            btext = None if hide_budget else budget_text(budget_template, 0, int(budget_B[b]))
            return state, obs, sys_ids, observation_turn(tokenizer, obs, "user", btext) + list(
                pieces.generation_prompt)
        except Exception as err:  # noqa: BLE001 -- an env failure ends only its own episode
            if getattr(err, "infrastructure_error", False):
                raise  # the sandbox failed, not the model: never score it as the model's 0
            return err

    def step(b, t, text, closed):
        """Step episode b at turn t and build its next chunk (None when the episode ends here):
        (state, obs, info, (reward, done, valid, success, anchor, process reward), chunk) or the
        exception raised (by the env, or on its malformed output)."""
        try:
            remaining = int(budget_B[b]) - t
            proc = 0.0 if process_reward_fn is None else float(process_reward_fn(env, states[b], text, remaining))
            state, obs, reward, done, info = env.step(states[b], text)
            if not isinstance(info, dict):
                raise TypeError(f"env.step returned info of type {type(info).__name__}, expected dict")
            nums = (float(reward), bool(done), bool(info.get("valid", True)), bool(info.get("success", False)),
                    int(info.get("anchor", -1)), proc)
            chunk = None
            if not nums[1] and t + 1 < budget_B[b]:
                btext = None if hide_budget else budget_text(budget_template, t + 1, int(budget_B[b]))
                chunk = (([] if closed else [tokenizer.im_end_id]) + list(pieces.after_reply)
                         + observation_turn(tokenizer, obs, info.get("obs_role", "user"), btext)
                         + list(pieces.generation_prompt))
            return state, obs, info, nums, chunk
        except Exception as err:  # noqa: BLE001
            if getattr(err, "infrastructure_error", False):
                raise
            return err

    pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 1 else None
    run_all = (lambda f, *xs: list(pool.map(f, *xs))) if pool else (lambda f, *xs: list(map(f, *xs)))
    try:
        for b, res in enumerate(run_all(start, range(n_ep))):
            if isinstance(res, Exception):
                status[b], trace.errors[b] = types.FAILED, _error_text("reset", res)
                continue
            states[b], obs, sys_ids, first = res
            trace.observations[b].append(obs)
            pending[b], n_system[b] = sys_ids + first, len(sys_ids)
        need = [len(p) + m for b, p in enumerate(pending) if status[b] == types.RUNNING]
        if need and min(need) > s:
            raise ValueError(f"max_context={s} cannot hold even one turn of any episode (the shortest needs "
                             f"{min(need)} tokens: system prompt, first observation and a full reply)")

        cache = logits = None
        if generate_fn is None:
            cache = qwen3.init_cache(cfg, n_ep, s, jax.tree.leaves(params)[0].dtype)
            logits = jnp.zeros((n_ep, cfg.vocab_size), jnp.float32)

        for t in range(n_turns):
            # 1. who plays this turn; the context limit
            running = (status == types.RUNNING) & (t < budget_B)
            chunk_len = np.asarray([len(p) for p in pending], np.int32)
            fits = length + chunk_len + m <= s
            status[running & ~fits] = types.CONTEXT_EXHAUSTED
            active = running & fits
            if not active.any():
                break
            idx = np.flatnonzero(active)
            for b in idx:
                sl = slice(length[b], length[b] + chunk_len[b])
                tokens[b, sl] = pending[b]
                turn_index[b, length[b] + (n_system[b] if t == 0 else 0):sl.stop] = t
            start_slot = length + np.where(active, chunk_len, 0)

            # 2. the replies: given (forced_actions), scripted (generate_fn) or sampled
            given = {b: forced_text(b, t) for b in idx}
            given = {b: x for b, x in given.items() if x is not None}
            is_given = np.isin(np.arange(n_ep), list(given))
            if generate_fn is not None:
                script = list(generate_fn(t, active.copy(), [tokens[b, :start_slot[b]] for b in range(n_ep)]))
                if len(script) != n_ep:
                    raise ValueError(f"generate_fn returned {len(script)} replies for {n_ep} episodes")
                r_tok, r_lp, r_len, r_stop = _given_replies({b: given.get(b, script[b]) for b in idx}, n_ep,
                                                            tokenizer, m, pad)
            else:
                logits, cache = _append_rows(params, cfg, cache, logits,
                                             [pending[b] if active[b] else [] for b in range(n_ep)], pad,
                                             max_append_width)
                k_loop, k_dec = jax.random.split(k_loop)
                gen = _decode_jit(params, cache, logits, k_dec, jnp.asarray(active & ~is_given), cfg=cfg,
                                  max_steps=m, sampler=rcfg.sampler, stop_ids=stop_ids, pad_id=pad)
                cache = gen.cache
                r_tok, r_lp, r_len, r_stop = (np.array(x) for x in jax.device_get(
                    (gen.tokens, gen.logprobs, gen.lengths, gen.stopped)))
                if given:  # the given replies go into the cache as well
                    g_tok, g_lp, g_len, g_stop = _given_replies(given, n_ep, tokenizer, m, pad)
                    logits, cache = _append_rows(params, cfg, cache, logits,
                                                 [list(g_tok[b, :g_len[b]]) for b in range(n_ep)], pad,
                                                 max_append_width)
                    for b in given:
                        r_tok[b], r_lp[b], r_len[b], r_stop[b] = g_tok[b], g_lp[b], g_len[b], g_stop[b]
            r_len = np.where(active, r_len, 0).astype(np.int32)
            length = start_slot + r_len
            is_forced = active & (is_given | (generate_fn is not None))
            trains = active & ~is_given  # a scripted policy's replies are its SFT targets

            texts = {}
            for b in idx:
                sl = slice(start_slot[b], start_slot[b] + r_len[b])
                tokens[b, sl] = r_tok[b, :r_len[b]]
                policy[b, sl] = trains[b]
                turn_index[b, sl] = t
                logp[b, sl] = r_lp[b, :r_len[b]]
                texts[b] = action_text(tokenizer, r_tok[b, :r_len[b]], bool(r_stop[b]))

            # 3. the environments
            closed = [bool(r_len[b] and r_tok[b, r_len[b] - 1] == tokenizer.im_end_id) for b in idx]
            results = run_all(step, idx, [t] * len(idx), [texts[b] for b in idx], closed)
            for b, res in zip(idx, results):
                rec["active"][b, t], rec["forced"][b, t] = True, is_forced[b]
                rec["span_start"][b, t], rec["span_len"][b, t] = start_slot[b], r_len[b]
                rec["stopped"][b, t] = bool(r_stop[b])
                rec["remaining"][b, t] = budget_B[b] - t
                trace.actions[b].append(texts[b])
                pending[b] = []
                if isinstance(res, Exception):
                    status[b], trace.errors[b] = types.FAILED, _error_text(f"step {t}", res)
                    trace.infos[b].append({"valid": False, "success": False, "error": trace.errors[b],
                                           "env_exception": True})
                    trace.dones[b].append(True)
                    continue
                states[b], obs, info, (reward, done, valid, success, anchor, proc), chunk = res
                trace.observations[b].append(obs)
                trace.infos[b].append(info)
                trace.dones[b].append(done)
                rec["reward"][b, t], rec["process_reward"][b, t], rec["valid"][b, t] = reward, proc, valid
                rec["action"][b, t] = stable_hash(texts[b]) if valid else -1
                rec["anchor"][b, t] = anchor
                if done:
                    status[b] = types.SUCCESS if success else types.FAILED
                elif chunk is None:
                    status[b] = types.BUDGET_EXHAUSTED
                else:
                    pending[b] = chunk
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    trace.final_states = states

    finished = (status == types.SUCCESS) | (status == types.FAILED)
    ret = np.where(finished, rec["reward"].sum(1), 0.0).astype(np.float32)
    out = types.Rollout(
        tokens=jnp.asarray(tokens), policy_mask=jnp.asarray(policy), turn_index=jnp.asarray(turn_index),
        logprobs=jnp.asarray(logp), length=jnp.asarray(length),
        turns=types.Turns(**{k: jnp.asarray(v) for k, v in rec.items()}), env_states=None, final_state=None,
        episode_return=jnp.asarray(ret), success=jnp.asarray(status == types.SUCCESS),
        turns_used=jnp.asarray(rec["active"].sum(1).astype(np.int32)), budget=jnp.asarray(budget_B),
        status=jnp.asarray(status), generated_tokens=jnp.asarray(policy.sum(1).astype(np.int32)))
    return HostRollout(out, trace)
