"""The state findings of the FrozenLake study's eval stage, base vs each MAIN_ARM seed on that seed's held-out
maps (`findings` module doc for the keys and verdicts): 3, step quality on matched states (G =
preset.eval.n_sampled sampled actions per policy and state; the exact expectation as a secondary line), and 4,
error states with the goal still reachable (V* > 0). An invalid reply is scored as invalid
(`step_quality.score_outcomes`). Each returns the rows of its by-depth figure (None without states).
"""
from __future__ import annotations

import jax
import numpy as np

from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.eval import state_drivers, stats, step_quality
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import mean, scored, to_np
from jaxagent.study.frozenlake.measure import MAIN_ARM, placement, pooled, score_batch


def included(ctx: EvalContext, s: int) -> bool:
    """Whether MAIN_ARM's seed `s` enters the primary estimates (`health.SeedHealth.included`)."""
    return ctx.hl[(MAIN_ARM, s)].included


def step_quality_rows(ctx: EvalContext, grpo_seeds) -> dict | None:
    """Finding 3: step quality on matched states, G sampled actions per policy and state. Judged (`.diff`): per
    state sign(mean Q* RL - mean Q* base), so the seed's mean is the share of states where RL is better minus the
    share where it is worse (ties count in neither); the mean Q* difference is printed beside it (`.q_diff`). Room:
    RL can be better only where base's mean Q* is below V*(s) and worse only where it is above 0, so the
    difference lies in [-share(base > 0), share(base < V*)]."""
    run, p, est, m, tasks = ctx.run, ctx.preset, ctx.est, ctx.m, ctx.tasks
    n_act = fls.N_ACTIONS
    sq_runs = pooled(run, lambda b, r, s: state_drivers.step_quality_matched(
        run.world, run.cfg, b, r, tasks[s], jax.random.key(100 + s), t_max=p.task.t_max, n_states=p.eval.n_states,
        env_params=p.task.env_params(), rcfg=ctx.rcfg, n_sampled=int(p.eval.n_sampled),
        batch_size=p.n_tasks * p.group_size, score_batch=score_batch(run), **placement(run)),
        "step_quality", ctx.base, ctx.policies, grpo_seeds)
    f3 = {}
    for s, x in sq_runs:
        mask = np.asarray(x["mask"], bool)
        sb, sr = scored(x, "base", n_act), scored(x, "rl", n_act)
        mb, mr = sb["sampled"].mean(-1)[mask], sr["sampled"].mean(-1)[mask]
        v_star = np.asarray(x["q"], np.float64)[:, :n_act].max(-1)[mask]  # Q* <= V*: RL's mean Q* <= V*
        f3[s] = dict(mb=mb, mr=mr, eb=sb["exact"][mask], er=sr["exact"][mask], inv_b=sb["invalid_share"][mask],
                     v_star=v_star,
                     inv_r=sr["invalid_share"][mask], depth=np.asarray(x["depth"], np.float64)[mask],
                     g=sb["sampled"].shape[-1])
    key = "f3_step_frozenlake"
    # judged: per state sign(mean Q* RL - mean Q* base), whose seed mean is the share RL better - RL worse (ties 0)
    est.put(f"{key}.diff", {s: np.sign(v["mr"] - v["mb"]) for s, v in f3.items()}, [MAIN_ARM])
    est.put(f"{key}.q_diff", {s: v["mr"] - v["mb"] for s, v in f3.items()}, [MAIN_ARM])
    est.put(f"{key}.exact", {s: v["er"] - v["eb"] for s, v in f3.items()}, [MAIN_ARM])
    m[f"{key}.exact_diff"] = m[f"{key}.exact.mean"]
    for name, fn in (("share_rl_better", lambda v: mean(v["mr"] > v["mb"])),
                     ("share_equal", lambda v: mean(v["mr"] == v["mb"])),
                     ("share_rl_worse", lambda v: mean(v["mr"] < v["mb"])),
                     ("mean_q_base", lambda v: mean(v["mb"])), ("mean_q_rl", lambda v: mean(v["mr"])),
                     ("mean_v_star", lambda v: mean(v["v_star"])),
                     ("invalid_base", lambda v: mean(v["inv_b"])), ("invalid_rl", lambda v: mean(v["inv_r"])),
                     ("exact_share_rl_better", lambda v: mean(v["er"] > v["eb"])),
                     ("exact_share_equal", lambda v: mean(v["er"] == v["eb"]))):
        est.mean(f"{key}.{name}", {s: fn(v) for s, v in f3.items()}, [MAIN_ARM])
    # RL can be better only where base's mean Q* is below V*, worse only where it is above 0
    est.room(key, {s: -mean(v["mb"] > 0) for s, v in f3.items()},
             {s: mean(v["mb"] < v["v_star"]) for s, v in f3.items()}, [MAIN_ARM])
    m[f"{key}.n_states"] = float(sum(v["mb"].size for s, v in f3.items() if included(ctx, s)))
    m[f"{key}.g"] = float(next(iter(f3.values()))["g"])
    use = [v for s, v in f3.items() if included(ctx, s)] or list(f3.values())
    cat = lambda name: np.concatenate([v[name] for v in use])  # noqa: E731  pooled for the figure only
    if not cat("mb").size:
        return None
    ones = np.ones((cat("mb").size, 1), bool)
    return to_np(step_quality.step_quality_by_depth(cat("mb")[:, None], ones, cat("mr")[:, None], ones,
                                                    cat("depth")))


