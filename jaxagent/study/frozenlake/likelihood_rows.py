"""Finding 5 of the FrozenLake study's eval stage (`findings` module doc): likelihood under the base, base vs
each MAIN_ARM seed on that seed's held-out maps at the full budget: the per-action NLL of RL's and the base's
actions, the LLR of RL's successes above `findings.LLR_THRESHOLD` (judged; the Jeffreys contrast printed beside
it) and the length-matched LLR control (`scoring.likelihood`).
"""
from __future__ import annotations

import jax
import numpy as np

from jaxagent.eval import driver_common, scoring, stats
from jaxagent.eval.findings import LLR_THRESHOLD
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import mean
from jaxagent.study.frozenlake.measure import MAIN_ARM, placement, pooled
from jaxagent.study.frozenlake.state_rows import included


def likelihood_rows(ctx: EvalContext, grpo_seeds, nll_pool: dict, llr_pool: dict) -> None:
    """Writes finding 5's rows; appends the included seeds' NLLs and successes' LLRs to `nll_pool` / `llr_pool`
    (the histograms)."""
    run, p, est, m, tasks = ctx.run, ctx.preset, ctx.est, ctx.m, ctx.tasks
    env_params, rcfg = p.task.env_params(), ctx.rcfg

    def lik(b, r, s):
        n = p.eval.n_tasks * p.eval.n_samples
        t_rep = jax.tree.map(lambda x: np.repeat(np.asarray(x), p.eval.n_samples, axis=0), tasks[s])
        bud = np.full(n, p.task.t_max)
        rb = driver_common.run_rollouts(run.world, run.cfg, b, t_rep, bud, jax.random.key(300 + s), env_params,
                                        rcfg, batch_size=p.rollout_batch, **placement(run))
        rr = driver_common.run_rollouts(run.world, run.cfg, r, t_rep, bud, jax.random.key(400 + s), env_params,
                                        rcfg, batch_size=p.rollout_batch, **placement(run))
        ids = np.repeat(np.arange(p.eval.n_tasks), p.eval.n_samples)
        return scoring.likelihood(run.world, run.cfg, b, r, rb, rr, jax.random.key(500 + s), task_ids_base=ids,
                                  task_ids_rl=ids, n_boot=p.eval.n_boot, batch_size=p.scoring_batch,
                                  mesh=run.mesh)

    li = pooled(run, lik, "likelihood", ctx.base, ctx.policies, grpo_seeds)
    nll, llr, pairs, pair_tasks = {}, {}, {}, set()
    for s, x in li:
        nll[s] = (np.asarray(x["nll_rl_actions"], np.float64), np.asarray(x["nll_base_actions"], np.float64))
        lr, lb = np.asarray(x["llr_rl"], np.float64), np.asarray(x["llr_base"], np.float64)
        sr, sb = np.asarray(x["success_rl"], bool), np.asarray(x["success_base"], bool)
        llr[s] = (lr[sr], lb[sb])
        match = np.asarray(x["match"], np.int64)
        hit = np.nonzero(match >= 0)[0]
        pairs[s] = lr[hit] - lb[match[hit]]
        if included(ctx, s):
            pair_tasks |= set((hit // p.eval.n_samples).tolist())
            nll_pool.setdefault("RL actions", []).append(nll[s][0])
            nll_pool.setdefault("base actions", []).append(nll[s][1])
            llr_pool.setdefault("RL, successful", []).append(llr[s][0])
            llr_pool.setdefault("base, successful", []).append(llr[s][1])
    est.put("f5_nll.diff", nll, [MAIN_ARM], stat=stats.mean_difference)
    est.mean("f5_nll.rl", {s: mean(v[0]) for s, v in nll.items()}, [MAIN_ARM])
    est.mean("f5_nll.base", {s: mean(v[1]) for s, v in nll.items()}, [MAIN_ARM])
    # the judged LLR row: RL's own successes above LLR_THRESHOLD; the Jeffreys contrast (RL's successes minus
    # base's, >= 0 by definition, findings module doc) is printed, not judged
    est.put("f5_llr_rl.diff", {s: v[0] - LLR_THRESHOLD for s, v in llr.items()}, [MAIN_ARM])
    est.mean("f5_llr_rl.rl", {s: mean(v[0]) for s, v in llr.items()}, [MAIN_ARM])
    est.mean("f5_llr_rl.base", {s: mean(v[1]) for s, v in llr.items()}, [MAIN_ARM])
    est.mean("f5_llr_rl.jeffreys", {s: mean(v[0]) - mean(v[1]) for s, v in llr.items()}, [MAIN_ARM])
    m["f5_llr_rl.n_rl"] = float(sum(v[0].size for s, v in llr.items() if included(ctx, s)))
    est.put("f5_matched_frozenlake.raw", pairs, [MAIN_ARM])
    est.put("f5_matched_frozenlake.diff", {s: v - LLR_THRESHOLD for s, v in pairs.items()}, [MAIN_ARM])
    m["f5_matched_frozenlake.n_pairs"] = float(sum(v.size for s, v in pairs.items() if included(ctx, s)))
    m["f5_matched_frozenlake.n_tasks"] = float(len(pair_tasks))
