"""The multi-turn rollout for jittable environments: one jitted function, `lax.scan` over T_max turns.

Each turn, for every episode at once:
  1. an episode is active if it is unfinished, has budget left (t < budget_b) and its context has room for this
     turn's prompt chunk plus a full reply (else: status context_exhausted);
  2. the prompt chunk [turn opener, budget text, observation, assistant opener] is appended to the episode's KV
     cache (inactive episodes append nothing); after a reply that hit `max_action_tokens` the opener starts with
     <|im_end|> (`episode.reply_closed`, the rule both loops share);
  3. the policy samples a reply (stop token or `max_action_tokens`), written into the cache too;
  4. the env steps on the reply's tokens; rewards, validity, anchors and the process reward recorded.
The chunk, the status rules and `finished` are `episode`'s (docs/host_rollout.md, "The episode's rules"). The
per-episode work is written for one episode and vmapped; the model runs batched over episodes. Budgets are data,
so new budgets never recompile.

Legend (CONVENTIONS.md): B episodes, N turns (T_max), S context slots, C chunk tokens, M action tokens, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import xla_options
from jaxagent.envs.jax import base
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.budgets import BudgetFormat
from jaxagent.envs.jax.text_codec import concat
from jaxagent.models import ops, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import episode, types
from jaxagent.rollout.episode import EpisodeConfig, max_chunk
from jaxagent.rollout.layout import ChatLayout
from jaxagent.sampling import append, decode
from jaxagent.sampling.generate import bucket

# process_reward_fn(env, state_before, action_index, remaining_turns, env_params) -> f32 scalar
ProcessRewardFn = Callable[[Any, Any, jax.Array, jax.Array, Any], jax.Array]
# expert_fn(env, key, state, remaining_turns, env_params) -> int32 action index (one episode)
ExpertFn = Callable[[Any, jax.Array, Any, jax.Array, Any], jax.Array]


def oracle_process_reward(env, state, action, remaining, env_params):
    """FrozenLake's exact r_t = Q*_h(s_t, a_t) - V*_h(s_t) with h = the remaining turns (docs/study.md)."""
    return env.process_reward(state, action, remaining, env_params)


