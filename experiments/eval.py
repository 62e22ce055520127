"""Stage 'eval': every diagnostic of the study on the base and each trained policy, then the report.

Per policy: Pass@(K,T) in the announced, hidden-budget and truncated modes, with costs. Base vs each RL
seed of the GRPO arm: step quality on matched states, error states, likelihood; all arms: Pass@T and
training dynamics. Everything lands in runs/<name>/eval/*.json; figures and report.md follow.
"""
from __future__ import annotations

import glob
import json
import os

import jax
import numpy as np
from tqdm import tqdm

from experiments import cli, study
from jaxagent.envs import budgets as budgets_lib
from jaxagent.eval import drivers, passk, plots, report
from jaxagent.sampling import Sampler

MAIN_ARM = "grpo"


def _ci(values, key, n_boot):
    ci = passk.bootstrap_ci(np.asarray(values, np.float64), key, n_boot=n_boot)
    return {"mean": float(ci.mean), "lo": float(ci.lo), "hi": float(ci.hi)}


def _eval_setup(run):
    p = run.preset
    tasks = p.task.sample(jax.random.key(4242), p.eval.n_tasks)
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    rcfg = p.task.rollout_config(sampler=Sampler(temperature=1.0), allow_forced=True)
    return tasks, tiers, rcfg


def eval_policy(run, params, label, log=print) -> dict:
    """Pass@(K,T) of one policy in every mode (cached in eval/<label>.json)."""
    out_path = os.path.join(run.path("eval"), f"{label.replace('/', '_')}.json")
    if os.path.isfile(out_path):
        with open(out_path) as f:
            return json.load(f)
    p = run.preset
    tasks, tiers, rcfg = _eval_setup(run)
    res = {}
    modes = ["announced", "truncated"] + (["hidden"] if p.eval.hidden_budget else [])
    for mode in modes:
        r = drivers.pass_kt(run.world, run.cfg, params, tasks, jax.random.key(99), t_max=p.task.t_max, tiers=tiers,
                            n_samples=p.eval.n_samples, ks=p.eval.ks, env_params=p.task.env_params(), rcfg=rcfg,
                            mode=mode, batch_size=p.n_tasks * p.group_size, n_boot=p.eval.n_boot)
        r.pop("success", None)
        res[mode] = r
    study.write_json(out_path, res)
    return json.loads(json.dumps(study._jsonable(res)))


def _pooled(run, pairs_fn, name, base, policies, log=print):
    """Runs a paired diagnostic (base vs each MAIN_ARM seed), cached per seed."""
    out = []
    for seed, params in policies:
        path = os.path.join(run.path("eval"), f"{name}_{MAIN_ARM}_seed{seed}.json")
        if not os.path.isfile(path):
            study.write_json(path, pairs_fn(base, params, seed))
        with open(path) as f:
            out.append(json.load(f))
    return out


