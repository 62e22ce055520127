"""Drivers of the study's diagnostics on FrozenLake: run the rollouts, score them exactly, feed the pure metrics.

Each driver takes (world, cfg, params, key, ...) explicitly and returns a plain dict of Python numbers and
numpy arrays (CIs as {"mean", "lo", "hi"}), ready for `plots` and `report.flatten_metrics`. Compiles are
shared: every rollout goes through `run_rollouts`, which cuts episodes into fixed `batch_size` chunks, so one
`rollout_jit` compile per (batch_size, RolloutConfig) serves every driver; pass ONE RolloutConfig with
`allow_forced=True` everywhere (error states need it; rows without forced actions sample as usual).
Exact next-action scoring and teacher-forced log-probs run in fixed `score_batch` / `batch_size` chunks too.

Dimension legend (this module): B episodes (rollout rows), H turns (T_max), W context slots
(RolloutConfig.max_context), R canonical reply tokens, A env actions (4), O = A + 1 outcomes (the A canonical
replies and "anything else" = invalid), N tasks, S per-task samples or drawn states, T budget tiers, K values
of k, G sampled actions per state, C continuations per error state, V vocab.

Exact next-action distribution (`reply_logprobs`, `next_action_probs`): at a context (the episode's tokens
up to a turn's generation prompt), pi(a) = prod_j pi(reply_a[j] | context, reply_a[:j]) for the canonical
reply of action a (its answer string + the first stop token), computed by teacher forcing (the context
prefilled once into a KV cache, the A replies appended as A rows, one batched forward each; never token by
token), with the sampler's temperature (`sampling.policy_logprobs`). The remaining mass
1 - sum_a pi(a) is "invalid": any other reply, scored as invalid, i.e. the worst outcome
`step_quality.INVALID_VALUE` (0, a failed episode), never as staying put (a collapsed policy that answers
nothing valid must not look good on step quality). jaxagent's choice: a non-canonical reply that still
parses (extra text around the answer) counts in that remaining mass.

Step quality (docs/study.md, "jaxagent's definitions"): q(s, a) = Q*_h(s, a), h = the remaining budget. Each
state is scored exactly, mean q = sum_o pi(o) q(o), and by G actions drawn from pi (the paper's protocol);
the G draws of the two policies use common random numbers (inverse-CDF on shared uniforms), so equal
policies tie on every state.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs import budgets as budgets_lib
from jaxagent.envs import frozenlake_solver as fls
from jaxagent.envs.frozenlake import ACTION_STRINGS
from jaxagent.eval import bounds, costs, dynamics, passk
from jaxagent.eval import likelihood as lk
from jaxagent.eval import step_quality as sq
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.train_step import token_logprobs
from jaxagent.rollout import types
from jaxagent.rollout.jax_loop import RolloutConfig, _chunk, max_chunk, rollout
from jaxagent.sampling import Sampler, bucket
from jaxagent import xla_options

MODES = ("announced", "truncated", "hidden")
N_ACTIONS = fls.N_ACTIONS


# ----------------------------------------------------------------------------- host helpers
def _to_host(tree):
    """jax/numpy leaves -> numpy arrays (0-d -> Python numbers), CIs -> {"mean", "lo", "hi"} dicts."""
    if isinstance(tree, passk.CI):
        return {"mean": _to_host(tree.mean), "lo": _to_host(tree.lo), "hi": _to_host(tree.hi)}
    if isinstance(tree, dict):
        return {k: _to_host(v) for k, v in tree.items()}
    if isinstance(tree, (jax.Array, np.ndarray, np.generic)):
        a = np.asarray(tree)
        return a.item() if a.ndim == 0 else a
    return tree


def _check_rcfg(rcfg: RolloutConfig, t_max: int) -> None:
    if rcfg.t_max != t_max:
        raise ValueError(f"rcfg.t_max={rcfg.t_max} differs from t_max={t_max}")
    if rcfg.expert_fn is not None:
        raise ValueError("the eval drivers roll out the model: rcfg.expert_fn must be None")


def _temperature(sampler: Sampler) -> float:
    """The temperature of the sampled policy pi (`sampling.policy_logprobs`: greedy uses 1)."""
    return 1.0 if sampler.greedy else float(sampler.temperature)


def _pad_index(n: int, size: int) -> np.ndarray:
    """Row indices 0..n-1 then copies of the last row, up to a multiple of `size`."""
    total = -(-n // size) * size
    return np.minimum(np.arange(total), n - 1)


def _concat_rows(parts, n):
    if len(parts) == 1:
        return jax.tree.map(lambda x: x[:n], parts[0])
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0)[:n], *parts)


def _n_rows(tree) -> int:
    sizes = {x.shape[0] for x in jax.tree.leaves(tree)}
    if len(sizes) != 1:
        raise ValueError(f"leaves have different leading sizes {sorted(sizes)}")
    return sizes.pop()


# ----------------------------------------------------------------------------- rollouts in fixed chunks
def run_rollouts(world, cfg: Qwen3Config, params, tasks, budgets, key, env_params, rcfg: RolloutConfig, *,
                 hide_budget=False, forced_actions=None, batch_size: Optional[int] = None) -> types.Rollout:
    """`rollout` over len(budgets) episodes in chunks of exactly `batch_size` rows (the last chunk padded
    with copies of the last row, dropped afterwards); chunk i uses key fold_in(key, i), so calls that differ
    only in budgets share their random numbers row by row (episodes with identical prompts stay identical
    until the shorter budget ends). batch_size None: one chunk of all rows."""
    budgets = np.asarray(budgets)
    n = int(budgets.shape[0]) if budgets.ndim == 1 else -1
    if n < 1 or _n_rows(tasks) != n:
        raise ValueError(f"tasks (leading size {_n_rows(tasks)}) and budgets (shape {budgets.shape}) must "
                         "give one budget per task")
    size = n if batch_size is None else int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    idx = _pad_index(n, size)
    forced = None
    if forced_actions is not None:
        forced = np.asarray(forced_actions, np.int32)
        if forced.shape != (n, rcfg.t_max):
            raise ValueError(f"forced_actions must have shape {(n, rcfg.t_max)}, got {forced.shape}")
        forced = forced[idx]
        forced[n:] = -1
    parts = []
    for i in range(len(idx) // size):
        rows = idx[i * size:(i + 1) * size]
        parts.append(rollout(params, cfg, world.env, world.layout, world.fmt,
                             jax.tree.map(lambda x: jnp.asarray(x)[rows], tasks), budgets[rows],
                             jax.random.fold_in(key, i), env_params, rcfg, hide_budget=hide_budget,
                             forced_actions=None if forced is None else forced[i * size:(i + 1) * size]))
    return _concat_rows(parts, n)


# ----------------------------------------------------------------------------- Pass@(K,T)
def _truncated_costs(r: types.Rollout, tier: int):
    """Status, turns, policy tokens of a T_max run seen through budget `tier` (what the same episode, budget
    hidden, would have reported had it been stopped at `tier` turns)."""
    done = (r.status == types.SUCCESS) | (r.status == types.FAILED)
    within = r.turns_used <= tier
    status = jnp.where(done & within, r.status,
                       jnp.where((r.status == types.CONTEXT_EXHAUSTED) & (r.turns_used < tier),
                                 types.CONTEXT_EXHAUSTED, types.BUDGET_EXHAUSTED))
    turns = jnp.minimum(r.turns_used, tier)
    tokens = jnp.sum(jnp.where(r.turns.forced, 0, r.turns.span_len)[:, :tier], axis=1)
    return status, turns, tokens


def pass_kt(world, cfg: Qwen3Config, params, tasks, key, *, t_max: int, tiers: Optional[Sequence[int]] = None,
            n_samples: int, ks: Sequence[int], env_params, rcfg: RolloutConfig, mode: str = "announced",
            batch_size: Optional[int] = None, n_boot: int = 1000) -> dict:
    """Pass@(K,T) of one policy on `tasks` (N maps), n_samples episodes per task and budget tier.

    Estimator (docs/study.md, "jaxagent's definitions", Pass@(K,T); Chen et al. 2021 eq. 1):
    pass[t, k, task] = 1 - C(n - c, k) / C(n, k), c successes among the n = n_samples episodes of the
    task at tier t; grid[t, k] = mean over tasks. Modes:
      announced: separate rollouts per tier T, the budget T written into every prompt;
      truncated: one T_max run per sample with the budget hidden (docs/study.md), success at tier T iff the
                 episode succeeded with turns_used <= T; costs per tier as if stopped after T turns;
      hidden:    like announced (separate rollouts, budget T enforced) but the budget text hidden
                 (`hide_budget=True`; docs/study.md finding 9's open question).
    Every tier's rollouts (and the truncated run) use the same key and row layout (row = task * S +
    sample), so 'hidden' equals 'truncated' episode by episode: the announced mode of a policy that
    cannot see the budget text.

    Returns tiers [T], ks [K], grid [T, K], per_task [T, K, N], success [T, N, S], pass_at_t [T] (K =
    max(ks)) with its task-bootstrap CI pass_at_t_ci, and costs: `costs.cost_summary` per tier (each
    value [T]; env calls = turns, as every turn steps the env).
    """
    _check_rcfg(rcfg, t_max)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tiers_T = np.asarray(budgets_lib.budget_tiers(t_max) if tiers is None else tiers, np.int32)
    budgets_lib.validate_budgets(tiers_T, t_max)
    ks_K = np.asarray(ks, np.int32)
    if int(n_samples) < 1 or ks_K.ndim != 1 or ks_K.size == 0 or ks_K.min() < 1 or ks_K.max() > n_samples:
        raise ValueError(f"ks must be a non-empty list of k in [1, n_samples={n_samples}], got {list(ks)}")
    n_tasks = _n_rows(tasks)
    rows = jax.tree.map(lambda x: jnp.repeat(jnp.asarray(x), n_samples, axis=0), tasks)
    n_rows = n_tasks * n_samples
    k_roll, k_ci = jax.random.split(key)
    run = functools.partial(run_rollouts, world, cfg, params, rows, key=k_roll, env_params=env_params, rcfg=rcfg,
                            batch_size=batch_size)
    if mode == "truncated":
        r = run(budgets=np.full(n_rows, t_max), hide_budget=True)
        to_success_NxS = costs.turns_to_success(r.status, r.turns_used).reshape(n_tasks, n_samples)
        success_TxNxS = passk.truncated_success(to_success_NxS, tiers_T)
        per_tier = [_truncated_costs(r, int(t)) for t in tiers_T]
    else:
        per_tier, success = [], []
        for t in tiers_T:
            r = run(budgets=np.full(n_rows, t), hide_budget=mode == "hidden")
            per_tier.append((r.status, r.turns_used, r.generated_tokens))
            success.append(r.success.reshape(n_tasks, n_samples))
        success_TxNxS = jnp.stack(success)
    status_T, turns_T, tokens_T = (jnp.stack(x) for x in zip(*per_tier))
    kmax = int(np.argmax(ks_K))
    stats = _pass_stats(success_TxNxS, status_T, turns_T, tokens_T, jnp.asarray(ks_K), k_ci, kmax=kmax,
                        n_boot=int(n_boot))
    return _to_host({"mode": mode, "tiers": tiers_T, "ks": ks_K, "success": success_TxNxS,
                     "pass_at_t_k": int(ks_K[kmax]), **stats})


@functools.partial(jax.jit, static_argnames=("kmax", "n_boot"))
def _pass_stats(success_TxNxS, status_TxB, turns_TxB, tokens_TxB, ks_K, key, *, kmax, n_boot):
    """The metric functions of `pass_kt` in one compiled program (env calls = turns)."""
    per_task = passk.pass_at_k_grid(success_TxNxS, ks_K)
    ci = passk.bootstrap_ci(per_task[:, kmax, :], key, n_boot=n_boot)
    return {"grid": jnp.mean(per_task, axis=-1), "per_task": per_task, "pass_at_t": ci.mean, "pass_at_t_ci": ci,
            "costs": costs.cost_curves(status_TxB, turns_TxB, tokens_TxB, turns_TxB)}


# ----------------------------------------------------------------------------- structural upper bound
@functools.partial(jax.jit, static_argnames=("horizon",))
def _slippery_p_star(maps_NxLxL, success_rate, *, horizon):
    def one(map_LxL):
        mdp = fls.mdp_from_map(map_LxL, success_rate)
        W_HxS = fls.success_prob_within(mdp.P_SxAxS, mdp.goal_S, mdp.terminal_S, horizon)
        return W_HxS[:, jnp.argmax(map_LxL.reshape(-1) == fls.START)]
    return jax.vmap(one)(maps_NxLxL)


def upper_bound(world, tasks, *, tiers: Sequence[int], ks: Sequence[int], env_params) -> dict:
    """Exact structural Pass@(K,T) bound of FrozenLake tasks (docs/study.md, "jaxagent's definitions").

    p*[task, T] = the best success probability of any policy within T turns: deterministic lake
    (success_rate 1): 1[shortest path <= T] (BFS); slippery: max-probability DP `success_prob_within` from
    the start cell. bound[T, K] = mean_task 1 - (1 - p*)^K (`bounds.pass_at_k_bound`). Returns tiers, ks,
    p_star [N, T], per_task [T, K, N], grid [T, K], min_turns [N] (-1 unreachable; deterministic only).
    """
    tiers_T = np.asarray(tiers, np.int32)
    ks_K = np.asarray(ks, np.int32)
    if tiers_T.ndim != 1 or tiers_T.size == 0 or tiers_T.min() < 0:
        raise ValueError(f"tiers must be a non-empty list of budgets >= 0, got {list(tiers)}")
    maps = jnp.asarray(tasks)
    if maps.ndim != 3 or maps.shape[1:] != (world.env.size, world.env.size):
        raise ValueError(f"tasks must be maps [N, {world.env.size}, {world.env.size}], got {maps.shape}")
    rate = float(np.asarray(env_params.success_rate))
    out = {"tiers": tiers_T, "ks": ks_K}
    if rate == 1.0:
        steps = jax.jit(jax.vmap(fls.shortest_path_length))(maps)
        min_turns = jnp.where(steps >= fls.UNREACHABLE, -1, steps).astype(jnp.int32)
        p_star = bounds.success_prob_from_min_turns(min_turns, tiers_T)
        out["min_turns"] = min_turns
    else:
        p_star = _slippery_p_star(maps, rate, horizon=int(tiers_T.max()))[:, tiers_T]
    per_task = bounds.pass_at_k_bound_per_task(p_star, ks_K)
    out.update(p_star=p_star, per_task=per_task, grid=jnp.mean(per_task, axis=-1))
    return _to_host(out)


# ----------------------------------------------------------------------------- exact next-action scoring
def canonical_replies(world) -> tuple[np.ndarray, np.ndarray]:
    """Canonical reply of each env action a (ACTION_STRINGS order): its answer tokens + the first stop
    token, as the rollout writes a forced action. Returns (replies int32[A, R] pad-filled, lengths int32[A])."""
    codec, layout = world.codec, world.layout
    table, lens = np.asarray(codec.action_tokens_AxPa), np.asarray(codec.action_lens_A)
    out = np.full((N_ACTIONS, table.shape[1] + 1), layout.pad_id, np.int32)
    out_len = np.zeros(N_ACTIONS, np.int32)
    for a, text in enumerate(ACTION_STRINGS):
        k = codec.actions.index(text)
        out[a, :lens[k]] = table[k, :lens[k]]
        out[a, lens[k]] = layout.stop_ids[0]
        out_len[a] = lens[k] + 1
    return out, out_len


@functools.partial(xla_options.jit, static_argnames=("cfg", "temperature"))
def _reply_logprobs_jit(params, ctx_SxW, ctx_len_S, replies_AxR, reply_len_A, *, cfg, temperature):
    s, w = ctx_SxW.shape
    a, r = replies_AxR.shape
    cache = qwen3.init_cache(cfg, s, w + r, jax.tree.leaves(params)[0].dtype)
    # The context once per state: next-token logits at its last token, and its KV rows.
    first_Sx1xV, cache = qwen3.forward(params, cfg, ctx_SxW, cache=cache, n_valid=ctx_len_S,
                                       logits_index=jnp.maximum(ctx_len_S - 1, 0))
    rep = lambda x: jnp.repeat(x, a, axis=0)  # noqa: E731  row s * A + a
    cache_a = {"k": [rep(x) for x in cache["k"]], "v": [rep(x) for x in cache["v"]], "length": rep(cache["length"])}
    toks_BxR = jnp.tile(replies_AxR, (s, 1))
    lens_B = jnp.tile(reply_len_A, s)
    # Replies appended after each context (slot ctx_len on): logits_r[:, j] predicts reply token j + 1.
    logits_BxRxV, _ = qwen3.forward(params, cfg, toks_BxR, cache=cache_a, n_valid=lens_B)
    pred_BxRxV = jnp.concatenate([rep(first_Sx1xV), logits_BxRxV[:, :-1]], axis=1).astype(jnp.float32)
    logp_BxRxV = jax.nn.log_softmax(pred_BxRxV / temperature, axis=-1)
    tok_BxR = jnp.take_along_axis(logp_BxRxV, toks_BxR[..., None], axis=-1)[..., 0]
    tok_BxR = jnp.where(jnp.arange(r)[None, :] < lens_B[:, None], tok_BxR, 0.0)
    return jnp.sum(tok_BxR, axis=-1).reshape(s, a)


def reply_logprobs(world, cfg: Qwen3Config, params, ctx_SxW, ctx_len_S, *, temperature: float = 1.0,
                   score_batch: int = 16) -> jax.Array:
    """log pi(canonical reply of a | context) [S, A]: sum over the reply's tokens of
    log_softmax(logits / temperature), teacher-forced (module docstring); contexts are ctx[s, :ctx_len[s]]
    (right padding ignored), processed in chunks of `score_batch` states (one compile per (score_batch, W))."""
    replies, rlens = canonical_replies(world)
    ctx_SxW = jnp.asarray(ctx_SxW, jnp.int32)
    ctx_len = np.asarray(ctx_len_S, np.int32)
    s, w = ctx_SxW.shape
    if ctx_len.shape != (s,) or s == 0:
        raise ValueError(f"ctx_len_S must have shape ({s},) for {s} contexts, got {ctx_len.shape}")
    if ctx_len.min() < 1 or ctx_len.max() + replies.shape[1] > w:
        raise ValueError(f"every context needs 1 <= length and length + {replies.shape[1]} reply tokens <= "
                         f"width {w}; got lengths in [{ctx_len.min()}, {ctx_len.max()}]")
    idx = _pad_index(s, int(score_batch))
    parts = [_reply_logprobs_jit(params, ctx_SxW[idx[i:i + score_batch]], jnp.asarray(ctx_len[idx[i:i + score_batch]]),
                                 jnp.asarray(replies), jnp.asarray(rlens), cfg=cfg, temperature=float(temperature))
             for i in range(0, len(idx), score_batch)]
    return jnp.concatenate(parts, axis=0)[:s]


def next_action_probs(world, cfg: Qwen3Config, params, ctx_SxW, ctx_len_S, *, temperature: float = 1.0,
                      score_batch: int = 16) -> jax.Array:
    """pi over the O = A + 1 outcomes [S, O]: exp(`reply_logprobs`) for the A actions, then the remaining
    mass max(0, 1 - sum_a pi(a)) as "invalid" (module docstring)."""
    p_SxA = jnp.exp(reply_logprobs(world, cfg, params, ctx_SxW, ctx_len_S, temperature=temperature,
                                   score_batch=score_batch))
    return jnp.concatenate([p_SxA, jnp.clip(1.0 - p_SxA.sum(-1, keepdims=True), 0.0, 1.0)], axis=-1)


@functools.partial(jax.jit, static_argnames=("env",))
def _q_outcomes_jit(states, h_S, env_params, *, env):
    def one(state, h):
        q_A = env.q_values(state, h, env_params)
        return jnp.concatenate([q_A, jnp.full((1,), sq.INVALID_VALUE, q_A.dtype)])  # invalid: the worst outcome
    return jax.vmap(one)(states, h_S)


def q_outcomes(world, states, h_S, env_params) -> jax.Array:
    """q [S, O]: Q*_h(s, a) for the A actions (h = remaining turns, discount env_params.gamma) and the
    invalid outcome scored as invalid: `step_quality.INVALID_VALUE` (0, the value of a failed episode)."""
    return _q_outcomes_jit(states, jnp.asarray(h_S, jnp.int32), env_params, env=world.env)


def expected_quality(probs_SxO, q_SxO) -> jax.Array:
    """Exact mean quality of a policy at each state [S]: sum_o pi(o | s) q(s, o)."""
    return jnp.sum(jnp.asarray(probs_SxO, jnp.float32) * jnp.asarray(q_SxO, jnp.float32), axis=-1)


def sample_outcomes(u_SxG, probs_SxO) -> jax.Array:
    """Inverse-CDF draws int32[S, G] from pi(. | s) given uniforms u in [0, 1): outcome o with
    cdf[o-1] <= u * cdf[-1] < cdf[o]. Shared uniforms give two policies common random numbers."""
    cdf_SxO = jnp.cumsum(jnp.asarray(probs_SxO, jnp.float32), axis=-1)
    x_SxG = jnp.asarray(u_SxG, jnp.float32) * cdf_SxO[:, -1:]
    o = jnp.sum(x_SxG[:, :, None] >= cdf_SxO[:, None, :], axis=-1)
    return jnp.minimum(o, cdf_SxO.shape[-1] - 1).astype(jnp.int32)


def _score_pair(world, cfg, params_base, params_rl, ctx_SxW, ctx_len_S, q_SxO, key, *, temperature, n_sampled,
                score_batch):
    """Both policies at the same contexts: outcome probs, exact quality and G common-random-number draws."""
    out = {"q": q_SxO}
    u_SxG = jax.random.uniform(key, (q_SxO.shape[0], int(n_sampled)))
    for name, params in (("base", params_base), ("rl", params_rl)):
        probs = next_action_probs(world, cfg, params, ctx_SxW, ctx_len_S, temperature=temperature,
                                  score_batch=score_batch)
        draws = sample_outcomes(u_SxG, probs)
        out[f"probs_{name}"] = probs
        out[f"q_exact_{name}"] = expected_quality(probs, q_SxO)
        out[f"q_sampled_{name}"] = jnp.take_along_axis(q_SxO, draws, axis=-1)
        out[f"draws_{name}"] = draws
    return out


def _quality_summaries(scored, mask_S, depth_S, source_S, *, n_bins, tol):
    """`step_quality` (+ by depth, by the policy whose trajectory gave the state) exactly and from G draws."""
    keys = ("q_exact_base", "q_exact_rl", "q_sampled_base", "q_sampled_rl")
    return _quality_summaries_jit({k: scored[k] for k in keys}, jnp.asarray(mask_S), jnp.asarray(depth_S),
                                  jnp.asarray(source_S), n_bins=int(n_bins), tol=float(tol))


@functools.partial(jax.jit, static_argnames=("n_bins", "tol"))
def _quality_summaries_jit(scored, mask_S, depth_S, source_S, *, n_bins, tol):
    ones = lambda x: jnp.ones(x.shape, bool)  # noqa: E731  every outcome counts (invalid = the worst value)
    exact = (scored["q_exact_base"][:, None], scored["q_exact_rl"][:, None])
    sampled = (scored["q_sampled_base"], scored["q_sampled_rl"])
    out = {}
    for name, (qb, qr) in (("exact", exact), ("sampled", sampled)):
        args = (qb, ones(qb), qr, ones(qr))
        out[name] = sq.step_quality(*args, tol=tol, state_mask_S=mask_S)
        out[f"{name}_by_depth"] = sq.step_quality_by_depth(*args, depth_S, n_bins=n_bins, tol=tol,
                                                            state_mask_S=mask_S)
        out[f"{name}_from_base"] = sq.step_quality(*args, tol=tol, state_mask_S=mask_S & (source_S == 0))
        out[f"{name}_from_rl"] = sq.step_quality(*args, tol=tol, state_mask_S=mask_S & (source_S == 1))
    return out


# ----------------------------------------------------------------------------- drawing states
def _draw(key, cand_BxH, n: int):
    """n (episode, turn) cells drawn uniformly without replacement among the candidates, in random order
    (random keys, top n); returns b [n], t [n], drawn [n] (False past the number of candidates)."""
    cand = np.asarray(cand_BxH, bool)
    h = cand.shape[1]
    score = np.where(cand.reshape(-1), np.asarray(jax.random.uniform(key, (cand.size,))), -1.0)
    order = np.argsort(-score, kind="stable")[:n]
    order = np.concatenate([order, np.zeros(n - order.size, order.dtype)])
    return order // h, order % h, score[order] >= 0


def _draw_matched(key, cand_base, cand_rl, n: int):
    """Equal numbers from each policy's trajectories: the first min(n, #cand_base, #cand_rl) draws of each."""
    k_base, k_rl = jax.random.split(key)
    b0, t0, ok0 = _draw(k_base, cand_base, n)
    b1, t1, ok1 = _draw(k_rl, cand_rl, n)
    n_eff = min(int(ok0.sum()), int(ok1.sum()))
    keep = np.arange(n) < n_eff
    return (b0, t0), (b1, t1), keep


