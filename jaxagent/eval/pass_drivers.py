"""Pass@(K,T) drivers: any env through its rollout function (`pass_kt_of`); FrozenLake's grid in every budget mode
with the study's row chunks and placement (`pass_kt`), and its exact structural bound (`upper_bound`).

Dimension legend (CONVENTIONS.md): B episodes (rollout rows), P tasks, Z samples per task and tier, U budget
tiers, J values of k, L map side, N turns. Axis order as in `passk`: tier, k, task, sample.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.eval import bounds, costs, passk
from jaxagent.eval.driver_common import check_rcfg, n_rows, run_rollouts, to_host
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import episode, types
from jaxagent.rollout.jax_loop import RolloutConfig, t_max_of

MODES = ("announced", "truncated", "hidden")


def _truncated_costs(r: types.Rollout, tier: int):
    """Status, turns, policy tokens of a T_max run seen through budget `tier` (what the same episode, budget
    hidden, would have reported had it been stopped at `tier` turns)."""
    done = episode.finished(r.status)
    within = r.turns_used <= tier
    status = jnp.where(done & within, r.status,
                       jnp.where((r.status == types.CONTEXT_EXHAUSTED) & (r.turns_used < tier),
                                 types.CONTEXT_EXHAUSTED, types.BUDGET_EXHAUSTED))
    turns = jnp.minimum(r.turns_used, tier)
    tokens = jnp.sum(jnp.where(r.turns.forced, 0, r.turns.span_len)[:, :tier], axis=1)
    return status, turns, tokens


def pass_kt(world, cfg: Qwen3Config, params, tasks, key, *, t_max: int, tiers: Optional[Sequence[int]] = None,
            n_samples: int, ks: Sequence[int], env_params, rcfg: RolloutConfig, mode: str = "announced",
            batch_size: Optional[int] = None, n_boot: int = 1000, mesh=None, compute_dtype=None) -> dict:
    """Pass@(K,T) of one policy on `tasks` (P maps), n_samples episodes per task and budget tier.

    Estimator (docs/study.md, "jaxagent's definitions", Pass@(K,T); Chen et al. 2021 eq. 1):
    pass[t, k, task] = 1 - C(n - c, k) / C(n, k), c successes among the n = n_samples episodes of the
    task at tier t; grid[t, k] = mean over tasks. Modes:
      announced: separate rollouts per tier T, the budget T written into every prompt;
      truncated: one T_max run per sample with the budget hidden (docs/study.md), success at tier T iff the
                 episode succeeded with turns_used <= T; costs per tier as if stopped after T turns;
      hidden:    like announced (separate rollouts, budget T enforced) but the budget text hidden
                 (`hide_budget=True`; docs/study.md finding 9's open question).
    Every tier's rollouts (and the truncated run) use the same key and row layout (row = task * Z +
    sample), so 'hidden' equals 'truncated' episode by episode: the announced mode of a policy that
    cannot see the budget text.

    Returns tiers [U], ks [J], grid [U, J], per_task [U, J, P], success [U, P, Z], pass_at_t [U] (K =
    max(ks)) with its task-bootstrap CI pass_at_t_ci, and costs: `costs.cost_summary` per tier (each
    value [U]; env calls = turns, as every turn steps the env). `mesh`, `compute_dtype`: where and in
    which dtype the rollouts run (`driver_common.run_rollouts`).
    """
    check_rcfg(rcfg, t_max)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tiers_U, ks_J, n_tasks, rows = _grid(tasks, t_max, tiers, n_samples, ks)
    n_eps = n_tasks * n_samples
    k_roll, k_ci = jax.random.split(key)
    run = functools.partial(run_rollouts, world, cfg, params, rows, key=k_roll, env_params=env_params, rcfg=rcfg,
                            batch_size=batch_size, mesh=mesh, compute_dtype=compute_dtype)
    if mode == "truncated":
        r = run(budgets=np.full(n_eps, t_max), hide_budget=True)
        to_success_PxZ = costs.turns_to_success(r.status, r.turns_used).reshape(n_tasks, n_samples)
        success_UxPxZ = passk.truncated_success(to_success_PxZ, tiers_U)
        per_tier = [_truncated_costs(r, int(t)) for t in tiers_U]
    else:
        per_tier, success_UxPxZ = _per_tier(lambda t: run(budgets=np.full(n_eps, t), hide_budget=mode == "hidden"),
                                            tiers_U, n_tasks, n_samples)
    return _result(mode, tiers_U, ks_J, success_UxPxZ, per_tier, k_ci, n_boot)


def _grid(tasks, t_max, tiers, n_samples, ks):
    """The checked tiers [U] and ks [J], the task count P and each task's row repeated n_samples times."""
    tiers_U = np.asarray(budgets_lib.budget_tiers(t_max) if tiers is None else tiers, np.int32)
    budgets_lib.validate_budgets(tiers_U, t_max)
    ks_J = np.asarray(ks, np.int32)
    if int(n_samples) < 1 or ks_J.ndim != 1 or ks_J.size == 0 or ks_J.min() < 1 or ks_J.max() > n_samples:
        raise ValueError(f"ks must be a non-empty list of k in [1, n_samples={n_samples}], got {list(ks)}")
    rows = jax.tree.map(lambda x: jnp.repeat(jnp.asarray(x), n_samples, axis=0), tasks)
    return tiers_U, ks_J, n_rows(tasks), rows