def evaluate(run, base, policies: dict, log=print) -> dict:
    """Runs every diagnostic; returns the flat metrics dict the report reads (keys per report.py)."""
    p = run.preset
    tasks, tiers, rcfg = _eval_setup(run)
    env_params = p.task.env_params()
    kb = p.eval.n_boot
    key = jax.random.key(7)
    labels = [("base", base)] + [(f"{a}/seed{s}", prm) for (a, s), prm in sorted(policies.items())]
    evals = {}
    for label, params in tqdm(labels, desc="eval Pass@(K,T)", unit="policy"):
        evals[label] = eval_policy(run, params, label, log)
    bound = drivers.upper_bound(run.world, np.asarray(tasks), tiers=tiers, ks=p.eval.ks, env_params=env_params)
    m: dict = {"meta.tiers": list(tiers), "meta.ks": list(p.eval.ks)}
    kmax_i = len(p.eval.ks) - 1
    arms = sorted({a for a, _ in policies})

    def per_task(label, mode="announced"):
        return np.asarray(evals[label][mode]["per_task"])  # [T, K, N]

    def arm_per_task(arm, mode="announced"):
        return np.mean([per_task(f"{arm}/seed{s}", mode) for a, s in policies if a == arm], axis=0)

    def pair(key_name, a_TxKxN, b_TxKxN, t_i, k_i):
        """Paired (b - a) per task at tier t_i, k k_i: mean, CI over tasks."""
        a, b = a_TxKxN[t_i, k_i], b_TxKxN[t_i, k_i]
        m[f"{key_name}.base"], m[f"{key_name}.rl"] = float(a.mean()), float(b.mean())
        for s, v in _ci(b - a, key, kb).items():
            m[f"{key_name}.diff.{s}"] = v

    full, tight = len(tiers) - 1, 0
    base_pt = per_task("base")
    if MAIN_ARM in arms:
        grpo_pt = arm_per_task(MAIN_ARM)
        pair("f1_breadth", base_pt, grpo_pt, full, kmax_i)
        pair("f2_full_frozenlake", base_pt, grpo_pt, full, kmax_i)
        pair("f2_tight_frozenlake", base_pt, grpo_pt, tight, kmax_i)
        if "grpo_oracle" in arms:
            pair("f7_process_frozenlake", grpo_pt, arm_per_task("grpo_oracle"), tight, kmax_i)
        if "budgetmix" in arms:
            mix = arm_per_task("budgetmix")
            for t_i, f in enumerate(p.eval.fractions):
                pct = int(round(100 * f))
                if pct in (25, 50, 75, 100):
                    pair(f"f8_budgetmix_t{pct}", grpo_pt, mix, t_i, kmax_i)
    # Beyond the paper: announced vs hidden budget per arm at the tightest tier.
    if p.eval.hidden_budget:
        for arm in ["base"] + arms:
            a = base_pt if arm == "base" else arm_per_task(arm)
            h = per_task("base", "hidden") if arm == "base" else arm_per_task(arm, "hidden")
            m[f"x_hidden.{arm}.announced_tight"] = float(a[tight, kmax_i].mean())
            m[f"x_hidden.{arm}.hidden_tight"] = float(h[tight, kmax_i].mean())

    grpo_seeds = [(s, prm) for (a, s), prm in sorted(policies.items()) if a == MAIN_ARM]
    if grpo_seeds:
        sq = _pooled(run, lambda b, r, s: drivers.step_quality_matched(
            run.world, run.cfg, b, r, tasks, jax.random.key(100 + s), t_max=p.task.t_max, n_states=p.eval.n_states,
            env_params=env_params, rcfg=rcfg, batch_size=p.n_tasks * p.group_size), "step_quality", base, grpo_seeds)
        qb = np.concatenate([np.asarray(x["q_exact_base"])[np.asarray(x["mask"])] for x in sq])
        qr = np.concatenate([np.asarray(x["q_exact_rl"])[np.asarray(x["mask"])] for x in sq])
        m["f3_step_frozenlake.share_rl_better"] = float(np.mean(qr > qb))
        m["f3_step_frozenlake.share_equal"] = float(np.mean(qr == qb))
        m["f3_step_frozenlake.share_rl_worse"] = float(np.mean(qr < qb))
        m["f3_step_frozenlake.mean_q_base"], m["f3_step_frozenlake.mean_q_rl"] = float(qb.mean()), float(qr.mean())
        for s, v in _ci(qr - qb, key, kb).items():
            m[f"f3_step_frozenlake.diff.{s}"] = v
        depth_rows = sq[0]["exact_by_depth"]

        er = _pooled(run, lambda b, r, s: drivers.error_states(
            run.world, run.cfg, b, r, tasks, jax.random.key(200 + s), t_max=p.task.t_max,
            n_states=p.eval.n_error_states, env_params=env_params, rcfg=rcfg,
            batch_size=p.n_tasks * p.group_size, n_boot=kb), "error_states", base, grpo_seeds)
        ok = [np.asarray(x["mask"]) for x in er]
        eqb = np.concatenate([np.asarray(x["q_exact_base"])[k] for x, k in zip(er, ok)])
        eqr = np.concatenate([np.asarray(x["q_exact_rl"])[k] for x, k in zip(er, ok)])
        sb = np.concatenate([np.asarray(x["success_base"], np.float64)[k].mean(-1) for x, k in zip(er, ok)])
        sr = np.concatenate([np.asarray(x["success_rl"], np.float64)[k].mean(-1) for x, k in zip(er, ok)])
        if eqb.size:
            m["f4_error_frozenlake.share_rl_better"] = float(np.mean(eqr > eqb))
            m["f4_error_frozenlake.success_rl"], m["f4_error_frozenlake.success_base"] = float(sr.mean()), float(sb.mean())
            for s, v in _ci(sr - sb, key, kb).items():
                m[f"f4_error_frozenlake.diff.{s}"] = v
            depth = np.concatenate([np.asarray(x["depth"])[k] for x, k in zip(er, ok)])
            lo, hi = depth <= np.median(depth), depth > np.median(depth)
            if lo.any() and hi.any():
                better = (eqr > eqb).astype(np.float64)
                m["f4_depth.first_bin"], m["f4_depth.last_bin"] = float(better[lo].mean()), float(better[hi].mean())
                boot = []
                rng = np.random.default_rng(0)
                for _ in range(kb):
                    i = rng.integers(0, better.size, better.size)
                    bl, bh = better[i][lo[i]], better[i][hi[i]]
                    if bl.size and bh.size:
                        boot.append(bh.mean() - bl.mean())
                m["f4_depth.diff.mean"] = m["f4_depth.last_bin"] - m["f4_depth.first_bin"]
                m["f4_depth.diff.lo"], m["f4_depth.diff.hi"] = (float(np.percentile(boot, 2.5)),
                                                                float(np.percentile(boot, 97.5)))

        def lik(b, r, s):
            n = p.eval.n_tasks * p.eval.n_samples
            t_rep = jax.tree.map(lambda x: np.repeat(np.asarray(x), p.eval.n_samples, axis=0), tasks)
            bud = np.full(n, p.task.t_max)
            rb = drivers.run_rollouts(run.world, run.cfg, b, t_rep, bud, jax.random.key(300 + s), env_params, rcfg,
                                      batch_size=p.n_tasks * p.group_size)
            rr = drivers.run_rollouts(run.world, run.cfg, r, t_rep, bud, jax.random.key(400 + s), env_params, rcfg,
                                      batch_size=p.n_tasks * p.group_size)
            ids = np.repeat(np.arange(p.eval.n_tasks), p.eval.n_samples)
            return drivers.likelihood(run.world, run.cfg, b, r, rb, rr, jax.random.key(500 + s), task_ids_base=ids,
                                      task_ids_rl=ids, n_boot=kb, batch_size=p.n_tasks * p.group_size)

        li = _pooled(run, lik, "likelihood", base, grpo_seeds)
        nb = np.concatenate([np.asarray(x["nll_base_actions"], np.float64) for x in li])
        nr = np.concatenate([np.asarray(x["nll_rl_actions"], np.float64) for x in li])
        m["f5_nll.base"], m["f5_nll.rl"] = float(nb.mean()), float(nr.mean())
        if nb.size and nr.size:  # unpaired samples: the CI combines each mean's bootstrap interval
            bn = passk.bootstrap_ci(nb, key, n_boot=kb)
            rn = passk.bootstrap_ci(nr, jax.random.fold_in(key, 1), n_boot=kb)
            m["f5_nll.diff.mean"] = float(rn.mean - bn.mean)
            m["f5_nll.diff.lo"], m["f5_nll.diff.hi"] = float(rn.lo - bn.hi), float(rn.hi - bn.lo)
        lb = np.concatenate([np.asarray(x["llr_base"])[np.asarray(x["success_base"], bool)] for x in li])
        lr = np.concatenate([np.asarray(x["llr_rl"])[np.asarray(x["success_rl"], bool)] for x in li])
        if lb.size and lr.size:
            m["f5_llr_success.base"], m["f5_llr_success.rl"] = float(lb.mean()), float(lr.mean())
            bl_ = passk.bootstrap_ci(lb, key, n_boot=kb)
            rl_ = passk.bootstrap_ci(lr, jax.random.fold_in(key, 2), n_boot=kb)
            m["f5_llr_success.diff.mean"] = float(rl_.mean - bl_.mean)
            m["f5_llr_success.diff.lo"], m["f5_llr_success.diff.hi"] = float(rl_.lo - bl_.hi), float(rl_.hi - bl_.lo)
    else:
        depth_rows, nb, nr = None, np.zeros(0), np.zeros(0)

    # Training dynamics of the main arm: per seed last - first, CI over seeds.
    dyn = {}
    for (a, s) in sorted(policies):
        if a != MAIN_ARM:
            continue
        path = os.path.join(run.dir, "arms", a, f"seed{s}", "dynamics.jsonl")
        if os.path.isfile(path):
            rows = [json.loads(line) for line in open(path)]
            dyn[s] = rows
    if dyn:
        for name in ("r_multi", "r_single"):
            firsts, lasts = [], []
            for rows in dyn.values():
                vals = [r[name] for r in rows if np.isfinite(r[name])]
                if len(vals) >= 2:
                    firsts.append(vals[0])
                    lasts.append(vals[-1])
            if firsts:
                key_name = f"f6_{name}"
                m[f"{key_name}.first"], m[f"{key_name}.last"] = float(np.mean(firsts)), float(np.mean(lasts))
                for s_, v in _ci(np.asarray(lasts) - np.asarray(firsts), key, kb).items():
                    m[f"{key_name}.diff.{s_}"] = v

    figures = _figures(run, evals, bound, tiers, depth_rows, nb, nr, dyn, arms)
    return m, figures, evals, bound