def _state_contexts(r: types.Rollout, b, t):
    """Context tokens of turn t of episode b up to its generation prompt: tokens[b, :span_start[b, t]]."""
    b, t = jnp.asarray(b), jnp.asarray(t)
    start = r.turns.span_start[b, t]
    toks = r.tokens[b]
    toks = jnp.where(jnp.arange(toks.shape[1])[None, :] < start[:, None], toks, 0)
    states = jax.tree.map(lambda x: x[b, t], r.env_states)
    return toks, start, states, r.turns.remaining[b, t]


def _both_rollouts(world, cfg, params_base, params_rl, tasks, key, t_max, env_params, rcfg, budgets, hide_budget,
                   rollouts, batch_size):
    if rollouts is not None:
        return rollouts
    n = _n_rows(tasks)
    budgets = np.full(n, t_max) if budgets is None else np.asarray(budgets)
    k_base, k_rl = jax.random.split(key)
    run = functools.partial(run_rollouts, world, cfg, tasks=tasks, budgets=budgets, env_params=env_params, rcfg=rcfg,
                            hide_budget=hide_budget, batch_size=batch_size)
    return run(params=params_base, key=k_base), run(params=params_rl, key=k_rl)


def _cat(a, b):
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)


# ----------------------------------------------------------------------------- step quality
def step_quality_matched(world, cfg: Qwen3Config, params_base, params_rl, tasks, key, *, t_max: int, n_states: int,
                         env_params, rcfg: RolloutConfig, n_sampled: int = 16, n_bins: int = 4, budgets=None,
                         hide_budget=False, rollouts=None, batch_size: Optional[int] = None, score_batch: int = 16,
                         tol: float = 0.0) -> dict:
    """Step quality on matched states (docs/study.md finding 3 and "jaxagent's definitions").

    Both policies roll out on `tasks` (budgets default T_max; or pass `rollouts=(base, rl)`). Equal numbers
    n = min(n_states, #base states, #RL states) of visited non-terminal states (active turns, pre-step) are
    drawn from each policy's trajectories (S = 2 n_states slots: base-drawn first, `mask` marks the used ones).
    At each, BOTH policies are scored on the same context (the trajectory's tokens up to that turn's
    generation prompt): exact outcome probabilities by teacher forcing, q = Q*_h with h = remaining budget,
    exact mean quality sum_o pi(o) q(o) and G = n_sampled common-random-number draws.
    Returns exact / sampled `step_quality` summaries (share_rl_better, share_equal, share_rl_worse, mean_q_base,
    mean_q_rl, n_states), the same by depth bin (depth = t / T_max) and split by the trajectory's policy
    (*_from_base, *_from_rl), and per-state arrays: probs_base/rl [S, O], q [S, O], q_exact_base/rl [S],
    q_sampled_base/rl [S, G], depth [S], source [S] (0 base, 1 RL), episode [S], turn [S], mask [S].
    """
    _check_rcfg(rcfg, t_max)
    k_roll, k_draw, k_g = jax.random.split(key, 3)
    r_base, r_rl = _both_rollouts(world, cfg, params_base, params_rl, tasks, k_roll, t_max, env_params, rcfg, budgets,
                                  hide_budget, rollouts, batch_size)
    (b0, t0), (b1, t1), keep = _draw_matched(k_draw, r_base.turns.active, r_rl.turns.active, int(n_states))
    ctx0, len0, st0, h0 = _state_contexts(r_base, b0, t0)
    ctx1, len1, st1, h1 = _state_contexts(r_rl, b1, t1)
    mask = jnp.asarray(np.concatenate([keep, keep]))
    ctx, ctx_len, states = _cat(ctx0, ctx1), jnp.where(mask, _cat(len0, len1), 1), _cat(st0, st1)
    h = jnp.where(mask, _cat(h0, h1), 1)
    q = q_outcomes(world, states, h, env_params)
    scored = _score_pair(world, cfg, params_base, params_rl, ctx, ctx_len, q, k_g,
                         temperature=_temperature(rcfg.sampler), n_sampled=n_sampled, score_batch=score_batch)
    turn = jnp.asarray(np.concatenate([t0, t1]))
    source = jnp.asarray(np.repeat(np.arange(2), int(n_states)))
    depth = turn / t_max
    out = _quality_summaries(scored, mask, depth, source, n_bins=n_bins, tol=tol)
    out.update(scored)
    out.update(depth=depth, source=source, episode=jnp.asarray(np.concatenate([b0, b1])), turn=turn, mask=mask,
               remaining=h)
    return _to_host(out)


