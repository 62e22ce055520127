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

Each turn (`host_rollout`'s named steps), for all episodes at once:
  1. an episode is active if it is running and t < budget_b; an active episode whose chunk plus a full
     reply (`max_action_tokens`) does not fit into `max_context` slots ends with status
     context_exhausted instead (as in jax_loop);
  2. the active episodes' chunks are right-padded to one bucketed width (`sampling.bucket`, capped at
     `max_append_width`: a longer chunk, e.g. BFCL's system prompt, takes several calls of that width)
     and appended with one jitted `append` call that donates the KV cache;
  3. one jitted `decode` call (donating the cache) samples the replies of all active episodes;
  4. the replies are decoded to text and the envs stepped in a thread pool (`workers` threads: code and
     SQL steps spend ~0.2 s in subprocesses / SQLite, outside the GIL).
Statuses and episode_return as in jax_loop, by the rules in `episode` (done -> success or failed by
info['success']; not done after the last turn of its budget -> budget_exhausted; episode_return =
sum of rewards if the episode finished, else 0). An exception raised by the env (reset, system_prompt, step, or the process-reward
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

Settings: `HostRolloutConfig` (t_max, max_action_tokens, max_context, sampler). The JAX loop's
`RolloutConfig` is accepted when its jittable-env fields keep their defaults; a set one raises
(the host loop has no use for it), so no field is ignored silently.

Output: `HostRollout(rollout, trace)`. `rollout` is a `types.Rollout`, the pytree the jitted loop
returns (Turns [B, N]); `env_states` and `final_state` are None (host states are Python objects,
kept in `trace.final_states`). `Turns.action` is a stable hash in [0, 2**31) of a valid action's text
(equal texts, equal ids), -1 for invalid or inactive turns; `Turns.anchor` is info['anchor'] (-1 for
inactive turns and for a step that raised).

Dimension legend (CONVENTIONS.md): B episodes, S context slots (= KV-cache slots), N turns (T_max),
C append width (chunk tokens), M action tokens, V vocab.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.host.base import stable_hash
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout import episode, types
from jaxagent.rollout.episode import (BUDGET_TEMPLATE, EpisodeConfig, action_text, budget_text,  # noqa: F401
                                      observation_turn, text_reply)
from jaxagent.rollout.host_policy import HostPolicy, append_jit, decode_jit, given_replies

_append_jit, _decode_jit = append_jit, decode_jit  # the names tests/test_composable.py uses

DEFAULT_BUDGET_TEMPLATE = BUDGET_TEMPLATE  # the one budget text (`episode`)

# system_fn(env, task) -> (system content or None, tools list or None) for `chat.system_turn`.
SystemFn = Callable[[Any, Any], tuple[Optional[str], Optional[list]]]
# generate_fn(turn, active_B, contexts) -> a reply text per episode (entries where not active are
# ignored); contexts[b] is episode b's token ids so far, ending with the assistant generation prompt.
GenerateFn = Callable[[int, np.ndarray, list], Sequence[Optional[str]]]
# process_reward_fn(env, state_before, action_text, remaining_turns) -> float, called before the step
# (e.g. `lambda env, s, a, r: env.step_quality(s, a)`).
HostProcessRewardFn = Callable[[Any, Any, str, int], float]


@dataclasses.dataclass(frozen=True)
class HostRolloutConfig(EpisodeConfig):
    """Settings of a host rollout (hashable): `EpisodeConfig`'s t_max, max_action_tokens, max_context
    (KV slots per episode) and sampler; the host hooks are `host_rollout` arguments."""


def host_config(rcfg: EpisodeConfig) -> HostRolloutConfig:
    """`rcfg` as a HostRolloutConfig. A config with more fields (the JAX loop's `RolloutConfig`) is
    accepted only while each extra field has its default: the host loop would ignore it."""
    if type(rcfg) is HostRolloutConfig:
        return rcfg
    if not isinstance(rcfg, EpisodeConfig):
        raise TypeError(f"rcfg must be a HostRolloutConfig (or EpisodeConfig), got {type(rcfg).__name__}")
    base = [f.name for f in dataclasses.fields(EpisodeConfig)]
    set_extra = [f.name for f in dataclasses.fields(rcfg) if f.name not in base and getattr(rcfg, f.name) != (
        f.default_factory() if f.default is dataclasses.MISSING else f.default)]
    if set_extra:
        raise ValueError(f"host_rollout has no use for {type(rcfg).__name__}.{', '.join(set_extra)} (jittable-env "
                         "settings); for host envs pass process_reward_fn=(env, state, action_text, remaining) -> "
                         "float or generate_fn, and use HostRolloutConfig")
    return HostRolloutConfig(**{name: getattr(rcfg, name) for name in base})


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
        `eval.error_prefix.collect_error_prefixes` and similar host-side analyses."""
        return [dict(task=t, seed=s, actions=a, infos=i, dones=d, policy=policy)
                for t, s, a, i, d in zip(self.tasks, self.seeds, self.actions, self.infos, self.dones)]


class HostRollout(NamedTuple):
    rollout: types.Rollout      # the arrays RL and the diagnostics consume (as from the jitted loop)
    trace: HostTrace            # texts, infos, errors and final states, on the host


# ----------------------------------------------------------------------------- the envs' side
def _error_text(where: str, err: BaseException) -> str:
    return f"{where}: {type(err).__name__}: {err}"


@dataclasses.dataclass(frozen=True)
class _Envs:
    """The host envs of a rollout: reset and step one episode, building its next chunk (thread-safe: no
    shared state is written)."""

    env: Any
    tokenizer: Tokenizer
    pieces: Any                 # chat.turn_pieces
    tasks: list
    seeds: list
    budget_B: np.ndarray
    hide_budget: bool
    budget_template: str
    system_fn: SystemFn
    process_reward_fn: Optional[HostProcessRewardFn]

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


# ----------------------------------------------------------------------------- the episodes' buffers
@dataclasses.dataclass
class _Buffers:
    """The Rollout's arrays, built on the host, and per-episode bookkeeping."""

    tokens: np.ndarray          # int32 [B, S]
    policy: np.ndarray          # bool [B, S]
    turn_index: np.ndarray      # int32 [B, S]
    logp: np.ndarray            # f32 [B, S]
    length: np.ndarray          # int32 [B]
    status: np.ndarray          # int32 [B]
    rec: dict                   # Turns fields, [B, N] each
    trace: HostTrace
    states: list                # env state per episode
    pending: list               # ids of each episode's next chunk
    n_system: np.ndarray        # int32 [B] system-turn tokens at the head of chunk 0

    @classmethod
    def empty(cls, hcfg: HostRolloutConfig, pad_id: int, tasks: list, seeds: list) -> "_Buffers":
        n_ep, s, n_turns = len(tasks), hcfg.max_context, hcfg.t_max
        rec = {name: np.zeros((n_ep, n_turns), dtype) for name, dtype in (
            ("active", bool), ("reward", np.float32), ("process_reward", np.float32), ("valid", bool),
            ("span_start", np.int32), ("span_len", np.int32), ("stopped", bool), ("remaining", np.int32),
            ("forced", bool))}
        rec["action"] = np.full((n_ep, n_turns), -1, np.int32)
        rec["anchor"] = np.full((n_ep, n_turns), -1, np.int32)
        trace = HostTrace(tasks=tasks, seeds=seeds, errors=[None] * n_ep, actions=[[] for _ in range(n_ep)],
                          observations=[[] for _ in range(n_ep)], infos=[[] for _ in range(n_ep)],
                          dones=[[] for _ in range(n_ep)], final_states=[None] * n_ep)
        return cls(tokens=np.full((n_ep, s), pad_id, np.int32), policy=np.zeros((n_ep, s), bool),
                   turn_index=np.full((n_ep, s), -1, np.int32), logp=np.zeros((n_ep, s), np.float32),
                   length=np.zeros((n_ep,), np.int32), status=np.full((n_ep,), types.RUNNING, np.int32), rec=rec,
                   trace=trace, states=[None] * n_ep, pending=[[] for _ in range(n_ep)],
                   n_system=np.zeros((n_ep,), np.int32))

    def to_rollout(self, budget_B) -> types.Rollout:
        rec, status = self.rec, self.status
        ret = episode.episode_return(status, rec["reward"]).astype(np.float32)
        return types.Rollout(
            tokens=jnp.asarray(self.tokens), policy_mask=jnp.asarray(self.policy),
            turn_index=jnp.asarray(self.turn_index), logprobs=jnp.asarray(self.logp), length=jnp.asarray(self.length),
            turns=types.Turns(**{k: jnp.asarray(v) for k, v in rec.items()}), env_states=None, final_state=None,
            episode_return=jnp.asarray(ret), success=jnp.asarray(status == types.SUCCESS),
            turns_used=jnp.asarray(rec["active"].sum(1).astype(np.int32)), budget=jnp.asarray(budget_B),
            status=jnp.asarray(status), generated_tokens=jnp.asarray(self.policy.sum(1).astype(np.int32)))


# ----------------------------------------------------------------------------- the named steps
def _check_inputs(env, rcfg, tasks, budgets, workers, max_append_width, forced_actions):
    """Host-side checks; returns (HostRolloutConfig, tasks list, budgets int32[B])."""
    if getattr(env, "jittable", False):
        raise ValueError("host_rollout runs host (Python) envs; use jaxagent.rollout.rollout for jittable envs")
    hcfg = host_config(rcfg)
    tasks = list(tasks)
    budget_B = budgets_lib.validate_budgets(budgets, hcfg.t_max)
    if budget_B.ndim != 1 or budget_B.shape[0] != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but budgets has shape {budget_B.shape}; give one budget per task")
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if max_append_width < 16 or max_append_width & (max_append_width - 1):
        raise ValueError(f"max_append_width must be a power of two >= 16, got {max_append_width}")
    if forced_actions is not None and len(forced_actions) != len(tasks):
        raise ValueError(f"forced_actions has {len(forced_actions)} rows for {len(tasks)} tasks")
    return hcfg, tasks, budget_B


def _reset_all(buf: _Buffers, envs: _Envs, run_all, hcfg: HostRolloutConfig):
    """Reset every episode: its first chunk (system turn + first user turn) becomes pending."""
    for b, res in enumerate(run_all(envs.reset, range(len(envs.tasks)))):
        if isinstance(res, Exception):
            buf.status[b], buf.trace.errors[b] = types.FAILED, _error_text("reset", res)
            continue
        buf.states[b], obs, sys_ids, first = res
        buf.trace.observations[b].append(obs)
        buf.pending[b], buf.n_system[b] = sys_ids + first, len(sys_ids)
    need = [len(p) + hcfg.max_action_tokens for b, p in enumerate(buf.pending) if buf.status[b] == types.RUNNING]
    if need and min(need) > hcfg.max_context:
        raise ValueError(f"max_context={hcfg.max_context} cannot hold even one turn of any episode (the shortest "
                         f"needs {min(need)} tokens: system prompt, first observation and a full reply)")


def _write_chunks(buf: _Buffers, t: int, budget_B, hcfg: HostRolloutConfig):
    """Step 1: who plays turn t (`episode.turn_start`); the players' pending chunks written into their rows.
    Returns (active [B], first reply slot [B])."""
    chunk_len = np.asarray([len(p) for p in buf.pending], np.int32)
    fits = buf.length + chunk_len + hcfg.max_action_tokens <= hcfg.max_context
    buf.status, active = episode.turn_start(buf.status, t, budget_B, fits)
    for b in np.flatnonzero(active):
        sl = slice(buf.length[b], buf.length[b] + chunk_len[b])
        buf.tokens[b, sl] = buf.pending[b]
        buf.turn_index[b, buf.length[b] + (buf.n_system[b] if t == 0 else 0):sl.stop] = t
    return active, buf.length + np.where(active, chunk_len, 0)


def _replies(buf: _Buffers, policy: Optional[HostPolicy], t: int, active, start_slot, given: dict,
             generate_fn: Optional[GenerateFn], tokenizer: Tokenizer, hcfg: HostRolloutConfig):
    """Step 2: the replies of turn t, given (`forced_actions`), scripted (`generate_fn`) or sampled:
    numpy (tokens [B, M], logprobs [B, M], lengths [B], stopped [B])."""
    n_ep, m, pad = buf.tokens.shape[0], hcfg.max_action_tokens, tokenizer.pad_id
    idx = np.flatnonzero(active)
    if generate_fn is not None:
        script = list(generate_fn(t, active.copy(), [buf.tokens[b, :start_slot[b]] for b in range(n_ep)]))
        if len(script) != n_ep:
            raise ValueError(f"generate_fn returned {len(script)} replies for {n_ep} episodes")
        return given_replies({b: given.get(b, script[b]) for b in idx}, n_ep, tokenizer, m, pad)
    policy.append([buf.pending[b] if active[b] else [] for b in range(n_ep)])
    is_given = np.isin(np.arange(n_ep), list(given))
    r_tok, r_lp, r_len, r_stop = policy.sample(active & ~is_given)
    if given:  # the given replies go into the cache as well
        g_tok, g_lp, g_len, g_stop = given_replies(given, n_ep, tokenizer, m, pad)
        policy.append([list(g_tok[b, :g_len[b]]) for b in range(n_ep)])
        for b in given:
            r_tok[b], r_lp[b], r_len[b], r_stop[b] = g_tok[b], g_lp[b], g_len[b], g_stop[b]
    return r_tok, r_lp, r_len, r_stop


def _write_replies(buf: _Buffers, t: int, active, start_slot, replies, trains, tokenizer: Tokenizer) -> dict:
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


def _step_envs(buf: _Buffers, envs: _Envs, run_all, t: int, active, start_slot, replies, texts: dict, is_forced,
               tokenizer: Tokenizer):
    """Step 3: the envs stepped on the replies' texts; the turn recorded and the statuses moved on
    (`episode.after_step`); an env exception fails its own episode."""
    r_tok, _, r_len, r_stop = replies
    idx = np.flatnonzero(active)
    closed = [bool(r_len[b] and r_tok[b, r_len[b] - 1] == tokenizer.im_end_id) for b in idx]
    results = run_all(envs.step, idx, [t] * len(idx), [buf.states[b] for b in idx], [texts[b] for b in idx], closed)
    rec, trace = buf.rec, buf.trace
    stepped, done_B, success_B, errors = np.zeros_like(active), np.zeros_like(active), np.zeros_like(active), {}
    for b, res in zip(idx, results):
        rec["active"][b, t], rec["forced"][b, t] = True, is_forced[b]
        rec["span_start"][b, t], rec["span_len"][b, t] = start_slot[b], r_len[b]
        rec["stopped"][b, t] = bool(r_stop[b])
        rec["remaining"][b, t] = envs.budget_B[b] - t
        trace.actions[b].append(texts[b])
        buf.pending[b] = []
        if isinstance(res, Exception):
            errors[b] = _error_text(f"step {t}", res)
            trace.infos[b].append({"valid": False, "success": False, "error": errors[b], "env_exception": True})
            trace.dones[b].append(True)
            continue
        buf.states[b], obs, info, (reward, done, valid, success, anchor, proc), chunk = res
        trace.observations[b].append(obs)
        trace.infos[b].append(info)
        trace.dones[b].append(done)
        rec["reward"][b, t], rec["process_reward"][b, t], rec["valid"][b, t] = reward, proc, valid
        rec["action"][b, t] = stable_hash(texts[b]) if valid else -1
        rec["anchor"][b, t] = anchor
        stepped[b], done_B[b], success_B[b] = True, done, success
        if chunk is not None:
            buf.pending[b] = chunk
    buf.status = episode.after_step(buf.status, stepped, done_B, success_B, episode.out_of_budget(t, envs.budget_B))
    for b, err in errors.items():
        buf.status[b], trace.errors[b] = types.FAILED, err


def host_rollout(params, cfg, env, tokenizer: Tokenizer, tasks: Sequence, budgets, key, rcfg: EpisodeConfig, *,
                 hide_budget: bool = False, enable_thinking: bool = False, workers: int = 4,
                 budget_template: str = BUDGET_TEMPLATE, system_fn: Optional[SystemFn] = None,
                 max_append_width: int = 1024, process_reward_fn: Optional[HostProcessRewardFn] = None,
                 generate_fn: Optional[GenerateFn] = None,
                 forced_actions: Optional[Sequence[Sequence[Optional[str]]]] = None) -> HostRollout:
    """Runs len(tasks) episodes of the host env `env`: episode b on tasks[b] with budget budgets[b].

    params, cfg: the Qwen3 policy (unused, may be None, with `generate_fn`).
    rcfg: a HostRolloutConfig (t_max, max_action_tokens, max_context = KV slots per episode, sampler); a
      JAX-loop RolloutConfig whose jittable-env fields are set raises (`host_config`).
    hide_budget: no budget text in the prompts (the episodes still stop at their budgets).
    enable_thinking: False appends Qwen3's empty think block to every generation prompt.
    workers: threads that step the envs (1: in this thread).
    budget_template: str.format template with {turn} (1-based), {budget} and {remaining} (including
      this turn); default the one budget text, `episode.BUDGET_TEMPLATE`.
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
    hcfg, tasks, budget_B = _check_inputs(env, rcfg, tasks, budgets, workers, max_append_width, forced_actions)
    n_ep = len(tasks)
    pieces = chat.turn_pieces(tokenizer, enable_thinking=enable_thinking)
    k_reset, k_loop = jax.random.split(key)
    seeds = [int(x) for x in np.asarray(jax.random.randint(k_reset, (n_ep,), 0, 2**31 - 1))]
    envs = _Envs(env, tokenizer, pieces, tasks, seeds, budget_B, hide_budget, budget_template,
                 default_system if system_fn is None else system_fn, process_reward_fn)
    buf = _Buffers.empty(hcfg, tokenizer.pad_id, tasks, seeds)
    policy = None if generate_fn is not None else HostPolicy(
        params, cfg, hcfg, tuple(int(i) for i in pieces.stop_ids), tokenizer.pad_id, max_append_width, k_loop)

    def forced_text(b, t):
        row = forced_actions[b] if forced_actions is not None else ()
        return row[t] if t < len(row) else None

    pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 1 else None
    run_all = (lambda f, *xs: list(pool.map(f, *xs))) if pool else (lambda f, *xs: list(map(f, *xs)))
    try:
        _reset_all(buf, envs, run_all, hcfg)
        if policy is not None:
            policy.start(n_ep)
        for t in range(hcfg.t_max):
            active, start_slot = _write_chunks(buf, t, budget_B, hcfg)
            if not active.any():
                break
            given = {b: forced_text(b, t) for b in np.flatnonzero(active)}
            given = {b: x for b, x in given.items() if x is not None}
            is_given = np.isin(np.arange(n_ep), list(given))
            r_tok, r_lp, r_len, r_stop = _replies(buf, policy, t, active, start_slot, given, generate_fn, tokenizer,
                                                  hcfg)
            replies = (r_tok, r_lp, np.where(active, r_len, 0).astype(np.int32), r_stop)
            is_forced = active & (is_given | (generate_fn is not None))
            trains = active & ~is_given  # a scripted policy's replies are its SFT targets
            texts = _write_replies(buf, t, active, start_slot, replies, trains, tokenizer)
            _step_envs(buf, envs, run_all, t, active, start_slot, replies, texts, is_forced, tokenizer)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    buf.trace.final_states = buf.states
    return HostRollout(buf.to_rollout(budget_B), buf.trace)