def _figures(run, evals, bound, tiers, depth_rows, nb, nr, dyn, arms):
    p = run.preset
    fig = run.path("figures")
    out = {}
    kmax_i = len(p.eval.ks) - 1
    grid = np.asarray(evals["base"]["announced"]["grid"])
    out["pass_kt_heatmap"] = plots.pass_kt_heatmap(grid, tiers, p.eval.ks, os.path.join(fig, "pass_kt_base.png"),
                                                   title="Pass@(K,T), base (announced)")
    curves, kcurves = {}, {}
    for name in ["base"] + arms:
        labels = ["base"] if name == "base" else [lb for lb in evals if lb.startswith(name + "/")]
        g = np.mean([np.asarray(evals[lb]["announced"]["grid"]) for lb in labels], axis=0)
        curves[name], kcurves[name] = g[:, kmax_i], g[-1, :]
    out["pass_at_t"] = plots.pass_at_t_curves(tiers, curves, os.path.join(fig, "pass_at_t.png"),
                                              bound_T=np.asarray(bound["grid"])[:, kmax_i], k=p.eval.ks[-1])
    out["pass_at_k"] = plots.pass_at_k_curves(p.eval.ks, kcurves, os.path.join(fig, "pass_at_k.png"),
                                              budget=tiers[-1])
    if depth_rows is not None:
        d = depth_rows
        out["step_quality_depth"] = plots.step_quality_by_depth(
            d["bin_edges"], d["share_rl_better"], d["share_equal"], d["share_rl_worse"], d["mean_q_base"],
            d["mean_q_rl"], os.path.join(fig, "step_quality_depth.png"))
    if nb.size and nr.size:
        out["nll_hist"] = plots.likelihood_histograms({"base actions": nb, "RL actions": nr},
                                                      os.path.join(fig, "nll_hist.png"))
    if dyn:
        rows = next(iter(dyn.values()))
        steps = [r["step"] for r in rows]
        out["dynamics"] = plots.training_dynamics(steps, [r["r_multi"] for r in rows], [r["r_single"] for r in rows],
                                                  os.path.join(fig, "dynamics.png"))
    return out