# ----------------------------------------------------------------------------- error states
@functools.partial(jax.jit, static_argnames=("env", "tol"))
def _error_actions_jit(states, h_S, env_params, *, env, tol):
    def one(state, h):
        q_A = env.q_values(state, h, env_params)
        mdp = fls.mdp_from_map(state.map_LxL, env_params.success_rate)
        p_end_A = mdp.P_SxAxS[state.pos] @ mdp.terminal_S.astype(jnp.float32)  # P(next state ends the episode)
        non_terminating_A = p_end_A <= 0.0
        return sq.choose_error_action(q_A, non_terminating_A, tol=tol), q_A, non_terminating_A
    return jax.vmap(one)(states, h_S)


def error_actions(world, states, h_S, env_params, *, tol: float = 0.0):
    """The injected error action at each state (docs/study.md, "jaxagent's definitions", Error state): among the
    non-terminating actions (no probability of entering a hole or the goal), the one with the lowest
    Q*_h(s, a) below max_a Q*_h(s, a) - tol (`step_quality.choose_error_action`), -1 if none.
    Returns (action int32[S], q int32[S, A], non_terminating bool[S, A])."""
    return _error_actions_jit(states, jnp.asarray(h_S, jnp.int32), env_params, env=world.env, tol=float(tol))