@dataclasses.dataclass(frozen=True)
class RolloutConfig(EpisodeConfig):
    """Static settings of a jitted rollout (hashable): `EpisodeConfig` (t_max, max_action_tokens,
    max_context, sampler) and the jittable-env hooks below."""

    process_reward_fn: Optional[ProcessRewardFn] = None
    # A scripted policy instead of the model (e.g. the noisy expert that writes the SFT data): its
    # action's canonical text + <|im_end|> is the reply; the model is never called.
    expert_fn: Optional[ExpertFn] = None
    # Compile the forced-action path: rows with forced_actions[b, t] >= 0 reply with that action's
    # canonical text (not policy tokens) and the model takes over afterwards (error-state evaluation).
    allow_forced: bool = False
    # Attention windows: each turn attends over the smallest of `kv_windows` evenly spaced cache
    # prefixes that holds every active episode's history plus the turn (`ops.KVWindows`: one
    # compiled attention branch per window). 1 = always the whole cache.
    kv_windows: int = 8

    def windows(self) -> tuple[int, ...]:
        s, n = self.max_context, max(1, self.kv_windows)
        return tuple(sorted({min(s, -(-(s * i) // (16 * n)) * 16) for i in range(1, n + 1)}))  # multiples of 16


def rollout(params, cfg: Qwen3Config, env, layout: ChatLayout, fmt: BudgetFormat, tasks, budgets, key,
            env_params, rcfg: RolloutConfig, *, hide_budget=False, forced_actions=None) -> types.Rollout:
    """Runs len(budgets) episodes of `env` on `tasks` (leading axis B) with per-episode budgets.

    `hide_budget` (traced: no recompile) drops the budget text from every prompt, the "unannounced"
    evaluation mode; the episodes still stop at their budgets. `forced_actions` int32[B, T_max]
    (needs `rcfg.allow_forced`): where >= 0, that turn's reply is the action's canonical text.

    Host-side checks happen here (the env has what `envs.jax.base.Env` lists, budgets in [1, T_max],
    context large enough for the first turn); the episodes themselves run in one jitted program
    (`rollout_jit`), which checks what the env's reset and step return while it is traced.
    """
    base.check_env(env)
    b = budgets_lib.validate_budgets(budgets, rcfg.t_max, keep_on_device=True)
    n_tasks = {x.shape[0] for x in jax.tree.leaves(tasks)}
    if n_tasks != {b.shape[0]}:
        raise ValueError(f"tasks have leading sizes {sorted(n_tasks)} but there are {b.shape[0]} budgets")
    obs_size = episode.observation_size(env, tasks, env_params)
    need = len(layout.system) + max_chunk(layout, fmt, env, rcfg.t_max, obs_size) + rcfg.max_action_tokens
    if rcfg.max_context < need:
        raise ValueError(f"max_context={rcfg.max_context} cannot hold even one turn ({need} tokens: system "
                         "prompt, first observation and a full reply)")
    if forced_actions is not None and not rcfg.allow_forced:
        raise ValueError("forced_actions needs RolloutConfig(allow_forced=True)")
    forced = np.full((b.shape[0], rcfg.t_max), -1, np.int32) if forced_actions is None else np.asarray(forced_actions)
    if forced.shape != (b.shape[0], rcfg.t_max):
        raise ValueError(f"forced_actions must have shape {(b.shape[0], rcfg.t_max)}, got {forced.shape}")
    if forced_actions is not None:
        n_act = env.codec.action_tokens_AxPa.shape[0]
        if not np.issubdtype(forced.dtype, np.integer):
            raise ValueError(f"forced_actions must be integers (-1 or an action index), got dtype {forced.dtype}")
        bad = (forced != -1) & ((forced < 0) | (forced >= n_act))
        if bad.any():
            ep, turn = (int(i[0]) for i in np.nonzero(bad))
            raise ValueError(f"forced_actions must be -1 (not forced) or an action index in [0, {n_act}); got "
                             f"{int(forced[ep, turn])} at episode {ep}, turn {turn} ({int(bad.sum())} such entries)")
    if rcfg.max_action_tokens < env.codec.action_tokens_AxPa.shape[1] + 1:
        raise ValueError(f"max_action_tokens={rcfg.max_action_tokens} is shorter than a canonical action "
                         f"({env.codec.action_tokens_AxPa.shape[1]} tokens + stop)")
    return rollout_jit(params, tasks, jnp.asarray(b), key, env_params, jnp.asarray(hide_budget, bool),
                       jnp.asarray(forced, jnp.int32), cfg=cfg, env=env, layout=layout,
                       fmt=fmt, rcfg=rcfg)


@dataclasses.dataclass(frozen=True, eq=False)
class RolloutFn:
    """`rollout` with the model config, env, text pieces, env params and settings bound: the
    `rollout_fn(params, tasks, budgets, key) -> Rollout` that `rl.rl_iteration`, `rl.make_train` and
    `eval.pass_kt_of` take. It holds the RolloutConfig (`rcfg`), so T_max is given once."""

    cfg: Qwen3Config
    env: Any
    layout: ChatLayout
    fmt: BudgetFormat
    rcfg: RolloutConfig
    env_params: Any = None

    def __call__(self, params, tasks, budgets, key, *, hide_budget=False, forced_actions=None) -> types.Rollout:
        return rollout(params, self.cfg, self.env, self.layout, self.fmt, tasks, budgets, key, self.env_params,
                       self.rcfg, hide_budget=hide_budget, forced_actions=forced_actions)


def make_rollout_fn(cfg: Qwen3Config, env, text, rcfg: RolloutConfig, env_params=None) -> RolloutFn:
    """The `RolloutFn` of `env` with `text`'s chat layout and budget format (`rollout.env_text`'s EnvText, or any
    object with `layout` and `fmt`); the env is checked here (`envs.jax.base.check_env`)."""
    base.check_env(env, "make_rollout_fn")
    if not isinstance(rcfg, RolloutConfig):
        raise TypeError(f"make_rollout_fn: rcfg must be a RolloutConfig; got {type(rcfg).__name__}")
    return RolloutFn(cfg, env, text.layout, text.fmt, rcfg, env_params)


def t_max_of(rollout_fn, t_max: Optional[int] = None) -> int:
    """T_max of an iteration's budgets: `t_max`, else the `rcfg.t_max` of a rollout function that carries its
    RolloutConfig (`rollout.make_rollout_fn`); both given, they must agree."""
    held = getattr(getattr(rollout_fn, "rcfg", None), "t_max", None)
    if t_max is None and held is None:
        raise ValueError("t_max: give it, or a rollout_fn that holds its RolloutConfig (rollout.make_rollout_fn)")
    if t_max is not None and held is not None and int(t_max) != int(held):
        raise ValueError(f"t_max={t_max} differs from the rollout_fn's RolloutConfig t_max={held}")
    return int(held if t_max is None else t_max)


def _reset(env, key, task, env_params):
    """One episode's reset, its output checked while traced (`base.check_reset`)."""
    out = env.reset(key, task, env_params)
    base.check_reset(env, out)
    return out


def _step(env, obs_len, state, reply_M, reply_len, env_params):
    """One episode's step, its output checked while traced (`base.check_step`)."""
    return base.check_step(env, env.step(state, reply_M, reply_len, env_params), obs_len)


def _canonical_reply(env, layout: ChatLayout, action_B, m: int):
    """Canonical reply tokens of env actions: action text + the first stop token, [B, M] and lengths."""
    table, lens = env.codec.action_tokens_AxPa, env.codec.action_lens_A
    a = jnp.clip(action_B, 0, table.shape[0] - 1)
    toks, n = jax.vmap(concat, in_axes=(0, 0, None, None))(
        table[a], lens[a], jnp.asarray(layout.stop_ids[:1], jnp.int32), 1)
    toks = jnp.pad(toks, ((0, 0), (0, m - toks.shape[1])), constant_values=layout.pad_id)
    return toks.astype(jnp.int32), n


def _system_cache(params, cfg, layout: ChatLayout, n_ep: int, s: int, dtype):
    """The system turn is identical for all episodes: prefill it once (batch 1) and copy its KV rows."""
    sys_len, sys_width = len(layout.system), bucket(len(layout.system))
    sys_toks = jnp.full((1, sys_width), layout.pad_id, jnp.int32).at[0, :sys_len].set(jnp.asarray(layout.system))
    _, one = append(params, cfg, qwen3.init_cache(cfg, 1, sys_width, dtype), sys_toks,
                    jnp.asarray([sys_len], jnp.int32))
    cache = qwen3.init_cache(cfg, n_ep, s, dtype)
    copy_k = lambda full, x: full.at[..., :sys_width].set(jnp.broadcast_to(x, (n_ep,) + x.shape[1:]))  # [B,K,E,S]
    copy_v = lambda full, x: full.at[:, :, :sys_width].set(jnp.broadcast_to(x, (n_ep,) + x.shape[1:]))  # [B,K,S,E]
    return {"k": [copy_k(c, x) for c, x in zip(cache["k"], one["k"])],
            "v": [copy_v(c, x) for c, x in zip(cache["v"], one["v"])],
            "length": jnp.full((n_ep,), sys_len, jnp.int32)}


def _initial_carry(layout: ChatLayout, cache, states, obs, n_ep: int, s: int, key):
    """The turn scan's carry before turn 0: every episode's context holds the system turn alone."""
    sys_len = len(layout.system)
    tokens = jnp.full((n_ep, s), layout.pad_id, jnp.int32).at[:, :sys_len].set(jnp.asarray(layout.system))
    return dict(cache=cache, length=jnp.full((n_ep,), sys_len, jnp.int32), states=states, obs=obs,
                closed=jnp.ones((n_ep,), bool),
                tokens=tokens, policy=jnp.zeros((n_ep, s), bool), turn_idx=jnp.full((n_ep, s), -1, jnp.int32),
                logp=jnp.zeros((n_ep, s), jnp.float32), status=jnp.zeros((n_ep,), jnp.int32), key=key)


def _scripted_actions(env, rcfg: RolloutConfig, states, active_B, t, budgets_B, forced_BxN, key, env_params):
    """Each episode's scripted action of turn t, -1 for none (and for inactive episodes): the expert's with an
    `expert_fn`, else the forced one with `allow_forced`."""
    n_ep = active_B.shape[0]
    if rcfg.expert_fn is not None:
        action_B = jax.vmap(rcfg.expert_fn, in_axes=(None, 0, 0, 0, None))(
            env, jax.random.split(key, n_ep), states, budgets_B - t, env_params)
        return jnp.where(active_B, action_B, -1)
    return jnp.where(active_B, forced_BxN[:, t], -1) if rcfg.allow_forced else jnp.full((n_ep,), -1)


def _reply(params, cfg, env, layout: ChatLayout, rcfg: RolloutConfig, cache, chunk_BxC, n_chunk_B, length_B,
           active_B, action_B, key):
    """The turn's replies after its prompt chunk: (tokens [B, M], lengths [B], log-probs [B, M], stopped [B],
    sampled [B], forced [B], cache). A scripted action (action_B >= 0) replies with its canonical text at
    log-prob 0; the other active episodes sample from the policy. With an `expert_fn` no model runs: no cache."""
    n_ep, m = active_B.shape[0], rcfg.max_action_tokens
    f_toks, f_len = _canonical_reply(env, layout, action_B, m)
    is_forced = action_B >= 0
    if rcfg.expert_fn is not None:
        return (f_toks, jnp.where(is_forced, f_len, 0), jnp.zeros((n_ep, m), jnp.float32),
                is_forced, jnp.zeros((n_ep,), bool), is_forced, None)
    sampled = active_B & ~is_forced
    # Attention reads only the smallest cache prefix that holds every active episode this turn
    # (inactive rows' outputs are discarded, so they may see a truncated history).
    need = jnp.max(jnp.where(active_B, length_B, 0)) + chunk_BxC.shape[1] + m
    window = ops.choose_window(rcfg.windows(), need)
    logits, cache = append(params, cfg, cache, chunk_BxC, n_chunk_B, kv_window=window)
    gen = decode(params, cfg, cache, logits, key, m, max_steps=m, sampler=rcfg.sampler,
                 stop_ids=layout.stop_ids, pad_id=layout.pad_id, active_B=sampled, kv_window=window)
    if rcfg.allow_forced:  # forced replies go into the cache as well
        _, fcache = append(params, cfg, gen.cache, f_toks, jnp.where(is_forced, f_len, 0), kv_window=window)
        gen = gen._replace(cache=fcache)
    reply = jnp.where(is_forced[:, None], f_toks, gen.tokens)
    reply_len = jnp.where(is_forced, f_len, gen.lengths)
    reply_lp = jnp.where(is_forced[:, None], 0.0, gen.logprobs)
    stopped = jnp.where(is_forced, True, gen.stopped)
    return reply, reply_len, reply_lp, stopped, sampled, is_forced, gen.cache


def _step_envs(env, rcfg: RolloutConfig, states, obs, reply_BxM, reply_len_B, active_B, t, budgets_B, env_params):
    """The envs stepped on the replies: (step, states, obs, remaining turns [B], process reward [B]); inactive
    episodes keep their state and observation."""
    step = jax.vmap(functools.partial(_step, env, obs.tokens.shape[-1]), in_axes=(0, 0, 0, None))(
        states, reply_BxM, reply_len_B, env_params)
    keep = lambda new, old: jax.tree.map(
        lambda a, b: jnp.where(active_B.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)
    new_states, new_obs = keep(step.state, states), keep(step.obs, obs)
    remaining_B = budgets_B - t
    if rcfg.process_reward_fn is None:
        proc_B = jnp.zeros((active_B.shape[0],), jnp.float32)
    else:
        proc_B = jax.vmap(rcfg.process_reward_fn, in_axes=(None, 0, 0, 0, None))(
            env, states, step.info["action"], remaining_B, env_params)
    return step, new_states, new_obs, remaining_B, proc_B


def _turn_record(active_B, step, proc_B, start_B, reply_len_B, stopped_B, forced_B, remaining_B) -> types.Turns:
    """The turn's entry of `types.Turns` for every episode: zeros, -1 and False where inactive."""
    return types.Turns(
        active=active_B, reward=jnp.where(active_B, step.reward, 0.0),
        process_reward=jnp.where(active_B, proc_B, 0.0), valid=active_B & step.info["valid"],
        action=jnp.where(active_B, step.info["action"], -1), anchor=jnp.where(active_B, step.info["anchor"], -1),
        span_start=jnp.where(active_B, start_B, 0), span_len=jnp.where(active_B, reply_len_B, 0),
        stopped=active_B & stopped_B, remaining=jnp.where(active_B, remaining_B, 0), forced=active_B & forced_B)


def _rollout_of(final, turns_NxB, states_NxB, budgets_B) -> types.Rollout:
    """The `types.Rollout` of the turn scan's final carry and its per-turn outputs (turn-major)."""
    turns = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), turns_NxB)
    env_states = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), states_NxB)
    status = final["status"]
    ret = episode.episode_return(status, turns.reward)
    return types.Rollout(
        tokens=final["tokens"], policy_mask=final["policy"], turn_index=final["turn_idx"], logprobs=final["logp"],
        length=final["length"], turns=turns, env_states=env_states, final_state=final["states"],
        episode_return=ret, success=status == types.SUCCESS,
        turns_used=jnp.sum(turns.active, axis=1).astype(jnp.int32), budget=budgets_B, status=status,
        generated_tokens=jnp.sum(final["policy"], axis=1).astype(jnp.int32))


@functools.partial(xla_options.jit, static_argnames=("cfg", "env", "layout", "fmt", "rcfg"))
def rollout_jit(params, tasks, budgets_B, key, env_params, hide_budget, forced_BxN, *, cfg, env, layout, fmt,
                rcfg) -> types.Rollout:
    n_ep = budgets_B.shape[0]
    s, m, t_max = rcfg.max_context, rcfg.max_action_tokens, rcfg.t_max
    scripted = rcfg.expert_fn is not None  # no model at all: the expert writes every reply
    k_reset, k_loop = jax.random.split(key)
    states, obs = jax.vmap(functools.partial(_reset, env), in_axes=(0, 0, None))(
        jax.random.split(k_reset, n_ep), tasks, env_params)
    cache = None if scripted else _system_cache(params, cfg, layout, n_ep, s, jax.tree.leaves(params)[0].dtype)
    # the weights prepared once per rollout (`ops.prepare`): appends then compute only the real tokens
    params = params if scripted else ops.prepare(params, cfg)
    carry0 = _initial_carry(layout, cache, states, obs, n_ep, s, k_loop)
    chunk_w = max_chunk(layout, fmt, env, t_max, obs.tokens.shape[-1])  # the tight bound: fewer padded tokens
    write = jax.vmap(episode.write_span)

    def turn(c, t):
        length = c["length"]
        chunk, clen = jax.vmap(episode.prompt_chunk, in_axes=(None, None, None, 0, None, 0, None, 0))(
            layout, fmt, env, c["obs"], t, budgets_B, hide_budget, c["closed"])
        chunk = chunk[:, :chunk_w]  # every real chunk fits (budgets <= T_max); the rest is padding
        status, active = episode.turn_start(c["status"], t, budgets_B, length + clen + m <= s)
        key, k_dec, k_exp = jax.random.split(c["key"], 3)

        # 1. the prompt chunk
        n_chunk = jnp.where(active, clen, 0)
        tokens = write(c["tokens"], chunk, length, n_chunk)
        turn_idx = write(c["turn_idx"], jnp.full((n_ep, chunk_w), t, jnp.int32), length, n_chunk)
        start = length + n_chunk

        # 2. the reply: expert, forced action, or the policy
        action = _scripted_actions(env, rcfg, c["states"], active, t, budgets_B, forced_BxN, k_exp, env_params)
        reply, reply_len, reply_lp, stopped, sampled, is_forced, cache = _reply(
            params, cfg, env, layout, rcfg, c["cache"], chunk, n_chunk, length, active, action, k_dec)
        tokens = write(tokens, reply, start, reply_len)
        turn_idx = write(turn_idx, jnp.full((n_ep, m), t, jnp.int32), start, reply_len)
        # Policy tokens: sampled replies; in scripted mode the expert is the acting policy (SFT targets).
        acting = (sampled | is_forced) if scripted else sampled
        policy = write(c["policy"], jnp.ones((n_ep, m), bool), start, jnp.where(acting, reply_len, 0))
        logp = write(c["logp"], reply_lp, start, reply_len)

        # 3. the environment
        step, new_states, new_obs, remaining, proc = _step_envs(
            env, rcfg, c["states"], c["obs"], reply, reply_len, active, t, budgets_B, env_params)
        status = episode.after_step(status, active, step.done, step.info["success"],
                                    episode.out_of_budget(t, budgets_B))
        rec = _turn_record(active, step, proc, start, reply_len, stopped, is_forced, remaining)
        closed = jnp.where(active, episode.reply_closed(reply, reply_len, layout.end_of_turn), c["closed"])
        out = dict(cache=cache, length=start + reply_len, states=new_states, obs=new_obs, closed=closed, tokens=tokens,
                   policy=policy, turn_idx=turn_idx, logp=logp, status=status, key=key)
        return out, (rec, c["states"])

    final, (turns_NxB, states_NxB) = jax.lax.scan(turn, carry0, jnp.arange(t_max))
    return _rollout_of(final, turns_NxB, states_NxB, budgets_B)
