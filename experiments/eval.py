"""Stage 'eval': every diagnostic of the study on the base and each trained policy, then the report.

Per policy: Pass@(K,T) in the announced, hidden-budget and truncated modes, with costs. Base vs each RL
seed of the GRPO arm: step quality on matched states (G = preset.eval.n_sampled sampled actions per policy and
state, default 16; the exact expectation as a secondary line), error states (only those with the goal still
reachable, V* > 0), likelihood (per seed; the length-matched LLR control); all arms: Pass@T and training
dynamics. Every arm seed's training log is classified (`health.classify_seed`): collapsed and diverged seeds
are left out of the primary estimates and kept in an all-seeds sensitivity estimate. Estimates are seed-aware
(`stats.seed_estimate`: units nested in seeds; arms compared with GRPO are paired by seed index). An invalid
reply is scored as invalid (`step_quality.score_outcomes`). Everything lands in runs/<name>/eval/*.json;
figures (learning curves per arm, one line per seed), metrics.json and report.md follow.

Placement: every evaluation rollout runs as the training rollout does (`stages.make_arm_runtime`): the
policy's weights cast to the preset's compute dtype, on the run's mesh laid out per
`sharding.ROLLOUT_RULES`, the episodes split over the mesh's batch axes under `jax.set_mesh`
(`driver_common.run_rollouts`); the exact scoring and the likelihoods run on the f32 params, rows split
over the batch axes too. A toy preset (float32, mesh 1x1x1) runs exactly as without these options.
`experiments/aot_check.py` compiles these programs for the accelerator presets (docs/aot.md).
"""
from __future__ import annotations

import json
import os
import zlib

import jax
import numpy as np
from tqdm import tqdm

from experiments import cli, study
from jaxagent import sharding
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.eval import drivers, health, plots, report, stats, step_quality
from jaxagent.sampling import Sampler

MAIN_ARM = "grpo"


def _eval_setup(run):
    p = run.preset
    tasks = p.task.sample(jax.random.key(4242), p.eval.n_tasks)
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    rcfg = p.task.rollout_config(sampler=Sampler(temperature=1.0), allow_forced=True)
    return tasks, tiers, rcfg


def placement(run) -> dict:
    """The rollout drivers' `mesh` and `compute_dtype`: the training rollout's (module doc)."""
    return {"mesh": run.mesh, "compute_dtype": run.compute_dtype}