def _write_row(buf_W, values, start, count):
    k = jnp.arange(values.shape[0])
    return buf_W.at[jnp.where(k < count, start + k, buf_W.shape[0])].set(values.astype(buf_W.dtype), mode="drop")


@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt"))
def _inject_jit(tokens_SxW, start_S, states, action_S, turn_S, budget_S, hide, env_params, replies_AxR, reply_len_A, *,
                env, layout, fmt):
    w = tokens_SxW.shape[1]

    def one(tok_W, start, state, a, t, budget):
        a = jnp.maximum(a, 0)
        step = env.step_action(state, a, env_params)
        tok_W = jnp.where(jnp.arange(w) < start, tok_W, layout.pad_id)
        tok_W = _write_row(tok_W, replies_AxR[a], start, reply_len_A[a])
        chunk, clen = _chunk(layout, fmt, env, step.obs, t + 1, budget, hide)
        tok_W = _write_row(tok_W, chunk, start + reply_len_A[a], clen)
        return tok_W, start + reply_len_A[a] + clen, step.state, step.done

    return jax.vmap(one)(tokens_SxW, start_S, states, action_S, turn_S, budget_S)


def _error_pool(world, r: types.Rollout, env_params, hide_budget, width, tol):
    """Candidate error states of every (episode, turn) of a rollout, and their injected contexts."""
    b_n, h_n = r.turns.active.shape
    bb, tt = np.divmod(np.arange(b_n * h_n), h_n)
    toks, start, states, h = _state_contexts(r, bb, tt)
    h = jnp.maximum(h, 1)
    action, _, _ = error_actions(world, states, h, env_params, tol=tol)
    replies, rlens = canonical_replies(world)
    ctx, ctx_len, err_states, done = _inject_jit(toks, start, states, action, jnp.asarray(tt), r.budget[bb],
                                                 jnp.asarray(hide_budget, bool), env_params, jnp.asarray(replies),
                                                 jnp.asarray(rlens), env=world.env, layout=world.layout, fmt=world.fmt)
    valid = r.turns.valid
    prefix_ok = jnp.cumprod(jnp.pad(valid, ((0, 0), (1, 0)), constant_values=True), axis=1)[:, :h_n].astype(bool)
    cand = (r.turns.active & (r.turns.remaining >= 2) & prefix_ok).reshape(-1)
    cand = cand & (action >= 0) & ~done & (ctx_len + replies.shape[1] <= width)
    return dict(cand=cand.reshape(b_n, h_n), ctx=ctx, ctx_len=ctx_len, states=err_states, action=action,
                h=h - 1, pre_states=states)