def write_report(run, metrics, figures, evals, bound):
    p = run.preset
    study.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    meta = {"preset": p.name, "Pass@(K,T) mode": "announced (budget in the prompt, separate rollouts per T)",
            "tasks": f"{p.eval.n_tasks} held-out {p.task.size}x{p.task.size} FrozenLake maps, "
                     f"{p.eval.n_samples} samples per task and budget",
            "RL": f"{len(p.seeds)} seeds x {p.iterations} iterations of {p.n_tasks} tasks x {p.group_size} rollouts",
            "budget tiers": ", ".join(str(t) for t in metrics["meta.tiers"]),
            "K": ", ".join(str(k) for k in metrics["meta.ks"])}
    rep = report.build_report({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, run.dir,
                              figures=figures, meta=meta, title=f"jaxagent toy study: {p.name}")
    extra = ["", "## Beyond the paper: announced vs hidden budget (tightest tier, largest K)", "",
             "| policy | announced | hidden |", "|---|---|---|"]
    for k in sorted(metrics):
        if k.startswith("x_hidden.") and k.endswith(".announced_tight"):
            arm = k.split(".")[1]
            extra.append(f"| {arm} | {metrics[k]:.3f} | {metrics[f'x_hidden.{arm}.hidden_tight']:.3f} |")
    text = rep.markdown + "\n".join(extra) + "\n"
    with open(os.path.join(run.dir, "report.md"), "w") as f:
        f.write(text)
    return os.path.join(run.dir, "report.md"), rep


def collect_policies(run):
    pols = {}
    for arm in run.preset.arms:
        for seed in run.preset.seeds:
            d = os.path.join(run.dir, "arms", arm, f"seed{seed}")
            if study.done(d):
                pols[(arm, seed)] = run.load_policy(d)
    return pols


def main(argv=None):
    args = cli.parser(__doc__.splitlines()[0]).parse_args(argv)
    run = study.Run(cli.preset_from(args), args.root, args.name)
    base = run.load_policy(os.path.join(run.dir, "base"))
    metrics, figures, evals, bound = evaluate(run, base, collect_policies(run))
    path, _ = write_report(run, metrics, figures, evals, bound)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