def _per_tier(run_at, tiers_U, n_tasks, n_samples):
    """Separate rollouts per tier (`run_at(t)`): their (status, turns, tokens) and success [U, P, Z]."""
    per_tier, success = [], []
    for t in tiers_U:
        r = run_at(t)
        per_tier.append((r.status, r.turns_used, r.generated_tokens))
        success.append(r.success.reshape(n_tasks, n_samples))
    return per_tier, jnp.stack(success)


def _result(mode, tiers_U, ks_J, success_UxPxZ, per_tier, k_ci, n_boot) -> dict:
    status_U, turns_U, tokens_U = (jnp.stack(x) for x in zip(*per_tier))
    kmax = int(np.argmax(ks_J))
    stats = _pass_stats(success_UxPxZ, status_U, turns_U, tokens_U, jnp.asarray(ks_J), k_ci, kmax=kmax,
                        n_boot=int(n_boot))
    return to_host({"mode": mode, "tiers": tiers_U, "ks": ks_J, "success": success_UxPxZ,
                    "pass_at_t_k": int(ks_J[kmax]), **stats})


def pass_kt_of(rollout_fn, params, tasks, key, *, n_samples: int, ks: Sequence[int],
               tiers: Optional[Sequence[int]] = None, t_max: Optional[int] = None, n_boot: int = 1000) -> dict:
    """Pass@(K,T) of one policy on any env, announced mode: for each budget tier T, `rollout_fn(params, rows,
    budgets, key)` runs n_samples episodes of each of the P tasks (row = task * Z + sample, every tier with the same
    key) with budget T announced. Estimator as `pass_kt` (Chen et al. 2021 eq. 1 per task and tier, then the mean
    over tasks). `tasks`: a pytree with P rows per leaf; tiers default to `budgets.budget_tiers(T_max)`, T_max read
    from the rollout_fn's RolloutConfig (`rollout.make_rollout_fn`) unless given. Returns tiers [U], ks [J],
    grid [U, J], per_task [U, J, P], success [U, P, Z], pass_at_t [U] at K = max(ks) with its task-bootstrap CI
    pass_at_t_ci, and `costs.cost_summary` per tier."""
    t_max = t_max_of(rollout_fn, t_max)
    tiers_U, ks_J, n_tasks, rows = _grid(tasks, t_max, tiers, n_samples, ks)
    k_roll, k_ci = jax.random.split(key)
    per_tier, success_UxPxZ = _per_tier(
        lambda t: rollout_fn(params, rows, jnp.full((n_tasks * n_samples,), t, jnp.int32), k_roll),
        tiers_U, n_tasks, n_samples)
    return _result("announced", tiers_U, ks_J, success_UxPxZ, per_tier, k_ci, n_boot)