def error_states(world, cfg: Qwen3Config, params_base, params_rl, tasks, key, *, t_max: int, n_states: int,
                 env_params, rcfg: RolloutConfig, n_continuations: int = 4, n_sampled: int = 16, n_bins: int = 4,
                 budgets=None, hide_budget=False, rollouts=None, batch_size: Optional[int] = None,
                 score_batch: int = 16, tol: float = 0.0, n_boot: int = 1000, return_rollouts: bool = False) -> dict:
    """Error-state diagnostics (docs/study.md finding 4 and "jaxagent's definitions", Error state).

    Pool: from each policy's trajectories (rollouts as in `step_quality_matched`), (episode, turn) cells
    that are active with >= 2 turns left, whose earlier turns were all valid actions (so a forced replay of
    canonical replies reproduces the env states), with a non-terminating action whose Q*_h is below the best
    (`error_actions`, the worst such is injected). n = min(n_states, #base cells, #RL cells) are drawn from
    each. The error state is env.step_action(s, a_err), with h - 1 turns left (depth = (t + 1) / T_max).
      (a) both policies scored exactly at the error state, context = the trajectory's prefix + the injected
          action's canonical reply + the env's next prompt chunk (as in `step_quality_matched`);
      (b) continuation: n_continuations rollouts per policy and error state with the episode's budget,
          `forced_actions` replaying the trajectory's actions up to turn t and the injected action at t,
          then the policy acts; both policies use the same rollout key (common random numbers).
    Needs a deterministic lake (success_rate 1) and rcfg.allow_forced.
    Returns metrics (`step_quality.error_state_metrics` on the exact qualities: share_rl_better,
    share_rl_worse, success_rl, success_base, success_diff, each a CI), exact / sampled summaries and by
    depth, and per-state arrays: action [S], pre_q [S, A], q [S, O], probs_base/rl, q_exact_base/rl,
    success_base/rl [S, C], replay_ok [S] (the replay met the trajectory's positions up to turn t and the
    error state at t + 1), context [S, W] / context_len [S] of (a), episode, turn, source, depth, mask,
    remaining (turns left at the error state). return_rollouts adds the trajectories and the continuation
    rollouts (rows = state * C + continuation).
    """
    _check_rcfg(rcfg, t_max)
    if float(np.asarray(env_params.success_rate)) != 1.0:
        raise ValueError("error_states replays trajectories with forced actions: it needs a deterministic lake "
                         f"(env_params.success_rate == 1), got {env_params.success_rate}")
    if not rcfg.allow_forced:
        raise ValueError("error_states needs RolloutConfig(allow_forced=True); use the same rcfg for every driver "
                         "so that they share one rollout compile")
    if int(n_continuations) < 1:
        raise ValueError(f"n_continuations must be >= 1, got {n_continuations}")
    k_roll, k_draw, k_g, k_cont, k_ci = jax.random.split(key, 5)
    r_base, r_rl = _both_rollouts(world, cfg, params_base, params_rl, tasks, k_roll, t_max, env_params, rcfg, budgets,
                                  hide_budget, rollouts, batch_size)
    pools = [_error_pool(world, r, env_params, hide_budget, rcfg.max_context, tol) for r in (r_base, r_rl)]
    (b0, t0), (b1, t1), keep = _draw_matched(k_draw, pools[0]["cand"], pools[1]["cand"], int(n_states))
    flat = [jnp.asarray(b0 * t_max + t0), jnp.asarray(b1 * t_max + t1)]  # pools are flat over (episode, turn)
    take = lambda src, name: jax.tree.map(lambda x: x[flat[src]], pools[src][name])  # noqa: E731
    sel = {k: _cat(take(0, k), take(1, k)) for k in ("ctx", "ctx_len", "states", "action", "h", "pre_states")}
    mask = jnp.asarray(np.concatenate([keep, keep]))
    ctx_len = jnp.where(mask, sel["ctx_len"], 1)
    h = jnp.where(mask, sel["h"], 1)
    q = q_outcomes(world, sel["states"], h, env_params)
    scored = _score_pair(world, cfg, params_base, params_rl, sel["ctx"], ctx_len, q, k_g,
                         temperature=_temperature(rcfg.sampler), n_sampled=n_sampled, score_batch=score_batch)
    pre_q = q_outcomes(world, sel["pre_states"], jnp.where(mask, sel["h"] + 1, 1), env_params)[:, :N_ACTIONS]

    # (b) continuations from identical error states: replay the trajectory, force the error, let the policy act.
    episode = np.concatenate([b0, b1])
    turn = np.concatenate([t0, t1])
    source = np.repeat(np.arange(2), int(n_states))
    action = np.asarray(sel["action"])
    acts = [np.asarray(r_base.turns.action), np.asarray(r_rl.turns.action)]
    budget_src = [np.asarray(r_base.budget), np.asarray(r_rl.budget)]
    n_s, c = episode.size, int(n_continuations)
    forced = np.full((n_s, t_max), -1, np.int32)
    budgets_s = np.full(n_s, t_max, np.int32)
    for i in range(n_s):
        if keep[i % int(n_states)]:
            src, b, t = source[i], episode[i], turn[i]
            forced[i, :t] = acts[src][b, :t]
            forced[i, t] = action[i]
            budgets_s[i] = budget_src[src][b]
    maps = [r_base.env_states.map_LxL[:, 0], r_rl.env_states.map_LxL[:, 0]]
    task_maps = jnp.where(jnp.asarray(source == 0)[:, None, None], maps[0][jnp.asarray(episode)],
                          maps[1][jnp.asarray(episode)])
    rep = lambda x: np.repeat(x, c, axis=0)  # noqa: E731  row = state * C + continuation
    run = functools.partial(run_rollouts, world, cfg, tasks=jnp.repeat(task_maps, c, axis=0), budgets=rep(budgets_s),
                            key=k_cont, env_params=env_params, rcfg=rcfg, hide_budget=hide_budget,
                            forced_actions=rep(forced), batch_size=batch_size)
    cont_base, cont_rl = run(params=params_base), run(params=params_rl)
    success_base = cont_base.success.reshape(n_s, c)
    success_rl = cont_rl.success.reshape(n_s, c)

    # The replay check: positions up to turn t equal the trajectory's, position at t + 1 is the error state's.
    traj_pos = np.stack([np.asarray(r_base.env_states.pos), np.asarray(r_rl.env_states.pos)])[source, episode]
    err_pos = np.asarray(sel["states"].pos)
    replay_ok = np.asarray(mask).copy()
    for cont in (cont_base, cont_rl):
        pos = np.asarray(cont.env_states.pos).reshape(n_s, c, t_max)
        for i in range(n_s):
            t = turn[i]
            if not replay_ok[i] or t + 1 >= t_max:  # unfilled slot (fewer candidates than n_states): no replay
                replay_ok[i] = False
                continue
            same_path = (pos[i, :, :t + 1] == traj_pos[i, :t + 1]).all()
            replay_ok[i] &= bool(same_path and (pos[i, :, t + 1] == err_pos[i]).all())

    ones = jnp.ones((n_s, 1), bool)
    metrics = sq.error_state_metrics(scored["q_exact_base"][:, None], ones, scored["q_exact_rl"][:, None], ones,
                                     success_base, success_rl, k_ci, tol=tol, state_mask_S=mask, n_boot=n_boot)
    depth = jnp.asarray((turn + 1) / t_max)
    out = _quality_summaries(scored, mask, depth, jnp.asarray(source), n_bins=n_bins, tol=tol)
    out.update(scored)
    out.update(metrics=metrics, action=sel["action"], pre_q=pre_q, success_base=success_base, success_rl=success_rl,
               replay_ok=replay_ok, episode=episode, turn=turn, source=source, depth=depth, mask=mask, remaining=h,
               context=sel["ctx"], context_len=ctx_len)
    host = _to_host(out)
    if return_rollouts:
        host["rollouts"] = {"base": r_base, "rl": r_rl, "continuation_base": cont_base, "continuation_rl": cont_rl}
    return host


