"""The FrozenLake study's figures (figures/*.png of a run): Pass@(K,T) of the base, Pass@T and Pass@K curves per
arm with the structural bound, step quality by depth (matched and error states), likelihood histograms, the
training dynamics (R_multi / R_single per seed) and each arm's learning curves (one line per seed, excluded seeds
dotted).
"""
from __future__ import annotations

import os

import numpy as np

from jaxagent.eval import health, plots
from jaxagent.study.frozenlake.estimates import number


def draw_figures(run, evals, bounds, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn, arms, hl):
    """The study's figures; Pass@ curves average the seeds (each on its own maps; the base over every seed's maps,
    the arms over their included seeds), the bound likewise over every seed's maps."""
    p = run.preset
    fig = run.path("figures")
    out = {}
    kmax_i = int(np.argmax(p.eval.ks))
    base_labels = [lb for lb in evals if lb.startswith("base/")]
    grid = np.mean([np.asarray(evals[lb]["announced"]["grid"]) for lb in base_labels], axis=0)
    out["pass_kt_heatmap"] = plots.pass_kt_heatmap(grid, tiers, p.eval.ks, os.path.join(fig, "pass_kt_base.png"),
                                                   title="Pass@(K,T), base (announced, mean over seeds' maps)")
    bound_grid = np.mean([np.asarray(b["grid"]) for b in bounds.values()], axis=0)
    curves, kcurves = {}, {}
    for name in ["base"] + arms:
        labels = [lb for lb in evals if lb.startswith(name + "/")]
        if name != "base":  # included seeds only (every seed when none is included)
            labels = [lb for lb in labels if hl[(name, int(lb.rsplit("seed", 1)[1]))].included] or labels
        g = np.mean([np.asarray(evals[lb]["announced"]["grid"]) for lb in labels], axis=0)
        curves[name], kcurves[name] = g[:, kmax_i], g[-1, :]
    out["pass_at_t"] = plots.pass_at_t_curves(tiers, curves, os.path.join(fig, "pass_at_t.png"),
                                              bound_U=bound_grid[:, kmax_i], k=p.eval.ks[kmax_i])
    out["pass_at_k"] = plots.pass_at_k_curves(p.eval.ks, kcurves, os.path.join(fig, "pass_at_k.png"),
                                              budget=tiers[-1])
    for name, rows, fname in (("step_quality_depth", depth_rows, "step_quality_depth.png"),
                              ("error_depth", error_depth_rows, "error_depth.png")):
        if rows is not None:
            out[name] = plots.step_quality_by_depth(rows["bin_edges"], rows["share_rl_better"], rows["share_equal"],
                                                    rows["share_rl_worse"], rows["mean_q_base"], rows["mean_q_rl"],
                                                    os.path.join(fig, fname))
    pooled = lambda d: {k: np.concatenate(v) for k, v in d.items()}  # noqa: E731  histograms only
    if nll_pool and all(v.size for v in pooled(nll_pool).values()):
        out["nll_hist"] = plots.likelihood_histograms(pooled(nll_pool), os.path.join(fig, "nll_hist.png"))
    if llr_pool and any(v.size for v in pooled(llr_pool).values()):
        out["llr_hist"] = plots.likelihood_histograms({k: v for k, v in pooled(llr_pool).items() if v.size},
                                                      os.path.join(fig, "llr_hist.png"),
                                                      xlabel="log pi_RL(tau) - log pi_base(tau) (nats)")
    if dyn:
        out["dynamics"] = plots.training_dynamics_seeds(
            {f"seed {s}": ([r["step"] for r in rows], [number(r.get("r_multi")) for r in rows],
                          [number(r.get("r_single")) for r in rows])
             for s, rows in sorted(dyn.items())}, os.path.join(fig, "dynamics.png"))
    for arm in arms:  # learning curves: one line per seed, excluded seeds dotted
        per_seed, styles = {}, {}
        for (a, s), h in sorted(hl.items()):
            if a != arm:
                continue
            recs = health.read_log(os.path.join(run.dir, "arms", a, f"seed{s}", "metrics.jsonl"))
            if not recs:
                continue
            label = f"seed {s} ({h.status})"
            per_seed[label] = {k: np.asarray([r.get(k, np.nan) for r in recs], np.float64)
                               for k in set().union(*recs) if all(isinstance(r.get(k), (int, float)) for r in recs)}
            styles[label] = "-" if h.included else ":"
        if per_seed:
            try:
                out[f"learning_{arm}"] = plots.learning_curves(per_seed, os.path.join(fig, f"learning_{arm}.png"),
                                                               title=f"{arm}: training log per seed", styles=styles)
            except ValueError:
                pass  # no learning-curve key logged
    return out
