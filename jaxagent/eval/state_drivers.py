"""State drivers on FrozenLake: both policies scored exactly at the same states, drawn from their
trajectories (`step_quality_matched`), at injected error states (`error_states`) and at held-out first
turns (`first_move_optimality`, a diagnostic; the study's R_single is `study.plan_mode`'s plan success).

Step quality (docs/study.md, "jaxagent's definitions"): q(s, a) = Q*_h(s, a), h = the remaining budget. Each
state is scored exactly, mean q = sum_o pi(o) q(o), and by G actions drawn from pi (the paper's protocol);
the G draws of the two policies use common random numbers (inverse-CDF on shared uniforms), so equal
policies tie on every state. Contexts are rebuilt with the rollout's own rules (`rollout.episode`).

Dimension legend (CONVENTIONS.md): B episodes (rollout rows), N turns (T_max), S context slots, I drawn
states, A env actions (4), O = A + 1 outcomes, M canonical reply tokens, G actions drawn per state, Y
continuations per error state, P tasks.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.eval import dynamics
from jaxagent.eval import step_quality as sq
from jaxagent.eval.driver_common import check_rcfg, n_rows, run_rollouts, temperature_of, to_host
from jaxagent.eval.scoring import canonical_replies, expected_quality, next_action_probs, q_outcomes, sample_outcomes
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import types
from jaxagent.rollout.episode import max_chunk, prompt_chunk, write_span
from jaxagent.rollout.jax_loop import RolloutConfig
from jaxagent.sampling import Sampler, bucket


def _score_pair(world, cfg, params_base, params_rl, ctx_IxS, ctx_len_I, q_IxO, key, *, temperature, n_sampled,
                score_batch, mesh=None):
    """Both policies at the same contexts: outcome probs, exact quality and G common-random-number draws."""
    out = {"q": q_IxO}
    u_IxG = jax.random.uniform(key, (q_IxO.shape[0], int(n_sampled)))
    for name, params in (("base", params_base), ("rl", params_rl)):
        probs = next_action_probs(world, cfg, params, ctx_IxS, ctx_len_I, temperature=temperature,
                                  score_batch=score_batch, mesh=mesh)
        draws = sample_outcomes(u_IxG, probs)
        out[f"probs_{name}"] = probs
        out[f"q_exact_{name}"] = expected_quality(probs, q_IxO)
        out[f"q_sampled_{name}"] = jnp.take_along_axis(q_IxO, draws, axis=-1)
        out[f"draws_{name}"] = draws
    return out


def _quality_summaries(scored, mask_I, depth_I, source_I, *, n_bins, tol):
    """`step_quality` (+ by depth, by the policy whose trajectory gave the state) exactly and from G draws."""
    keys = ("q_exact_base", "q_exact_rl", "q_sampled_base", "q_sampled_rl")
    return _quality_summaries_jit({k: scored[k] for k in keys}, jnp.asarray(mask_I), jnp.asarray(depth_I),
                                  jnp.asarray(source_I), n_bins=int(n_bins), tol=float(tol))


@functools.partial(jax.jit, static_argnames=("n_bins", "tol"))
def _quality_summaries_jit(scored, mask_I, depth_I, source_I, *, n_bins, tol):
    ones = lambda x: jnp.ones(x.shape, bool)  # noqa: E731  every outcome counts (invalid = the worst value)
    exact = (scored["q_exact_base"][:, None], scored["q_exact_rl"][:, None])
    sampled = (scored["q_sampled_base"], scored["q_sampled_rl"])
    out = {}
    for name, (qb, qr) in (("exact", exact), ("sampled", sampled)):
        args = (qb, ones(qb), qr, ones(qr))
        out[name] = sq.step_quality(*args, tol=tol, state_mask_I=mask_I)
        out[f"{name}_by_depth"] = sq.step_quality_by_depth(*args, depth_I, n_bins=n_bins, tol=tol,
                                                            state_mask_I=mask_I)
        out[f"{name}_from_base"] = sq.step_quality(*args, tol=tol, state_mask_I=mask_I & (source_I == 0))
        out[f"{name}_from_rl"] = sq.step_quality(*args, tol=tol, state_mask_I=mask_I & (source_I == 1))
    return out


def _draw(key, cand_BxN, n: int):
    """n (episode, turn) cells drawn uniformly without replacement among the candidates, in random order
    (random keys, top n); returns b [n], t [n], drawn [n] (False past the number of candidates)."""
    cand = np.asarray(cand_BxN, bool)
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


def state_contexts(r: types.Rollout, b, t):
    """Context tokens of turn t of episode b up to its generation prompt: tokens[b, :span_start[b, t]]."""
    b, t = jnp.asarray(b), jnp.asarray(t)
    start = r.turns.span_start[b, t]
    toks = r.tokens[b]
    toks = jnp.where(jnp.arange(toks.shape[1])[None, :] < start[:, None], toks, 0)
    states = jax.tree.map(lambda x: x[b, t], r.env_states)
    return toks, start, states, r.turns.remaining[b, t]


def _both_rollouts(world, cfg, params_base, params_rl, tasks, key, t_max, env_params, rcfg, budgets, hide_budget,
                   rollouts, batch_size, mesh=None, compute_dtype=None):
    if rollouts is not None:
        return rollouts
    n = n_rows(tasks)
    budgets = np.full(n, t_max) if budgets is None else np.asarray(budgets)
    k_base, k_rl = jax.random.split(key)
    run = functools.partial(run_rollouts, world, cfg, tasks=tasks, budgets=budgets, env_params=env_params, rcfg=rcfg,
                            hide_budget=hide_budget, batch_size=batch_size, mesh=mesh, compute_dtype=compute_dtype)
    return run(params=params_base, key=k_base), run(params=params_rl, key=k_rl)


def _cat(a, b):
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)


def step_quality_matched(world, cfg: Qwen3Config, params_base, params_rl, tasks, key, *, t_max: int, n_states: int,
                         env_params, rcfg: RolloutConfig, n_sampled: int = 16, n_bins: int = 4, budgets=None,
                         hide_budget=False, rollouts=None, batch_size: Optional[int] = None, score_batch: int = 16,
                         tol: float = 0.0, mesh=None, compute_dtype=None) -> dict:
    """Step quality on matched states (docs/study.md finding 3 and "jaxagent's definitions").

    Both policies roll out on `tasks` (budgets default T_max; or pass `rollouts=(base, rl)`). Equal numbers
    n = min(n_states, #base states, #RL states) of visited non-terminal states (active turns, pre-step) are
    drawn from each policy's trajectories (I = 2 n_states slots: base-drawn first, `mask` marks the used ones).
    At each, BOTH policies are scored on the same context (the trajectory's tokens up to that turn's
    generation prompt): exact outcome probabilities by teacher forcing, q = Q*_h with h = remaining budget,
    exact mean quality sum_o pi(o) q(o) and G = n_sampled common-random-number draws.
    Returns exact / sampled `step_quality` summaries (share_rl_better, share_equal, share_rl_worse, mean_q_base,
    mean_q_rl, n_states), the same by depth bin (depth = t / T_max) and split by the trajectory's policy
    (*_from_base, *_from_rl), and per-state arrays: probs_base/rl [I, O], q [I, O], q_exact_base/rl [I],
    q_sampled_base/rl [I, G], depth [I], source [I] (0 base, 1 RL), episode [I], turn [I], mask [I].
    `mesh`, `compute_dtype`: where and in which dtype the rollouts run (`driver_common.run_rollouts`); the
    scoring runs on the mesh too, with `params` as given (`scoring.reply_logprobs`).
    """
    check_rcfg(rcfg, t_max)
    k_roll, k_draw, k_g = jax.random.split(key, 3)
    r_base, r_rl = _both_rollouts(world, cfg, params_base, params_rl, tasks, k_roll, t_max, env_params, rcfg, budgets,
                                  hide_budget, rollouts, batch_size, mesh, compute_dtype)
    (b0, t0), (b1, t1), keep = _draw_matched(k_draw, r_base.turns.active, r_rl.turns.active, int(n_states))
    ctx0, len0, st0, h0 = state_contexts(r_base, b0, t0)
    ctx1, len1, st1, h1 = state_contexts(r_rl, b1, t1)
    mask = jnp.asarray(np.concatenate([keep, keep]))
    ctx, ctx_len, states = _cat(ctx0, ctx1), jnp.where(mask, _cat(len0, len1), 1), _cat(st0, st1)
    h = jnp.where(mask, _cat(h0, h1), 1)
    q = q_outcomes(world, states, h, env_params)
    scored = _score_pair(world, cfg, params_base, params_rl, ctx, ctx_len, q, k_g,
                         temperature=temperature_of(rcfg.sampler), n_sampled=n_sampled, score_batch=score_batch,
                         mesh=mesh)
    turn = jnp.asarray(np.concatenate([t0, t1]))
    source = jnp.asarray(np.repeat(np.arange(2), int(n_states)))
    depth = turn / t_max
    out = _quality_summaries(scored, mask, depth, source, n_bins=n_bins, tol=tol)
    out.update(scored)
    out.update(depth=depth, source=source, episode=jnp.asarray(np.concatenate([b0, b1])), turn=turn, mask=mask,
               remaining=h)
    return to_host(out)


@functools.partial(jax.jit, static_argnames=("env", "tol"))
def _error_actions_jit(states, h_I, env_params, *, env, tol):
    def one(state, h):
        q_A = env.q_values(state, h, env_params)
        mdp = fls.mdp_from_map(state.map_LxL, env_params.success_rate)
        p_end_A = mdp.P_XxAxX[state.pos] @ mdp.terminal_X.astype(jnp.float32)  # P(next state ends the episode)
        non_terminating_A = p_end_A <= 0.0
        return sq.choose_error_action(q_A, non_terminating_A, tol=tol), q_A, non_terminating_A
    return jax.vmap(one)(states, h_I)


def error_actions(world, states, h_I, env_params, *, tol: float = 0.0):
    """The injected error action at each state (docs/study.md, "jaxagent's definitions", Error state): among the
    non-terminating actions (no probability of entering a hole or the goal), the one with the lowest
    Q*_h(s, a) below max_a Q*_h(s, a) - tol (`step_quality.choose_error_action`), -1 if none.
    Returns (action int32[I], q int32[I, A], non_terminating bool[I, A])."""
    return _error_actions_jit(states, jnp.asarray(h_I, jnp.int32), env_params, env=world.env, tol=float(tol))


@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt"))
def _inject_jit(tokens_IxS, start_I, states, action_I, turn_I, budget_I, hide, env_params, replies_AxM, reply_len_A, *,
                env, layout, fmt):
    w = tokens_IxS.shape[1]

    def one(tok_S, start, state, a, t, budget):
        a = jnp.maximum(a, 0)
        step = env.step_action(state, a, env_params)
        tok_S = jnp.where(jnp.arange(w) < start, tok_S, layout.pad_id)
        tok_S = write_span(tok_S, replies_AxM[a], start, reply_len_A[a])
        chunk, clen = prompt_chunk(layout, fmt, env, step.obs, t + 1, budget, hide)
        tok_S = write_span(tok_S, chunk, start + reply_len_A[a], clen)
        return tok_S, start + reply_len_A[a] + clen, step.state, step.done

    return jax.vmap(one)(tokens_IxS, start_I, states, action_I, turn_I, budget_I)


def _error_pool(world, r: types.Rollout, env_params, hide_budget, width, tol):
    """Candidate error states of every (episode, turn) of a rollout, and their injected contexts."""
    b_n, h_n = r.turns.active.shape
    bb, tt = np.divmod(np.arange(b_n * h_n), h_n)
    toks, start, states, h = state_contexts(r, bb, tt)
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


def _continuation_plans(rollouts, source, episode, turn, action, keep, pre_q, mask, t_max: int, tol: float):
    """Per drawn state i (trajectory `episode[i]` of policy `source[i]`, turn t = `turn[i]`): the forced actions of
    its error continuation (the trajectory's actions up to t - 1, the error at t) and of its control (the
    trajectory's own move at t instead), the episode's budget, and whether the control exists: the own move valid,
    optimal (Q*_h = V* > 0 within `tol`) and not ending the episode. Unfilled slots (`keep` False) force nothing."""
    acts = [np.asarray(r.turns.action) for r in rollouts]
    active = [np.asarray(r.turns.active) for r in rollouts]
    budget_src = [np.asarray(r.budget) for r in rollouts]
    n_s = episode.size
    forced = np.full((n_s, t_max), -1, np.int32)
    budgets = np.full(n_s, t_max, np.int32)
    own = np.full(n_s, -1, np.int32)
    for i in np.flatnonzero(keep):
        src, b, t = source[i], episode[i], turn[i]
        forced[i, :t] = acts[src][b, :t]
        forced[i, t] = action[i]
        if t + 1 < t_max and active[src][b, t + 1]:
            own[i] = acts[src][b, t]
        budgets[i] = budget_src[src][b]
    own_q = np.take_along_axis(pre_q, np.clip(own, 0, fls.N_ACTIONS - 1)[:, None], 1)[:, 0]
    control_ok = mask & (own >= 0) & (own < fls.N_ACTIONS) & (own_q >= pre_q.max(-1) - tol) & (own_q > 0)
    forced_ctrl = forced.copy()
    rows = np.flatnonzero(control_ok)
    forced_ctrl[rows, turn[rows]] = own[rows]
    return forced, forced_ctrl, budgets, control_ok


def _replayed(ok, continuations, traj_pos, turn, pos_next, c: int):
    """`ok` & (every continuation of state i walked the trajectory's cells up to turn t and stood on pos_next[i]
    at t + 1); a state whose t + 1 is past the horizon (an unfilled slot) is never replayed."""
    ok = np.asarray(ok, bool).copy()
    n_s, t_max = traj_pos.shape[0], traj_pos.shape[1]
    for cont in continuations:
        pos = np.asarray(cont.env_states.pos).reshape(n_s, c, t_max)
        for i in range(n_s):
            t = turn[i]
            if not ok[i] or t + 1 >= t_max:
                ok[i] = False
                continue
            ok[i] &= bool((pos[i, :, :t + 1] == traj_pos[i, :t + 1]).all() and (pos[i, :, t + 1] == pos_next[i]).all())
    return ok


def _check_error_setup(rcfg: RolloutConfig, t_max: int, env_params, n_continuations: int) -> None:
    """`error_states`' preconditions: a forced replay reproduces the trajectory's env states only on a deterministic
    lake, and forced actions need a rollout compile that takes them."""
    check_rcfg(rcfg, t_max)
    if float(np.asarray(env_params.success_rate)) != 1.0:
        raise ValueError("error_states replays trajectories with forced actions: it needs a deterministic lake "
                         f"(env_params.success_rate == 1), got {env_params.success_rate}")
    if not rcfg.allow_forced:
        raise ValueError("error_states needs RolloutConfig(allow_forced=True); use the same rcfg for every driver "
                         "so that they share one rollout compile")
    if int(n_continuations) < 1:
        raise ValueError(f"n_continuations must be >= 1, got {n_continuations}")


def _score_error_states(world, cfg, params_base, params_rl, pools, drawn, keep, key, *, t_max: int, env_params,
                        rcfg: RolloutConfig, n_sampled: int, score_batch: int, mesh):
    """(a) of `error_states`: the drawn cells' error states (base-drawn first) with both policies scored exactly
    there, and Q*_h of every action at the cell before the error (for the control's own move). Unfilled slots
    (`keep` False) get context length 1 and 1 turn left, values the scoring accepts (`mask` leaves them out).
    Returns (sel: the pools' fields at the drawn cells, mask [I], ctx_len [I], h [I], scored, pre_q [I, A])."""
    (b0, t0), (b1, t1) = drawn
    flat = [jnp.asarray(b0 * t_max + t0), jnp.asarray(b1 * t_max + t1)]  # pools are flat over (episode, turn)
    take = lambda src, name: jax.tree.map(lambda x: x[flat[src]], pools[src][name])  # noqa: E731
    sel = {k: _cat(take(0, k), take(1, k)) for k in ("ctx", "ctx_len", "states", "action", "h", "pre_states")}
    mask = jnp.asarray(np.concatenate([keep, keep]))
    ctx_len = jnp.where(mask, sel["ctx_len"], 1)
    h = jnp.where(mask, sel["h"], 1)
    q = q_outcomes(world, sel["states"], h, env_params)
    scored = _score_pair(world, cfg, params_base, params_rl, sel["ctx"], ctx_len, q, key,
                         temperature=temperature_of(rcfg.sampler), n_sampled=n_sampled, score_batch=score_batch,
                         mesh=mesh)
    pre_q = q_outcomes(world, sel["pre_states"], jnp.where(mask, sel["h"] + 1, 1), env_params)[:, :fls.N_ACTIONS]
    return sel, mask, ctx_len, h, scored, pre_q


def _run_continuations(world, cfg, params_base, params_rl, rollouts, source, episode, budgets_s, forced,
                       forced_ctrl, key, *, c: int, env_params, rcfg: RolloutConfig, hide_budget, batch_size, mesh,
                       compute_dtype):
    """(b) and (c) of `error_states`: C rollouts per state and policy on the trajectory's lake, forced along the
    error plan and then along the control plan, all with the same key so that both policies and both plans share
    their random numbers. Returns (cont_base, cont_rl, success_base [I, C], success_rl [I, C], ctrl_base,
    ctrl_rl); rollout rows = state * C + continuation."""
    r_base, r_rl = rollouts
    maps = [r_base.env_states.map_LxL[:, 0], r_rl.env_states.map_LxL[:, 0]]
    task_maps = jnp.where(jnp.asarray(source == 0)[:, None, None], maps[0][jnp.asarray(episode)],
                          maps[1][jnp.asarray(episode)])
    rep = lambda x: np.repeat(x, c, axis=0)  # noqa: E731  row = state * C + continuation
    run = functools.partial(run_rollouts, world, cfg, tasks=jnp.repeat(task_maps, c, axis=0), budgets=rep(budgets_s),
                            key=key, env_params=env_params, rcfg=rcfg, hide_budget=hide_budget,
                            batch_size=batch_size, mesh=mesh, compute_dtype=compute_dtype)
    n_s = episode.size
    cont_base, cont_rl = (run(params=params_base, forced_actions=rep(forced)),
                          run(params=params_rl, forced_actions=rep(forced)))
    success_base = cont_base.success.reshape(n_s, c)
    success_rl = cont_rl.success.reshape(n_s, c)
    ctrl_base, ctrl_rl = (run(params=params_base, forced_actions=rep(forced_ctrl)),
                          run(params=params_rl, forced_actions=rep(forced_ctrl)))
    return cont_base, cont_rl, success_base, success_rl, ctrl_base, ctrl_rl


def _replay_checks(rollouts, source, episode, turn, mask, err_states, control_ok, continuations, controls, c: int,
                   t_max: int):
    """(replay_ok, control_ok): positions up to turn t equal the trajectory's, and the position at t + 1 is the
    error state's (the continuations) or the trajectory's own (the controls); a replay that left the trajectory
    would compare the policies at states other than the drawn ones."""
    r_base, r_rl = rollouts
    n_s = episode.size
    traj_pos = np.stack([np.asarray(r_base.env_states.pos), np.asarray(r_rl.env_states.pos)])[source, episode]
    replay_ok = _replayed(np.asarray(mask), continuations, traj_pos, turn, np.asarray(err_states.pos), c)
    control_ok = _replayed(control_ok, controls, traj_pos, turn,
                           traj_pos[np.arange(n_s), np.minimum(turn + 1, t_max - 1)], c)
    return replay_ok, control_ok


def error_states(world, cfg: Qwen3Config, params_base, params_rl, tasks, key, *, t_max: int, n_states: int,
                 env_params, rcfg: RolloutConfig, n_continuations: int = 4, n_sampled: int = 16, n_bins: int = 4,
                 budgets=None, hide_budget=False, rollouts=None, batch_size: Optional[int] = None,
                 score_batch: int = 16, tol: float = 0.0, n_boot: int = 1000, return_rollouts: bool = False,
                 mesh=None, compute_dtype=None) -> dict:
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
      (c) the control: the same continuations from the same cell with the trajectory's own move at turn t
          replayed instead of the error, where that move was optimal (Q*_h = V* > 0, so no error state follows):
          same depth, h - 1 turns left, same key; `control_ok` [I] marks the states that have one (the own move
          valid and optimal, the replay on the trajectory's path).
    Needs a deterministic lake (success_rate 1) and rcfg.allow_forced.
    Returns metrics (`step_quality.error_state_metrics` on the exact qualities: share_rl_better,
    share_rl_worse, success_rl, success_base, success_diff, each a CI), exact / sampled summaries and by
    depth, and per-state arrays: action [I], pre_q [I, A], q [I, O], probs_base/rl, q_exact_base/rl,
    success_base/rl [I, Y], success_control_base/rl [I, Y] and control_ok [I] of (c), replay_ok [I] (the
    replay met the trajectory's positions up to turn t and the error state at t + 1), context [I, S] / context_len [I] of (a), episode, turn, source, depth, mask,
    remaining (turns left at the error state). return_rollouts adds the trajectories, the continuation and the
    control rollouts (rows = state * C + continuation). `mesh`, `compute_dtype`: as in `step_quality_matched`.
    """
    _check_error_setup(rcfg, t_max, env_params, n_continuations)
    k_roll, k_draw, k_g, k_cont, k_ci = jax.random.split(key, 5)
    r_base, r_rl = _both_rollouts(world, cfg, params_base, params_rl, tasks, k_roll, t_max, env_params, rcfg, budgets,
                                  hide_budget, rollouts, batch_size, mesh, compute_dtype)
    pools = [_error_pool(world, r, env_params, hide_budget, rcfg.max_context, tol) for r in (r_base, r_rl)]
    (b0, t0), (b1, t1), keep = _draw_matched(k_draw, pools[0]["cand"], pools[1]["cand"], int(n_states))
    sel, mask, ctx_len, h, scored, pre_q = _score_error_states(
        world, cfg, params_base, params_rl, pools, ((b0, t0), (b1, t1)), keep, k_g, t_max=t_max,
        env_params=env_params, rcfg=rcfg, n_sampled=n_sampled, score_batch=score_batch, mesh=mesh)

    # (b) continuations from identical error states: replay the trajectory, force the error, let the policy act;
    # (c) the control: the same cell after the trajectory's own optimal move.
    episode, turn = np.concatenate([b0, b1]), np.concatenate([t0, t1])
    source = np.repeat(np.arange(2), int(n_states))
    n_s, c = episode.size, int(n_continuations)
    forced, forced_ctrl, budgets_s, control_ok = _continuation_plans(
        (r_base, r_rl), source, episode, turn, np.asarray(sel["action"]), np.tile(keep, 2), np.asarray(pre_q),
        np.asarray(mask), t_max, tol)
    cont_base, cont_rl, success_base, success_rl, ctrl_base, ctrl_rl = _run_continuations(
        world, cfg, params_base, params_rl, (r_base, r_rl), source, episode, budgets_s, forced, forced_ctrl, k_cont,
        c=c, env_params=env_params, rcfg=rcfg, hide_budget=hide_budget, batch_size=batch_size, mesh=mesh,
        compute_dtype=compute_dtype)
    replay_ok, control_ok = _replay_checks((r_base, r_rl), source, episode, turn, mask, sel["states"], control_ok,
                                           (cont_base, cont_rl), (ctrl_base, ctrl_rl), c, t_max)

    ones = jnp.ones((n_s, 1), bool)
    metrics = sq.error_state_metrics(scored["q_exact_base"][:, None], ones, scored["q_exact_rl"][:, None], ones,
                                     success_base, success_rl, k_ci, tol=tol, state_mask_I=mask, n_boot=n_boot)
    depth = jnp.asarray((turn + 1) / t_max)
    out = _quality_summaries(scored, mask, depth, jnp.asarray(source), n_bins=n_bins, tol=tol)
    out.update(scored)
    out.update(metrics=metrics, action=sel["action"], pre_q=pre_q, success_base=success_base, success_rl=success_rl,
               replay_ok=replay_ok, episode=episode, turn=turn, source=source, depth=depth, mask=mask, remaining=h,
               context=sel["ctx"], context_len=ctx_len, control_ok=control_ok,
               success_control_base=ctrl_base.success.reshape(n_s, c),
               success_control_rl=ctrl_rl.success.reshape(n_s, c))
    host = to_host(out)
    if return_rollouts:
        host["rollouts"] = {"base": r_base, "rl": r_rl, "continuation_base": cont_base, "continuation_rl": cont_rl,
                            "control_base": ctrl_base, "control_rl": ctrl_rl}
    return host


@functools.partial(jax.jit, static_argnames=("env", "layout", "fmt", "width"))
def _first_turn_jit(maps, budget, hide, env_params, *, env, layout, fmt, width):
    system = jnp.asarray(layout.system, jnp.int32)

    def one(task):
        state, obs = env.reset(jax.random.key(0), task, env_params)
        chunk, clen = prompt_chunk(layout, fmt, env, obs, 0, budget, hide)
        row = jnp.full((width,), layout.pad_id, jnp.int32).at[:system.shape[0]].set(system)
        return write_span(row, chunk, system.shape[0], clen), system.shape[0] + clen, state

    return jax.vmap(one)(maps)


def first_turn_contexts(world, tasks, *, t_max: int, env_params, width: int, hide_budget=False):
    """The first-turn context of each task as the rollout builds it (system turn + turn-0 chunk with budget
    t_max): (tokens int32[P, width], lengths int32[P], initial env states)."""
    return _first_turn_jit(jnp.asarray(tasks), jnp.asarray(t_max, jnp.int32), jnp.asarray(hide_budget, bool),
                           env_params, env=world.env, layout=world.layout, fmt=world.fmt, width=int(width))


def first_move_optimality(world, cfg: Qwen3Config, params, heldout_tasks, *, t_max: int, env_params,
                          sampler: Sampler = Sampler(), width: Optional[int] = None, score_batch: int = 16,
                          hide_budget=False, tol: float = 1e-6) -> dict:
    """A diagnostic of the first move: mean over held-out tasks' first-turn states of the probability mass pi
    puts on Q*-optimal actions, Q*_h with h = t_max (`dynamics.optimal_action_mass`,
    `dynamics.optimal_action_mask` with tolerance tol for float ties); pi scored exactly as in
    `step_quality_matched` (the invalid remainder is never optimal). It is NOT the study's R_single: good
    first moves are part of multi-turn success, so it rises with R_multi by construction (R_single is the
    plan-mode success of `study.plan_mode`). width: context slots (default the smallest bucket holding a
    first turn; pass rcfg.max_context to share the scoring compile).
    Returns optimal_mass, probs [P, A], invalid_mass [P], optimal [P, A], q [P, A].
    """
    replies, _ = canonical_replies(world)
    need = len(world.layout.system) + max_chunk(world.layout, world.fmt, world.env) + replies.shape[1]
    width = bucket(need) if width is None else int(width)
    ctx, ctx_len, states = first_turn_contexts(world, heldout_tasks, t_max=t_max, env_params=env_params, width=width,
                                               hide_budget=hide_budget)
    probs = next_action_probs(world, cfg, params, ctx, ctx_len, temperature=temperature_of(sampler),
                              score_batch=score_batch)
    q = q_outcomes(world, states, jnp.full(ctx_len.shape, t_max, jnp.int32), env_params)[:, :fls.N_ACTIONS]
    optimal = dynamics.optimal_action_mask(q, tol=tol)
    return to_host({"optimal_mass": dynamics.optimal_action_mass(probs[:, :fls.N_ACTIONS], optimal),
                    "probs": probs[:, :fls.N_ACTIONS],
                     "invalid_mass": probs[:, fls.N_ACTIONS], "optimal": optimal, "q": q})