# ----------------------------------------------------------------------------- likelihood
_token_logprobs_jit = xla_options.jit(token_logprobs, static_argnums=1)


def teacher_forced_logprobs(params, cfg: Qwen3Config, tokens_BxW, *, batch_size: Optional[int] = None) -> jax.Array:
    """logp [B, W], logp[:, t] = log pi(tokens[t] | tokens[:t]) (temperature 1; `train_step.token_logprobs`),
    one jitted forward per chunk of `batch_size` rows (None: all rows at once)."""
    tokens_BxW = jnp.asarray(tokens_BxW, jnp.int32)
    n = tokens_BxW.shape[0]
    size = n if batch_size is None else int(batch_size)
    idx = _pad_index(n, size)
    parts = [_token_logprobs_jit(params, cfg, tokens_BxW[idx[i:i + size]]) for i in range(0, len(idx), size)]
    return jnp.concatenate(parts, axis=0)[:n]


def likelihood(world, cfg: Qwen3Config, params_base, params_rl, rollouts_base: types.Rollout,
               rollouts_rl: types.Rollout, key, *, task_ids_base=None, task_ids_rl=None, rel_tol: float = 0.1,
               n_boot: int = 1000, batch_size: Optional[int] = None) -> dict:
    """Likelihood diagnostics (docs/study.md finding 5 and "jaxagent's definitions"), teacher-forced at
    temperature 1 in batched jitted passes over each rollout's whole token buffer.

    nll_rl_actions / nll_base_actions: per-action NLL under pi_base (sum of -log pi_base over the action's
    policy tokens, `likelihood.action_nll`) of RL's and of base's actions: flat arrays of every action and
    their means. llr_rl [R] / llr_base [M]: cumulative log pi_RL(tau) - log pi_base(tau) over each
    trajectory's policy tokens; mean_llr_success_rl / _base over successful trajectories (NaN without).
    Length-matched pairs (same task, both successful, policy-token counts within rel_tol of the longer;
    `likelihood.length_matched_pairs`) and the mean paired LLR difference RL - base with a bootstrap CI
    (`likelihood.matched_difference`). Task ids default to the row index (row i ran task i); pass
    task_ids_* when rows repeat tasks (e.g. np.repeat(np.arange(N), S)).
    """
    tid = {}
    for name, r, ids in (("base", rollouts_base, task_ids_base), ("rl", rollouts_rl, task_ids_rl)):
        n = r.tokens.shape[0]
        tid[name] = np.arange(n, dtype=np.int32) if ids is None else np.asarray(ids, np.int32)
        if tid[name].shape != (n,):
            raise ValueError(f"task_ids_{name} must have shape ({n},), got {tid[name].shape}")
    n_turns = rollouts_base.turns.active.shape[1]
    tf = functools.partial(teacher_forced_logprobs, cfg=cfg, batch_size=batch_size)
    out = {}
    for name, r in (("base", rollouts_base), ("rl", rollouts_rl)):
        turn_ids = lk.policy_turn_ids(r.turn_index, r.policy_mask)
        logp_base, logp_rl = tf(params_base, tokens_BxW=r.tokens), tf(params_rl, tokens_BxW=r.tokens)
        nll = lk.action_nll(logp_base, turn_ids, n_turns)
        llr = lk.cumulative_llr(logp_rl, logp_base, turn_ids)
        ok = r.success.astype(jnp.float32)
        out[f"nll_{name}_actions"] = np.asarray(nll["nll"])[np.asarray(nll["action_mask"])]
        out[f"mean_nll_{name}_actions"] = nll["mean_nll"]
        out[f"llr_{name}"] = llr
        out[f"mean_llr_success_{name}"] = jnp.sum(llr * ok) / jnp.sum(ok)
        out[f"success_{name}"] = r.success
        out[f"policy_tokens_{name}"] = lk.policy_token_counts(turn_ids)
    pairs = lk.length_matched_pairs(tid["rl"], out["success_rl"], out["policy_tokens_rl"], tid["base"],
                                    out["success_base"], out["policy_tokens_base"], rel_tol=rel_tol)
    out.update(match=pairs["match"], n_pairs=pairs["n_pairs"], n_pair_tasks=pairs["n_tasks"],
               matched_llr_diff=lk.matched_difference(out["llr_rl"], out["llr_base"], pairs["match"], key,
                                                      n_boot=n_boot))
    return _to_host(out)