def score_batch(run, base: int = 16) -> int:
    """States per exact-scoring call: the smallest multiple of the mesh's batch split >= base (16 without a
    mesh), so every chip scores its own states."""
    split = sharding.batch_divisor(run.mesh)
    return -(-base // split) * split


def eval_policy(run, load_params, label, log=print) -> dict:
    """Pass@(K,T) in every mode of the policy `load_params()` returns (called only when eval/<label>.json, the
    cache, does not exist)."""
    out_path = os.path.join(run.path("eval"), f"{label.replace('/', '_')}.json")
    if os.path.isfile(out_path):
        with open(out_path) as f:
            return json.load(f)
    p, params = run.preset, load_params()
    tasks, tiers, rcfg = _eval_setup(run)
    res = {}
    modes = ["announced", "truncated"] + (["hidden"] if p.eval.hidden_budget else [])
    for mode in modes:
        r = drivers.pass_kt(run.world, run.cfg, params, tasks, jax.random.key(99), t_max=p.task.t_max, tiers=tiers,
                            n_samples=p.eval.n_samples, ks=p.eval.ks, env_params=p.task.env_params(), rcfg=rcfg,
                            mode=mode, batch_size=p.n_tasks * p.group_size, n_boot=p.eval.n_boot, **placement(run))
        r.pop("success", None)
        res[mode] = r
    study.write_json(out_path, res)
    return json.loads(json.dumps(study._jsonable(res)))


def _pooled(run, pairs_fn, name, base, policies, seeds):
    """Runs a paired diagnostic (base vs each MAIN_ARM seed in `seeds`), cached per seed (a seed's policy is loaded
    only when its cache is missing); returns [(seed, result)]."""
    out = []
    for seed in seeds:
        path = os.path.join(run.path("eval"), f"{name}_{MAIN_ARM}_seed{seed}.json")
        if not os.path.isfile(path):
            study.write_json(path, pairs_fn(base, policies[(MAIN_ARM, seed)], seed))
        with open(path) as f:
            out.append((seed, json.load(f)))
    return out


# ----------------------------------------------------------------------------- seed health and estimates
def seed_health(run, policies) -> dict:
    """{(arm, seed): health.SeedHealth} from each arm seed's metrics.jsonl."""
    return {(a, s): health.classify_seed(health.read_log(os.path.join(run.dir, "arms", a, f"seed{s}",
                                                                        "metrics.jsonl")))
            for a, s in policies}


def _health_metrics(m, hl):
    for (a, s), h in sorted(hl.items()):
        prefix = f"health.{a}.seed{s}"
        m[f"{prefix}.status"], m[f"{prefix}.reason"] = h.status, h.reason
        m[f"{prefix}.min_valid"], m[f"{prefix}.last_valid"] = h.min_valid, h.last_valid
        m[f"{prefix}.last_success"], m[f"{prefix}.iterations"] = h.last_success, h.iterations


class _Estimator:
    """Writes seed-aware estimates into the metrics dict: `<key>.*` on the included seeds (healthy, degraded,
    unknown) and, when some seed is excluded, `<key>.all.*` on every seed (the sensitivity line)."""

    def __init__(self, m, hl, n_boot):
        self.m, self.hl, self.n_boot = m, hl, int(n_boot)

    def _ok(self, arms, s):
        return all(self.hl.get((a, s)) is None or self.hl[(a, s)].included for a in arms)

    def _describe(self, arms, seeds):
        used = [s for s in seeds if self._ok(arms, s)]
        dropped = [f"{s} ({', '.join(f'{a} {self.hl[(a, s)].status}' for a in arms if not self.hl[(a, s)].included)})"
                   for s in seeds if not self._ok(arms, s)]
        text = f"{' & '.join(arms)} seeds {', '.join(map(str, used)) if used else 'none'}"
        return text + (f"; excluded: {', '.join(dropped)}" if dropped else "; none excluded")

    def put(self, key, units_by_seed: dict, arms, stat=stats.mean_of_seed_means) -> stats.Estimate:
        seeds = sorted(units_by_seed)
        rng = zlib.crc32(key.encode())
        kept = [units_by_seed[s] for s in seeds if self._ok(arms, s)]
        est = stats.seed_estimate(kept, stat, n_boot=self.n_boot, rng_seed=rng)
        self._write(key, est, self._describe(arms, seeds))
        if len(kept) < len(seeds):
            est_all = stats.seed_estimate([units_by_seed[s] for s in seeds], stat, n_boot=self.n_boot, rng_seed=rng)
            self._write(f"{key}.all", est_all, f"{' & '.join(arms)} seeds {', '.join(map(str, seeds))}")
        return est

    def _write(self, key, est, seeds_text):
        for name, v in est.as_dict().items():
            self.m[f"{key}.{name}"] = v
        self.m[f"{key}.seeds"] = seeds_text

    def mean(self, key, values_by_seed: dict, arms):
        """Mean over the included seeds of per-seed values (the point value printed beside an estimate)."""
        vals = [float(v) for s, v in sorted(values_by_seed.items()) if self._ok(arms, s) and np.isfinite(v)]
        self.m[key] = float(np.mean(vals)) if vals else float("nan")


def _mean(x):
    x = np.asarray(x, np.float64)
    return float(x.mean()) if x.size else float("nan")


def _scored(x, name, n_actions):
    """A step-quality / error-state result's per-state sampled and exact quality of one policy, an invalid
    reply scored as invalid (`step_quality.score_outcomes`)."""
    q = np.asarray(x["q"], np.float32)[:, :n_actions]
    out = step_quality.score_outcomes(np.asarray(x[f"probs_{name}"]), q, np.asarray(x[f"draws_{name}"]))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


# ----------------------------------------------------------------------------- the stage
def evaluate(run, base, policies: dict, log=print) -> dict:
    """Runs every diagnostic; returns (metrics, figures, evals, bound): the flat metrics dict the report reads
    (keys per report.py, seed-aware estimates per stats.Estimate), figure paths, the Pass@ results, the bound."""
    p = run.preset
    tasks, tiers, rcfg = _eval_setup(run)
    env_params = p.task.env_params()
    n_sampled = int(p.eval.n_sampled)
    evals = {}
    for key in tqdm([None] + sorted(policies), desc="eval Pass@(K,T)", unit="policy"):  # one policy loaded at a time
        label = "base" if key is None else f"{key[0]}/seed{key[1]}"
        evals[label] = eval_policy(run, (lambda: base) if key is None else (lambda key=key: policies[key]), label, log)
    bound = drivers.upper_bound(run.world, np.asarray(tasks), tiers=tiers, ks=p.eval.ks, env_params=env_params)
    m: dict = {"meta.tiers": list(tiers), "meta.ks": list(p.eval.ks)}
    ks = list(p.eval.ks)
    kmax_i = int(np.argmax(ks))
    arms = sorted({a for a, _ in policies})
    hl = seed_health(run, policies)
    _health_metrics(m, hl)
    est = _Estimator(m, hl, p.eval.n_boot)

    def per_task(label, mode="announced"):
        return np.asarray(evals[label][mode]["per_task"], np.float64)  # [T, K, N]

    def arm_seeds(arm):
        return sorted(s for a, s in policies if a == arm)

    def arm_per_task(arm, mode="announced"):
        """Mean over the arm's included seeds (every seed when none is included)."""
        seeds = [s for s in arm_seeds(arm) if hl[(arm, s)].included] or arm_seeds(arm)
        return np.mean([per_task(f"{arm}/seed{s}", mode) for s in seeds], axis=0)

    full, tight = len(tiers) - 1, 0
    base_pt = per_task("base")
    if MAIN_ARM in arms:
        seeds = arm_seeds(MAIN_ARM)
        rl = {s: per_task(f"{MAIN_ARM}/seed{s}") for s in seeds}
        gap = {s: rl[s] - base_pt for s in seeds}  # [T, K, N] per seed, paired by task
        # 1. the RL-base gap at full budget as K grows; the verdict on the largest K
        for k_i, k in enumerate(ks):
            e = est.put(f"f1_breadth.k{k}", {s: gap[s][full, k_i] for s in seeds}, [MAIN_ARM])
            m[f"f1_breadth.gap_k{k}"] = e.mean
        est.put("f1_breadth.diff", {s: gap[s][full, kmax_i] for s in seeds}, [MAIN_ARM])
        m["f1_breadth.base"] = _mean(base_pt[full, kmax_i])
        est.mean("f1_breadth.rl", {s: rl[s][full, kmax_i].mean() for s in seeds}, [MAIN_ARM])
        # 2. the change of the gap from the full budget to the tightest tier, and the tight tier's solvable share
        key = "f2_shrink_frozenlake"
        est.put(f"{key}.diff", {s: gap[s][tight, kmax_i] - gap[s][full, kmax_i] for s in seeds}, [MAIN_ARM])
        for name, t_i in (("full", full), ("tight", tight)):
            m[f"{key}.base_{name}"] = _mean(base_pt[t_i, kmax_i])
            est.mean(f"{key}.rl_{name}", {s: rl[s][t_i, kmax_i].mean() for s in seeds}, [MAIN_ARM])
            est.mean(f"{key}.gap_{name}", {s: gap[s][t_i, kmax_i].mean() for s in seeds}, [MAIN_ARM])
        m[f"{key}.solvable_tight"] = float(np.mean(np.asarray(bound["p_star"])[tight] > 0))  # p_star [U, P]
        m[f"{key}.tight_turns"] = float(tiers[tight])
        # 7 and 8: arms against GRPO, paired by seed index (every arm starts seed s from the same key)
        for other, key, t_list in (("grpo_oracle", "f7_process_frozenlake", [(tight, None)]),
                                   ("budgetmix", "f8_budgetmix", list(enumerate(p.eval.fractions)))):
            if other not in arms:
                continue
            both = sorted(set(seeds) & set(arm_seeds(other)))
            oth = {s: per_task(f"{other}/seed{s}") for s in both}
            for t_i, frac in t_list:
                if frac is not None:
                    pct = int(round(100 * frac))
                    if pct not in (25, 50, 75, 100):
                        continue
                    name = f"{key}_t{pct}"
                else:
                    name = key
                est.put(f"{name}.diff", {s: oth[s][t_i, kmax_i] - rl[s][t_i, kmax_i] for s in both},
                        [MAIN_ARM, other])
                est.mean(f"{name}.base", {s: rl[s][t_i, kmax_i].mean() for s in both}, [MAIN_ARM, other])
                est.mean(f"{name}.rl", {s: oth[s][t_i, kmax_i].mean() for s in both}, [MAIN_ARM, other])
                m[f"{name}.bound"] = float(np.asarray(bound["grid"])[t_i, kmax_i])  # structural Pass@K bound
    # Beyond the paper: announced vs hidden budget per arm at the tightest tier.
    if p.eval.hidden_budget:
        for arm in ["base"] + arms:
            a = base_pt if arm == "base" else arm_per_task(arm)
            h = per_task("base", "hidden") if arm == "base" else arm_per_task(arm, "hidden")
            m[f"x_hidden.{arm}.announced_tight"] = float(a[tight, kmax_i].mean())
            m[f"x_hidden.{arm}.hidden_tight"] = float(h[tight, kmax_i].mean())

    grpo_seeds = [s for (a, s) in sorted(policies) if a == MAIN_ARM]
    depth_rows = error_depth_rows = None
    nll_pool, llr_pool = {}, {}
    if grpo_seeds:
        ok = lambda s: hl[(MAIN_ARM, s)].included  # noqa: E731
        n_act = drivers.N_ACTIONS
        # 3. step quality on matched states: G sampled actions per policy and state
        sq_runs = _pooled(run, lambda b, r, s: drivers.step_quality_matched(
            run.world, run.cfg, b, r, tasks, jax.random.key(100 + s), t_max=p.task.t_max, n_states=p.eval.n_states,
            env_params=env_params, rcfg=rcfg, n_sampled=n_sampled, batch_size=p.n_tasks * p.group_size,
            score_batch=score_batch(run), **placement(run)), "step_quality", base, policies, grpo_seeds)
        f3 = {}
        for s, x in sq_runs:
            mask = np.asarray(x["mask"], bool)
            sb, sr = _scored(x, "base", n_act), _scored(x, "rl", n_act)
            mb, mr = sb["sampled"].mean(-1)[mask], sr["sampled"].mean(-1)[mask]
            f3[s] = dict(mb=mb, mr=mr, eb=sb["exact"][mask], er=sr["exact"][mask], inv_b=sb["invalid_share"][mask],
                         inv_r=sr["invalid_share"][mask], depth=np.asarray(x["depth"], np.float64)[mask],
                         g=sb["sampled"].shape[-1])
        key = "f3_step_frozenlake"
        est.put(f"{key}.diff", {s: v["mr"] - v["mb"] for s, v in f3.items()}, [MAIN_ARM])
        est.put(f"{key}.exact", {s: v["er"] - v["eb"] for s, v in f3.items()}, [MAIN_ARM])
        m[f"{key}.exact_diff"] = m[f"{key}.exact.mean"]
        for name, fn in (("share_rl_better", lambda v: _mean(v["mr"] > v["mb"])),
                         ("share_equal", lambda v: _mean(v["mr"] == v["mb"])),
                         ("share_rl_worse", lambda v: _mean(v["mr"] < v["mb"])),
                         ("mean_q_base", lambda v: _mean(v["mb"])), ("mean_q_rl", lambda v: _mean(v["mr"])),
                         ("invalid_base", lambda v: _mean(v["inv_b"])), ("invalid_rl", lambda v: _mean(v["inv_r"])),
                         ("exact_share_rl_better", lambda v: _mean(v["er"] > v["eb"])),
                         ("exact_share_equal", lambda v: _mean(v["er"] == v["eb"]))):
            est.mean(f"{key}.{name}", {s: fn(v) for s, v in f3.items()}, [MAIN_ARM])
        m[f"{key}.n_states"] = float(sum(v["mb"].size for s, v in f3.items() if ok(s)))
        m[f"{key}.g"] = float(next(iter(f3.values()))["g"])
        use = [v for s, v in f3.items() if ok(s)] or list(f3.values())
        cat = lambda name: np.concatenate([v[name] for v in use])  # noqa: E731  pooled for the figure only
        if cat("mb").size:
            ones = np.ones((cat("mb").size, 1), bool)
            depth_rows = _to_np(step_quality.step_quality_by_depth(cat("mb")[:, None], ones, cat("mr")[:, None], ones,
                                                                   cat("depth")))

        # 4. error states where the goal is still reachable (V* > 0)
        er_runs = _pooled(run, lambda b, r, s: drivers.error_states(
            run.world, run.cfg, b, r, tasks, jax.random.key(200 + s), t_max=p.task.t_max,
            n_states=p.eval.n_error_states, env_params=env_params, rcfg=rcfg, n_sampled=n_sampled,
            batch_size=p.n_tasks * p.group_size, n_boot=p.eval.n_boot, score_batch=score_batch(run), **placement(run)),
            "error_states", base, policies, grpo_seeds)
        f4, unreachable = {}, 0
        for s, x in er_runs:
            mask = np.asarray(x["mask"], bool) & np.asarray(x.get("replay_ok", x["mask"]), bool)
            v_star = np.asarray(x["q"], np.float64)[:, :n_act].max(-1)
            reach = mask & (v_star > 0)
            if ok(s):
                unreachable += int((mask & ~(v_star > 0)).sum())
            sb, sr = _scored(x, "base", n_act), _scored(x, "rl", n_act)
            f4[s] = dict(mb=sb["sampled"].mean(-1)[reach], mr=sr["sampled"].mean(-1)[reach],
                         eb=sb["exact"][reach], er=sr["exact"][reach],
                         cb=np.asarray(x["success_base"], np.float64).mean(-1)[reach],
                         cr=np.asarray(x["success_rl"], np.float64).mean(-1)[reach],
                         depth=np.asarray(x["depth"], np.float64)[reach])
        key = "f4_error_frozenlake"
        est.put(f"{key}.diff", {s: v["cr"] - v["cb"] for s, v in f4.items()}, [MAIN_ARM])
        for name, fn in (("share_rl_better", lambda v: _mean(v["mr"] > v["mb"])),
                         ("share_equal", lambda v: _mean(v["mr"] == v["mb"])),
                         ("share_rl_worse", lambda v: _mean(v["mr"] < v["mb"])),
                         ("exact_share_rl_better", lambda v: _mean(v["er"] > v["eb"])),
                         ("success_rl", lambda v: _mean(v["cr"])), ("success_base", lambda v: _mean(v["cb"]))):
            est.mean(f"{key}.{name}", {s: fn(v) for s, v in f4.items()}, [MAIN_ARM])
        m[f"{key}.n_states"] = float(sum(v["cb"].size for s, v in f4.items() if ok(s)))
        m[f"{key}.n_unreachable"] = float(unreachable)
        use = [v for s, v in f4.items() if ok(s)] or list(f4.values())
        depths = np.concatenate([v["depth"] for v in use])
        if depths.size:
            split = float(np.median(depths))
            m["f4_depth.split"] = split
            halves = {s: ((v["mr"] > v["mb"])[v["depth"] > split].astype(np.float64),
                          (v["mr"] > v["mb"])[v["depth"] <= split].astype(np.float64)) for s, v in f4.items()}
            est.put("f4_depth.diff", halves, [MAIN_ARM], stat=stats.mean_difference)
            est.mean("f4_depth.first_bin", {s: _mean(h[1]) for s, h in halves.items()}, [MAIN_ARM])
            est.mean("f4_depth.last_bin", {s: _mean(h[0]) for s, h in halves.items()}, [MAIN_ARM])
            ones = np.ones((depths.size, 1), bool)
            error_depth_rows = _to_np(step_quality.step_quality_by_depth(
                np.concatenate([v["mb"] for v in use])[:, None], ones,
                np.concatenate([v["mr"] for v in use])[:, None], ones, depths))

        # 5. likelihood under base, per seed
        def lik(b, r, s):
            n = p.eval.n_tasks * p.eval.n_samples
            t_rep = jax.tree.map(lambda x: np.repeat(np.asarray(x), p.eval.n_samples, axis=0), tasks)
            bud = np.full(n, p.task.t_max)
            rb = drivers.run_rollouts(run.world, run.cfg, b, t_rep, bud, jax.random.key(300 + s), env_params, rcfg,
                                      batch_size=p.n_tasks * p.group_size, **placement(run))
            rr = drivers.run_rollouts(run.world, run.cfg, r, t_rep, bud, jax.random.key(400 + s), env_params, rcfg,
                                      batch_size=p.n_tasks * p.group_size, **placement(run))
            ids = np.repeat(np.arange(p.eval.n_tasks), p.eval.n_samples)
            return drivers.likelihood(run.world, run.cfg, b, r, rb, rr, jax.random.key(500 + s), task_ids_base=ids,
                                      task_ids_rl=ids, n_boot=p.eval.n_boot, batch_size=p.n_tasks * p.group_size,
                                      mesh=run.mesh)

        li = _pooled(run, lik, "likelihood", base, policies, grpo_seeds)
        nll, llr, pairs, pair_tasks = {}, {}, {}, set()
        for s, x in li:
            nll[s] = (np.asarray(x["nll_rl_actions"], np.float64), np.asarray(x["nll_base_actions"], np.float64))
            lr, lb = np.asarray(x["llr_rl"], np.float64), np.asarray(x["llr_base"], np.float64)
            sr, sb = np.asarray(x["success_rl"], bool), np.asarray(x["success_base"], bool)
            llr[s] = (lr[sr], lb[sb])
            match = np.asarray(x["match"], np.int64)
            hit = np.nonzero(match >= 0)[0]
            pairs[s] = lr[hit] - lb[match[hit]]
            if ok(s):
                pair_tasks |= set((hit // p.eval.n_samples).tolist())
                nll_pool.setdefault("RL actions", []).append(nll[s][0])
                nll_pool.setdefault("base actions", []).append(nll[s][1])
                llr_pool.setdefault("RL, successful", []).append(llr[s][0])
                llr_pool.setdefault("base, successful", []).append(llr[s][1])
        est.put("f5_nll.diff", nll, [MAIN_ARM], stat=stats.mean_difference)
        est.mean("f5_nll.rl", {s: _mean(v[0]) for s, v in nll.items()}, [MAIN_ARM])
        est.mean("f5_nll.base", {s: _mean(v[1]) for s, v in nll.items()}, [MAIN_ARM])
        est.put("f5_llr_success.diff", llr, [MAIN_ARM], stat=stats.mean_difference)
        est.mean("f5_llr_success.rl", {s: _mean(v[0]) for s, v in llr.items()}, [MAIN_ARM])
        est.mean("f5_llr_success.base", {s: _mean(v[1]) for s, v in llr.items()}, [MAIN_ARM])
        est.put("f5_matched_frozenlake.diff", pairs, [MAIN_ARM])
        m["f5_matched_frozenlake.n_pairs"] = float(sum(v.size for s, v in pairs.items() if ok(s)))
        m["f5_matched_frozenlake.n_tasks"] = float(len(pair_tasks))

    # 6. training dynamics of the main arm: last - first per seed (a seed-level quantity)
    dyn = {}
    for (a, s) in sorted(policies):
        path = os.path.join(run.dir, "arms", a, f"seed{s}", "dynamics.jsonl")
        if a == MAIN_ARM and os.path.isfile(path):
            dyn[s] = health.read_log(path)
    for name in ("r_multi", "r_single"):
        firsts, deltas = {}, {}
        for s, rows in dyn.items():
            vals = [float(r[name]) for r in rows if np.isfinite(float(r[name]))]
            if len(vals) >= 2:
                firsts[s], deltas[s] = vals[0], np.asarray([vals[-1] - vals[0]])
        if deltas:
            est.put(f"f6_{name}.diff", deltas, [MAIN_ARM])
            est.mean(f"f6_{name}.first", firsts, [MAIN_ARM])
            est.mean(f"f6_{name}.last", {s: firsts[s] + deltas[s][0] for s in deltas}, [MAIN_ARM])

    figures = _figures(run, evals, bound, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn, arms, hl)
    return m, figures, evals, bound


def _to_np(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


def _figures(run, evals, bound, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn, arms, hl):
    p = run.preset
    fig = run.path("figures")
    out = {}
    kmax_i = int(np.argmax(p.eval.ks))
    grid = np.asarray(evals["base"]["announced"]["grid"])
    out["pass_kt_heatmap"] = plots.pass_kt_heatmap(grid, tiers, p.eval.ks, os.path.join(fig, "pass_kt_base.png"),
                                                   title="Pass@(K,T), base (announced)")
    curves, kcurves = {}, {}
    for name in ["base"] + arms:
        labels = ["base"] if name == "base" else [lb for lb in evals if lb.startswith(name + "/")]
        if name != "base":  # included seeds only (every seed when none is included)
            labels = [lb for lb in labels if hl[(name, int(lb.rsplit("seed", 1)[1]))].included] or labels
        g = np.mean([np.asarray(evals[lb]["announced"]["grid"]) for lb in labels], axis=0)
        curves[name], kcurves[name] = g[:, kmax_i], g[-1, :]
    out["pass_at_t"] = plots.pass_at_t_curves(tiers, curves, os.path.join(fig, "pass_at_t.png"),
                                              bound_U=np.asarray(bound["grid"])[:, kmax_i], k=p.eval.ks[kmax_i])
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
            {f"seed {s}": ([r["step"] for r in rows], [r["r_multi"] for r in rows], [r["r_single"] for r in rows])
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


def write_report(run, metrics, figures, evals, bound):
    p = run.preset
    study.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    meta = {"preset": p.name, "Pass@(K,T) mode": "announced (budget in the prompt, separate rollouts per T)",
            "tasks": f"{p.eval.n_tasks} held-out {p.task.size}x{p.task.size} FrozenLake maps, "
                     f"{p.eval.n_samples} samples per task and budget",
            "RL": f"{len(p.seeds)} seeds x {p.iterations} iterations of {p.n_tasks} tasks x {p.group_size} rollouts",
            "budget tiers": ", ".join(str(t) for t in metrics["meta.tiers"]),
            "K": ", ".join(str(k) for k in metrics["meta.ks"]),
            "statistics": "seeds are the unit of replication: units (tasks, states, actions, pairs) nested in "
                          f"seeds; >= {stats.MIN_BOOT_SEEDS} seeds: cluster bootstrap (seeds, then units within "
                          "each seed); fewer: Student-t over per-seed values; RL arms compared with GRPO are "
                          "paired by seed index; figures average / pool the included seeds"}
    rep = report.build_report(metrics, run.dir, figures=figures, meta=meta, title=f"jaxagent toy study: {p.name}")
    extra = ["", "## Beyond the paper: announced vs hidden budget (tightest tier, largest K; included seeds)", "",
             "| policy | announced | hidden |", "|---|---|---|"]
    for k in sorted(metrics):
        if k.startswith("x_hidden.") and k.endswith(".announced_tight"):
            arm = k.split(".")[1]
            extra.append(f"| {arm} | {metrics[k]:.3f} | {metrics[f'x_hidden.{arm}.hidden_tight']:.3f} |")
    text = rep.markdown + "\n".join(extra) + "\n"
    with open(os.path.join(run.dir, "report.md"), "w") as f:
        f.write(text)
    return os.path.join(run.dir, "report.md"), rep


def collect_policies(run) -> "study.SavedPolicies":
    """The run's finished arm seeds, each loaded when asked for (`study.SavedPolicies`)."""
    return study.saved_policies(run, [(arm, seed) for arm in run.preset.arms for seed in run.preset.seeds
                                      if study.done(os.path.join(run.dir, "arms", arm, f"seed{seed}"))])


def main(argv=None):
    args = cli.parser(__doc__.splitlines()[0], run_options=True).parse_args(argv)
    with cli.clear_errors():
        run = cli.make_run(args)
        base = run.load_policy(os.path.join(run.dir, "base"))
        metrics, figures, evals, bound = evaluate(run, base, collect_policies(run))
        path, _ = write_report(run, metrics, figures, evals, bound)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