@functools.partial(jax.jit, static_argnames=("kmax", "n_boot"))
def _pass_stats(success_UxPxZ, status_UxB, turns_UxB, tokens_UxB, ks_J, key, *, kmax, n_boot):
    """The metric functions of `pass_kt` in one compiled program (env calls = turns)."""
    per_task = passk.pass_at_k_grid(success_UxPxZ, ks_J)
    ci = passk.bootstrap_ci(per_task[:, kmax, :], key, n_boot=n_boot)
    return {"grid": jnp.mean(per_task, axis=-1), "per_task": per_task, "pass_at_t": ci.mean, "pass_at_t_ci": ci,
            "costs": costs.cost_curves(status_UxB, turns_UxB, tokens_UxB, turns_UxB)}


@functools.partial(jax.jit, static_argnames=("horizon",))
def slippery_p_star(maps_PxLxL, success_rate, *, horizon):
    """p*(t) per map [P, horizon + 1]: the probability that the optimal policy reaches the goal within t turns
    on a slippery map (each move goes where intended with probability `success_rate`), by dynamic programming
    over the MDP (`envs.jax.frozenlake_solver.success_prob_within`)."""
    def one(map_LxL):
        mdp = fls.mdp_from_map(map_LxL, success_rate)
        within = fls.success_prob_within(mdp.P_XxAxX, mdp.goal_X, mdp.terminal_X, horizon)  # [horizon + 1, cells]
        return within[:, jnp.argmax(map_LxL.reshape(-1) == fls.START)]
    return jax.vmap(one)(maps_PxLxL)


def upper_bound(world, tasks, *, tiers: Sequence[int], ks: Sequence[int], env_params) -> dict:
    """Exact structural Pass@(K,T) bound of FrozenLake tasks (docs/study.md, "jaxagent's definitions").

    p*[task, T] = the best success probability of any policy within T turns: deterministic lake
    (success_rate 1): 1[shortest path <= T] (BFS); slippery: max-probability DP `success_prob_within` from
    the start cell. bound[U, J] = mean_task 1 - (1 - p*)^K (`bounds.pass_at_k_bound`). Returns tiers, ks,
    p_star [U, P], per_task [U, J, P], grid [U, J], min_turns [P] (-1 unreachable; deterministic only).
    """
    tiers_U = np.asarray(tiers, np.int32)
    ks_J = np.asarray(ks, np.int32)
    if tiers_U.ndim != 1 or tiers_U.size == 0 or tiers_U.min() < 0:
        raise ValueError(f"tiers must be a non-empty list of budgets >= 0, got {list(tiers)}")
    maps = jnp.asarray(tasks)
    if maps.ndim != 3 or maps.shape[1:] != (world.env.size, world.env.size):
        raise ValueError(f"tasks must be maps [P, {world.env.size}, {world.env.size}], got {maps.shape}")
    rate = float(np.asarray(env_params.success_rate))
    out = {"tiers": tiers_U, "ks": ks_J}
    if rate == 1.0:
        steps = jax.jit(jax.vmap(fls.shortest_path_length))(maps)
        min_turns = jnp.where(steps >= fls.UNREACHABLE, -1, steps).astype(jnp.int32)
        p_star = bounds.success_prob_from_min_turns(min_turns, tiers_U)
        out["min_turns"] = min_turns
    else:
        p_star = slippery_p_star(maps, rate, horizon=int(tiers_U.max()))[:, tiers_U].T  # [U, P]
    per_task = bounds.pass_at_k_bound_per_task(p_star, ks_J)
    out.update(p_star=p_star, per_task=per_task, grid=jnp.mean(per_task, axis=-1))
    return to_host(out)