# ----------------------------------------------------------------------------- R_single
@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt", "width"))
def _first_turn_jit(maps, budget, hide, env_params, *, env, layout, fmt, width):
    system = jnp.asarray(layout.system, jnp.int32)

    def one(task):
        state, obs = env.reset(jax.random.key(0), task, env_params)
        chunk, clen = _chunk(layout, fmt, env, obs, 0, budget, hide)
        row = jnp.full((width,), layout.pad_id, jnp.int32).at[:system.shape[0]].set(system)
        return _write_row(row, chunk, system.shape[0], clen), system.shape[0] + clen, state

    return jax.vmap(one)(maps)


def first_turn_contexts(world, tasks, *, t_max: int, env_params, width: int, hide_budget=False):
    """The first-turn context of each task as the rollout builds it (system turn + turn-0 chunk with budget
    t_max): (tokens int32[N, width], lengths int32[N], initial env states)."""
    return _first_turn_jit(jnp.asarray(tasks), jnp.asarray(t_max, jnp.int32), jnp.asarray(hide_budget, bool),
                           env_params, env=world.env, layout=world.layout, fmt=world.fmt, width=int(width))


def r_single(world, cfg: Qwen3Config, params, heldout_tasks, *, t_max: int, env_params, sampler: Sampler = Sampler(),
             width: Optional[int] = None, score_batch: int = 16, hide_budget=False, tol: float = 1e-6) -> dict:
    """R_single (docs/study.md finding 6, "jaxagent's definitions"): mean over held-out tasks' first-turn states of
    the probability mass pi puts on Q*-optimal actions, Q*_h with h = t_max (`dynamics.r_single`,
    `dynamics.optimal_action_mask` with tolerance tol for float ties); pi scored exactly as in
    `step_quality_matched` (the invalid remainder is never optimal). width: context slots (default the
    smallest bucket holding a first turn; pass rcfg.max_context to share the scoring compile).
    Returns r_single, probs [N, A], invalid_mass [N], optimal [N, A], q [N, A].
    """
    replies, _ = canonical_replies(world)
    need = len(world.layout.system) + max_chunk(world.layout, world.fmt, world.env) + replies.shape[1]
    width = bucket(need) if width is None else int(width)
    ctx, ctx_len, states = first_turn_contexts(world, heldout_tasks, t_max=t_max, env_params=env_params, width=width,
                                               hide_budget=hide_budget)
    probs = next_action_probs(world, cfg, params, ctx, ctx_len, temperature=_temperature(sampler),
                              score_batch=score_batch)
    q = q_outcomes(world, states, jnp.full(ctx_len.shape, t_max, jnp.int32), env_params)[:, :N_ACTIONS]
    optimal = dynamics.optimal_action_mask(q, tol=tol)
    return _to_host({"r_single": dynamics.r_single(probs[:, :N_ACTIONS], optimal), "probs": probs[:, :N_ACTIONS],
                     "invalid_mass": probs[:, N_ACTIONS], "optimal": optimal, "q": q})