def _gap(x: dict, rl: str, base: str, use) -> np.ndarray:
    """Per state: mean continuation success of `rl` minus that of `base` (arrays [I, C]), on the states in `use`."""
    return (np.asarray(x[rl], np.float64).mean(-1) - np.asarray(x[base], np.float64).mean(-1))[use]


def control_row(ctx: EvalContext, f4: dict) -> None:
    """Finding 4's control (beyond the paper): per state with a control, RL - base continuation success from the
    error state minus the same from the same cell after the trajectory's own optimal move; per seed the mean over
    its states."""
    if not f4:
        return
    key, main = "f4_control_frozenlake", [MAIN_ARM]
    ctx.est.put(f"{key}.diff", {s: v["ge"] - v["gc"] for s, v in f4.items()}, main)
    ctx.est.mean(f"{key}.gap_error", {s: mean(v["ge"]) for s, v in f4.items()}, main)
    ctx.est.mean(f"{key}.gap_control", {s: mean(v["gc"]) for s, v in f4.items()}, main)
    ctx.m[f"{key}.n_states"] = float(sum(v["ge"].size for s, v in f4.items() if included(ctx, s)))


def error_state_rows(ctx: EvalContext, grpo_seeds) -> dict | None:
    """Finding 4: error states where the goal is still reachable (V* > 0): continuation success RL - base, the
    share of states where RL's next step is better, the deep half vs the shallow half of the states, and the
    control (`control_row`)."""
    run, p, est, m, tasks = ctx.run, ctx.preset, ctx.est, ctx.m, ctx.tasks
    n_act = fls.N_ACTIONS
    er_runs = pooled(run, lambda b, r, s: state_drivers.error_states(
        run.world, run.cfg, b, r, tasks[s], jax.random.key(200 + s), t_max=p.task.t_max,
        n_states=p.eval.n_error_states, env_params=p.task.env_params(), rcfg=ctx.rcfg,
        n_sampled=int(p.eval.n_sampled), n_continuations=int(p.eval.n_continuations),
        batch_size=p.n_tasks * p.group_size, n_boot=p.eval.n_boot,
        score_batch=score_batch(run), **placement(run)),
        "error_states", ctx.base, ctx.policies, grpo_seeds)
    f4, unreachable = {}, 0
    for s, x in er_runs:
        mask = np.asarray(x["mask"], bool) & np.asarray(x.get("replay_ok", x["mask"]), bool)
        v_star = np.asarray(x["q"], np.float64)[:, :n_act].max(-1)
        reach = mask & (v_star > 0)
        if included(ctx, s):
            unreachable += int((mask & ~(v_star > 0)).sum())
        sb, sr = scored(x, "base", n_act), scored(x, "rl", n_act)
        f4[s] = dict(mb=sb["sampled"].mean(-1)[reach], mr=sr["sampled"].mean(-1)[reach],
                     eb=sb["exact"][reach], er=sr["exact"][reach],
                     cb=np.asarray(x["success_base"], np.float64).mean(-1)[reach],
                     cr=np.asarray(x["success_rl"], np.float64).mean(-1)[reach],
                     depth=np.asarray(x["depth"], np.float64)[reach])
        if "control_ok" in x:  # the control continuation (`state_drivers.error_states` (c))
            ctl = reach & np.asarray(x["control_ok"], bool)
            f4[s].update(ge=_gap(x, "success_rl", "success_base", ctl),
                         gc=_gap(x, "success_control_rl", "success_control_base", ctl))
    key = "f4_error_frozenlake"
    est.put(f"{key}.diff", {s: v["cr"] - v["cb"] for s, v in f4.items()}, [MAIN_ARM])
    for name, fn in (("share_rl_better", lambda v: mean(v["mr"] > v["mb"])),
                     ("share_equal", lambda v: mean(v["mr"] == v["mb"])),
                     ("share_rl_worse", lambda v: mean(v["mr"] < v["mb"])),
                     ("exact_share_rl_better", lambda v: mean(v["er"] > v["eb"])),
                     ("success_rl", lambda v: mean(v["cr"])), ("success_base", lambda v: mean(v["cb"]))):
        est.mean(f"{key}.{name}", {s: fn(v) for s, v in f4.items()}, [MAIN_ARM])
    # room: continuation success lies in [0, 1], so RL - base lies in [-base, 1 - base]
    est.room(key, {s: -mean(v["cb"]) for s, v in f4.items()}, {s: 1 - mean(v["cb"]) for s, v in f4.items()},
             [MAIN_ARM])
    m[f"{key}.n_states"] = float(sum(v["cb"].size for s, v in f4.items() if included(ctx, s)))
    m[f"{key}.n_unreachable"] = float(unreachable)
    control_row(ctx, {s: v for s, v in f4.items() if "ge" in v})
    use = [v for s, v in f4.items() if included(ctx, s)] or list(f4.values())
    depths = np.concatenate([v["depth"] for v in use])
    if not depths.size:
        return None
    split = float(np.median(depths))
    m["f4_depth.split"] = split
    halves = {s: ((v["mr"] > v["mb"])[v["depth"] > split].astype(np.float64),
                  (v["mr"] > v["mb"])[v["depth"] <= split].astype(np.float64)) for s, v in f4.items()}
    est.put("f4_depth.diff", halves, [MAIN_ARM], stat=stats.mean_difference)
    est.mean("f4_depth.first_bin", {s: mean(h[1]) for s, h in halves.items()}, [MAIN_ARM])
    est.mean("f4_depth.last_bin", {s: mean(h[0]) for s, h in halves.items()}, [MAIN_ARM])
    # room: the deep half's share lies in [0, 1], so deep - shallow lies in [-shallow, 1 - shallow]
    est.room("f4_depth", {s: -mean(h[1]) for s, h in halves.items()},
             {s: 1 - mean(h[1]) for s, h in halves.items()}, [MAIN_ARM])
    ones = np.ones((depths.size, 1), bool)
    return to_np(step_quality.step_quality_by_depth(
        np.concatenate([v["mb"] for v in use])[:, None], ones,
        np.concatenate([v["mr"] for v in use])[:, None], ones, depths))
