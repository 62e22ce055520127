"""Stage 'eval': every diagnostic of the study on the base and each trained policy, then the report.

Held-out maps per seed: RL seed s (of every arm) is evaluated on its own maps, `heldout_tasks(run, s)` =
preset.task.sample(fold_in(key(4242), s), n_tasks), so two seed sets (seeds 0-4 and 5-9) use different maps;
the base is evaluated on each seed's maps with that seed's key (labels `base/seed<s>`), and every RL - base
difference is paired per seed, so the base's own sampling variability enters every interval. The structural
bound is computed per seed on its maps (`pass_drivers.upper_bound`).

Per policy: Pass@(K,T) in the announced, hidden-budget and truncated modes, with costs. Base vs each RL
seed of the GRPO arm: step quality on matched states (G = preset.eval.n_sampled sampled actions per policy and
state, default 16; the exact expectation as a secondary line), error states (only those with the goal still
reachable, V* > 0), likelihood (per seed; the LLR of RL's successes above `findings.LLR_THRESHOLD`, the
length-matched LLR control) and plan-mode success (R_single, `plan_mode.plan_success`); all arms: Pass@T.
Pass@ rows are judged at K=1 (tight tiers: on the tasks solvable there) with the room the structural bound
allows the difference (`findings` module doc). Every arm seed's training log is classified
(`health.classify_seed`): collapsed and diverged seeds are left out of the primary estimates and kept in an
all-seeds sensitivity estimate. Estimates are seed-aware (`stats.seed_estimate`: units nested in seeds; arms
compared with GRPO are paired by seed index). An invalid reply is scored as invalid
(`step_quality.score_outcomes`). Everything lands in runs/<name>/eval/*.json (the bound per seed in
bound_seed<s>.json); figures (learning curves per arm, one line per seed; R_multi / R_single over training
from dynamics.jsonl), metrics.json and report.md follow.

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
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.eval import (driver_common, health, pass_drivers, plots, report, scoring, state_drivers, stats,
                           step_quality)
from jaxagent.eval.findings import LLR_THRESHOLD
from jaxagent.sampling import Sampler
from jaxagent.study import plan_mode, run_dir

MAIN_ARM = "grpo"
TASK_KEY, PASS_KEY, PLAN_KEY = 4242, 99, 600  # held-out maps, Pass@(K,T) sampling, plan-mode sampling (per seed)


def heldout_tasks(run, seed: int):
    """RL seed `seed`'s held-out maps: preset.task.sample(fold_in(key(TASK_KEY), seed), eval.n_tasks) (module
    doc); the base is evaluated on them too."""
    p = run.preset
    return p.task.sample(jax.random.fold_in(jax.random.key(TASK_KEY), int(seed)), p.eval.n_tasks)


def plan_tasks(run, seed: int):
    """Seed `seed`'s held-out maps for R_single: sampled from the same key as `heldout_tasks`, eval.n_plan_tasks
    of them (the Pass@ maps themselves when n_plan_tasks = n_tasks, as in every preset)."""
    p = run.preset
    return p.task.sample(jax.random.fold_in(jax.random.key(TASK_KEY), int(seed)), p.eval.n_plan_tasks)


def _eval_setup(run):
    p = run.preset
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    rcfg = p.task.rollout_config(sampler=Sampler(temperature=1.0), allow_forced=True)
    return tiers, rcfg


def placement(run) -> dict:
    """The rollout drivers' `mesh` and `compute_dtype`: the training rollout's (module doc)."""
    return {"mesh": run.mesh, "compute_dtype": run.compute_dtype}


def score_batch(run, base: int = 16) -> int:
    """States per exact-scoring call: the smallest multiple of the mesh's batch split >= base (16 without a
    mesh), so every chip scores its own states."""
    split = sharding.batch_divisor(run.mesh)
    return -(-base // split) * split


def _cache_path(run, name: str) -> str:
    return os.path.join(run.path("eval"), f"{name.replace('/', '_')}.json")


def eval_policy(run, load_params, label, tasks, seed: int, log=print) -> dict:
    """Pass@(K,T) in every mode of the policy `load_params()` returns on `tasks` (seed `seed`'s held-out maps),
    sampled with fold_in(key(PASS_KEY), seed); `load_params` is called only when eval/<label>.json, the cache,
    does not exist."""
    out_path = _cache_path(run, label)
    if os.path.isfile(out_path):
        with open(out_path) as f:
            return json.load(f)
    p, params = run.preset, load_params()
    tiers, rcfg = _eval_setup(run)
    key = jax.random.fold_in(jax.random.key(PASS_KEY), int(seed))
    res = {}
    modes = ["announced", "truncated"] + (["hidden"] if p.eval.hidden_budget else [])
    for mode in modes:
        r = pass_drivers.pass_kt(run.world, run.cfg, params, tasks, key, t_max=p.task.t_max, tiers=tiers,
                                 n_samples=p.eval.n_samples, ks=p.eval.ks, env_params=p.task.env_params(), rcfg=rcfg,
                                 mode=mode, batch_size=p.n_tasks * p.group_size, n_boot=p.eval.n_boot, **placement(run))
        r.pop("success", None)
        res[mode] = r
    run_dir.write_json(out_path, res)
    return json.loads(json.dumps(run_dir.jsonable(res)))


def plan_eval(run, load_params, label, tasks, seed: int) -> np.ndarray:
    """Plan-mode success float[P, Z] (`plan_mode.plan_success`: every move in one reply, no feedback) of the
    policy `load_params()` returns on `tasks` at the full budget, sampled with fold_in(key(PLAN_KEY), seed)
    (common random numbers for base and RL on one seed's maps); cached as eval/plan_<label>.json."""
    out_path = _cache_path(run, f"plan_{label}")
    if not os.path.isfile(out_path):
        p = run.preset
        ok = plan_mode.plan_success(run.world, run.cfg, load_params(), np.asarray(tasks),
                                    jax.random.fold_in(jax.random.key(PLAN_KEY), int(seed)), t_max=p.task.t_max,
                                    n_samples=p.eval.n_plan_samples,
                                    env_params=p.task.env_params(), max_context=p.task.max_context,
                                    batch_size=p.n_tasks * p.group_size, **placement(run))
        run_dir.write_json(out_path, {"success": np.asarray(ok, np.float64)})
    with open(out_path) as f:
        return np.asarray(json.load(f)["success"], np.float64)


def _pooled(run, pairs_fn, name, base, policies, seeds):
    """Runs a paired diagnostic (base vs each MAIN_ARM seed in `seeds`), cached per seed (a seed's policy is loaded
    only when its cache is missing); returns [(seed, result)]."""
    out = []
    for seed in seeds:
        path = os.path.join(run.path("eval"), f"{name}_{MAIN_ARM}_seed{seed}.json")
        if not os.path.isfile(path):
            run_dir.write_json(path, pairs_fn(base, policies[(MAIN_ARM, seed)], seed))
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
        """Mean over the included seeds of per-seed values (the point value printed beside an estimate); over
        every seed when none is included, so the report still shows what the run measured."""
        finite = {s: float(v) for s, v in values_by_seed.items() if np.isfinite(v)}
        vals = [v for s, v in sorted(finite.items()) if self._ok(arms, s)] or list(finite.values())
        self.m[key] = float(np.mean(vals)) if vals else float("nan")

    def room(self, finding_key, lo_by_seed: dict, hi_by_seed: dict, arms):
        """`<finding_key>.room_lo/.room_hi`: the mean over the seeds of per-seed rooms (the range of the
        difference the structural bound allows, `findings` module doc), as the difference is a mean over seeds."""
        self.mean(f"{finding_key}.room_lo", lo_by_seed, arms)
        self.mean(f"{finding_key}.room_hi", hi_by_seed, arms)


def _number(x) -> float:
    """x as a float, NaN when it is not a number (a log row without the key, or null)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


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
    """Runs every diagnostic; returns (metrics, figures, evals, bounds): the flat metrics dict the report reads
    (keys per findings.py, seed-aware estimates per stats.Estimate, rooms per `_Estimator.room`), figure paths,
    the Pass@ results by label (`base/seed<s>`, `<arm>/seed<s>`) and the structural bound per seed.

    Every Pass@ row is judged where a difference of E is possible (docs/study.md, Statistics): at K=1, and at a
    tight tier on the held-out tasks the exact solver can solve there (p* > 0), with the room the bound allows
    the difference written beside it."""
    p = run.preset
    tiers, rcfg = _eval_setup(run)
    env_params = p.task.env_params()
    n_sampled = int(p.eval.n_sampled)
    all_seeds = sorted({s for _, s in policies}) or [min(p.seeds)]  # no finished seed: the base on one seed's maps
    tasks = {s: heldout_tasks(run, s) for s in all_seeds}
    evals = {}
    jobs = [(None, s) for s in all_seeds] + sorted(policies)
    for a, s in tqdm(jobs, desc="eval Pass@(K,T)", unit="policy"):  # one policy loaded at a time
        label = f"{a or 'base'}/seed{s}"
        load = (lambda: base) if a is None else (lambda key=(a, s): policies[key])
        evals[label] = eval_policy(run, load, label, tasks[s], s, log)
    bounds = {s: pass_drivers.upper_bound(run.world, np.asarray(tasks[s]), tiers=tiers, ks=p.eval.ks,
                                          env_params=env_params) for s in all_seeds}
    for s, bnd in bounds.items():  # beside the Pass@ files, so each seed's bound can be read back
        run_dir.write_json(_cache_path(run, f"bound/seed{s}"), {k: bnd[k] for k in ("tiers", "ks", "p_star",
                                                                                    "per_task")})
    ks = list(p.eval.ks)
    m: dict = {"meta.tiers": list(tiers), "meta.ks": ks, "meta.t_max": float(p.task.t_max)}
    kmax_i, k1_i = int(np.argmax(ks)), int(np.argmin(ks))
    arms = sorted({a for a, _ in policies})
    hl = seed_health(run, policies)
    _health_metrics(m, hl)
    est = _Estimator(m, hl, p.eval.n_boot)

    def per_task(label, mode="announced"):
        return np.asarray(evals[label][mode]["per_task"], np.float64)  # [T, K, N]

    def arm_seeds(arm):
        return sorted(s for a, s in policies if a == arm)

    def arm_per_task(arm, mode="announced"):
        """Mean over the arm's included seeds (every seed when none is included), each on its own maps."""
        seeds = [s for s in arm_seeds(arm) if hl[(arm, s)].included] or arm_seeds(arm)
        return np.mean([per_task(f"{arm}/seed{s}", mode) for s in seeds], axis=0)

    full, tight = len(tiers) - 1, 0
    base_pt = {s: per_task(f"base/seed{s}") for s in all_seeds}
    bound_pt = {s: np.asarray(bounds[s]["per_task"], np.float64) for s in all_seeds}  # [T, K, N]
    solvable = {s: np.asarray(bounds[s]["p_star"]) > 0 for s in all_seeds}  # [T, N]: p* > 0 at the tier
    if MAIN_ARM in arms:
        seeds = arm_seeds(MAIN_ARM)
        main = [MAIN_ARM]
        rl = {s: per_task(f"{MAIN_ARM}/seed{s}") for s in seeds}

        def pass_row(key, t_i, k_i, comparator, other, pair_arms, on_solvable=False):
            """other - comparator Pass@K at tier t_i per seed (paired by task, optionally on the tasks solvable at
            t_i), with rows .base (comparator), .rl (other), .bound and the room (-comparator, bound - comparator)."""
            units, lo, hi, cb, ob, ub = {}, {}, {}, {}, {}, {}
            for s in comparator:
                use = solvable[s][t_i] if on_solvable else np.ones(bound_pt[s].shape[-1], bool)
                c, o, u = comparator[s][t_i, k_i][use], other[s][t_i, k_i][use], bound_pt[s][t_i, k_i][use]
                units[s] = o - c
                cb[s], ob[s], ub[s] = _mean(c), _mean(o), _mean(u)
                lo[s], hi[s] = -cb[s], ub[s] - cb[s]
            est.put(f"{key}.diff", units, pair_arms)
            est.mean(f"{key}.base", cb, pair_arms)
            est.mean(f"{key}.rl", ob, pair_arms)
            est.mean(f"{key}.bound", ub, pair_arms)
            est.room(key, lo, hi, pair_arms)

        base_by = {s: base_pt[s] for s in seeds}
        # 1. the headline: held-out Pass@1 at full budget; finding 6's R_multi is the same final-minus-base change
        pass_row("f1_pass1", full, k1_i, base_by, rl, main)
        pass_row("f6_r_multi", full, k1_i, base_by, rl, main)
        # 1. the RL-base gap at full budget as K grows; the verdict on the largest K
        for k_i, k in enumerate(ks):
            e = est.put(f"f1_breadth.k{k}", {s: rl[s][full, k_i] - base_pt[s][full, k_i] for s in seeds}, main)
            m[f"f1_breadth.gap_k{k}"] = e.mean
        pass_row("f1_breadth", full, kmax_i, base_by, rl, main)
        # 2. K=1 on the tasks solvable at the tightest tier: gap(tight) - gap(full) on those tasks; room:
        #    RL(tight) in [0, U(tight)], so the difference lies in [-base(tight) - gap(full), U - base - gap(full)]
        key = "f2_shrink_frozenlake"
        units, lo, hi, vals = {}, {}, {}, {n: {} for n in ("base_full", "rl_full", "base_tight", "rl_tight",
                                                             "bound_tight", "gap_full", "gap_tight", "solvable")}
        for s in seeds:
            use = solvable[s][tight]
            b_t, r_t = base_pt[s][tight, k1_i][use], rl[s][tight, k1_i][use]
            b_f, r_f = base_pt[s][full, k1_i][use], rl[s][full, k1_i][use]
            units[s] = (r_t - b_t) - (r_f - b_f)
            for n, v in (("base_full", b_f), ("rl_full", r_f), ("base_tight", b_t), ("rl_tight", r_t),
                         ("bound_tight", bound_pt[s][tight, k1_i][use]), ("gap_full", r_f - b_f),
                         ("gap_tight", r_t - b_t), ("solvable", use)):
                vals[n][s] = _mean(v)
            lo[s] = -vals["base_tight"][s] - vals["gap_full"][s]
            hi[s] = vals["bound_tight"][s] - vals["base_tight"][s] - vals["gap_full"][s]
        est.put(f"{key}.diff", units, main)
        for n, v in vals.items():
            est.mean(f"{key}.{n}" if n != "solvable" else f"{key}.solvable_tight", v, main)
        est.room(key, lo, hi, main)
        m[f"{key}.tier_turns"] = float(tiers[tight])
        # 7 and 8: arms against GRPO at K=1 on the tasks solvable at the tier, paired by seed index (every arm
        # starts seed s from the same key and is evaluated on seed s's maps)
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
                pass_row(name, t_i, k1_i, {s: rl[s] for s in both}, oth, [MAIN_ARM, other], on_solvable=True)
                m[f"{name}.tier_turns"] = float(tiers[t_i])
    # Beyond the paper: announced vs hidden budget per arm at the tightest tier (largest K).
    if p.eval.hidden_budget:
        for arm in ["base"] + arms:
            if arm == "base":
                a = np.mean([base_pt[s] for s in all_seeds], axis=0)
                h = np.mean([per_task(f"base/seed{s}", "hidden") for s in all_seeds], axis=0)
            else:
                a, h = arm_per_task(arm), arm_per_task(arm, "hidden")
            m[f"x_hidden.{arm}.announced_tight"] = float(a[tight, kmax_i].mean())
            m[f"x_hidden.{arm}.hidden_tight"] = float(h[tight, kmax_i].mean())

    grpo_seeds = [s for (a, s) in sorted(policies) if a == MAIN_ARM]
    depth_rows = error_depth_rows = None
    nll_pool, llr_pool = {}, {}
    if grpo_seeds:
        ok = lambda s: hl[(MAIN_ARM, s)].included  # noqa: E731
        n_act = fls.N_ACTIONS
        # 3. step quality on matched states: G sampled actions per policy and state
        sq_runs = _pooled(run, lambda b, r, s: state_drivers.step_quality_matched(
            run.world, run.cfg, b, r, tasks[s], jax.random.key(100 + s), t_max=p.task.t_max, n_states=p.eval.n_states,
            env_params=env_params, rcfg=rcfg, n_sampled=n_sampled, batch_size=p.n_tasks * p.group_size,
            score_batch=score_batch(run), **placement(run)), "step_quality", base, policies, grpo_seeds)
        f3 = {}
        for s, x in sq_runs:
            mask = np.asarray(x["mask"], bool)
            sb, sr = _scored(x, "base", n_act), _scored(x, "rl", n_act)
            mb, mr = sb["sampled"].mean(-1)[mask], sr["sampled"].mean(-1)[mask]
            v_star = np.asarray(x["q"], np.float64)[:, :n_act].max(-1)[mask]  # Q* <= V*: RL's mean Q* <= V*
            f3[s] = dict(mb=mb, mr=mr, eb=sb["exact"][mask], er=sr["exact"][mask], inv_b=sb["invalid_share"][mask],
                         v_star=v_star,
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
                         ("mean_v_star", lambda v: _mean(v["v_star"])),
                         ("invalid_base", lambda v: _mean(v["inv_b"])), ("invalid_rl", lambda v: _mean(v["inv_r"])),
                         ("exact_share_rl_better", lambda v: _mean(v["er"] > v["eb"])),
                         ("exact_share_equal", lambda v: _mean(v["er"] == v["eb"]))):
            est.mean(f"{key}.{name}", {s: fn(v) for s, v in f3.items()}, [MAIN_ARM])
        # room: RL's mean Q* per state lies in [0, V*(s)], so RL - base lies in [-mean Q* base, mean V* - base]
        est.room(key, {s: -_mean(v["mb"]) for s, v in f3.items()},
                 {s: _mean(v["v_star"]) - _mean(v["mb"]) for s, v in f3.items()}, [MAIN_ARM])
        m[f"{key}.n_states"] = float(sum(v["mb"].size for s, v in f3.items() if ok(s)))
        m[f"{key}.g"] = float(next(iter(f3.values()))["g"])
        use = [v for s, v in f3.items() if ok(s)] or list(f3.values())
        cat = lambda name: np.concatenate([v[name] for v in use])  # noqa: E731  pooled for the figure only
        if cat("mb").size:
            ones = np.ones((cat("mb").size, 1), bool)
            depth_rows = _to_np(step_quality.step_quality_by_depth(cat("mb")[:, None], ones, cat("mr")[:, None], ones,
                                                                   cat("depth")))

        # 4. error states where the goal is still reachable (V* > 0)
        er_runs = _pooled(run, lambda b, r, s: state_drivers.error_states(
            run.world, run.cfg, b, r, tasks[s], jax.random.key(200 + s), t_max=p.task.t_max,
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
        # room: continuation success lies in [0, 1], so RL - base lies in [-base, 1 - base]
        est.room(key, {s: -_mean(v["cb"]) for s, v in f4.items()}, {s: 1 - _mean(v["cb"]) for s, v in f4.items()},
                 [MAIN_ARM])
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
            # room: the deep half's share lies in [0, 1], so deep - shallow lies in [-shallow, 1 - shallow]
            est.room("f4_depth", {s: -_mean(h[1]) for s, h in halves.items()},
                     {s: 1 - _mean(h[1]) for s, h in halves.items()}, [MAIN_ARM])
            ones = np.ones((depths.size, 1), bool)
            error_depth_rows = _to_np(step_quality.step_quality_by_depth(
                np.concatenate([v["mb"] for v in use])[:, None], ones,
                np.concatenate([v["mr"] for v in use])[:, None], ones, depths))

        # 5. likelihood under base, per seed
        def lik(b, r, s):
            n = p.eval.n_tasks * p.eval.n_samples
            t_rep = jax.tree.map(lambda x: np.repeat(np.asarray(x), p.eval.n_samples, axis=0), tasks[s])
            bud = np.full(n, p.task.t_max)
            rb = driver_common.run_rollouts(run.world, run.cfg, b, t_rep, bud, jax.random.key(300 + s), env_params,
                                            rcfg, batch_size=p.n_tasks * p.group_size, **placement(run))
            rr = driver_common.run_rollouts(run.world, run.cfg, r, t_rep, bud, jax.random.key(400 + s), env_params,
                                            rcfg, batch_size=p.n_tasks * p.group_size, **placement(run))
            ids = np.repeat(np.arange(p.eval.n_tasks), p.eval.n_samples)
            return scoring.likelihood(run.world, run.cfg, b, r, rb, rr, jax.random.key(500 + s), task_ids_base=ids,
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
        # the judged LLR row: RL's own successes above LLR_THRESHOLD; the Jeffreys contrast (RL's successes minus
        # base's, >= 0 by definition, findings module doc) is printed, not judged
        est.put("f5_llr_rl.diff", {s: v[0] - LLR_THRESHOLD for s, v in llr.items()}, [MAIN_ARM])
        est.mean("f5_llr_rl.rl", {s: _mean(v[0]) for s, v in llr.items()}, [MAIN_ARM])
        est.mean("f5_llr_rl.base", {s: _mean(v[1]) for s, v in llr.items()}, [MAIN_ARM])
        est.mean("f5_llr_rl.jeffreys", {s: _mean(v[0]) - _mean(v[1]) for s, v in llr.items()}, [MAIN_ARM])
        m["f5_llr_rl.n_rl"] = float(sum(v[0].size for s, v in llr.items() if ok(s)))
        est.put("f5_matched_frozenlake.raw", pairs, [MAIN_ARM])
        est.put("f5_matched_frozenlake.diff", {s: v - LLR_THRESHOLD for s, v in pairs.items()}, [MAIN_ARM])
        m["f5_matched_frozenlake.n_pairs"] = float(sum(v.size for s, v in pairs.items() if ok(s)))
        m["f5_matched_frozenlake.n_tasks"] = float(len(pair_tasks))

        # 6. R_single: plan-mode success (every move in one reply, no feedback) on each seed's held-out maps,
        #    final RL - base per seed, paired by task; room: success lies in [0, 1]
        units, b_by, r_by = {}, {}, {}
        for s in grpo_seeds:
            maps = plan_tasks(run, s)
            pb = plan_eval(run, lambda: base, f"base/seed{s}", maps, s).mean(-1)
            pr = plan_eval(run, lambda s=s: policies[(MAIN_ARM, s)], f"{MAIN_ARM}/seed{s}", maps, s).mean(-1)
            units[s], b_by[s], r_by[s] = pr - pb, _mean(pb), _mean(pr)
        est.put("f6_r_single.diff", units, [MAIN_ARM])
        est.mean("f6_r_single.base", b_by, [MAIN_ARM])
        est.mean("f6_r_single.rl", r_by, [MAIN_ARM])
        est.room("f6_r_single", {s: -v for s, v in b_by.items()}, {s: 1 - v for s, v in b_by.items()},
                 [MAIN_ARM])


    # 6. the training logs of the main arm (dynamics.jsonl): first and last logged R_multi / R_single per seed,
    #    printed beside the judged held-out rows and drawn as the dynamics figure
    dyn = {}
    for (a, s) in sorted(policies):
        path = os.path.join(run.dir, "arms", a, f"seed{s}", "dynamics.jsonl")
        if a == MAIN_ARM and os.path.isfile(path):
            dyn[s] = health.read_log(path)
    for name in ("r_multi", "r_single"):
        firsts, lasts = {}, {}
        for s, rows in dyn.items():
            vals = [v for v in (_number(r.get(name)) for r in rows) if np.isfinite(v)]
            if vals:
                firsts[s], lasts[s] = vals[0], vals[-1]
        if firsts:
            est.mean(f"f6_{name}.log_first", firsts, [MAIN_ARM])
            est.mean(f"f6_{name}.log_last", lasts, [MAIN_ARM])

    figures = _figures(run, evals, bounds, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn, arms, hl)
    return m, figures, evals, bounds


def _to_np(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


def _figures(run, evals, bounds, tiers, depth_rows, error_depth_rows, nll_pool, llr_pool, dyn, arms, hl):
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
            {f"seed {s}": ([r["step"] for r in rows], [_number(r.get("r_multi")) for r in rows],
                          [_number(r.get("r_single")) for r in rows])
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


def write_report(run, metrics, figures, evals, bounds):
    p = run.preset
    run_dir.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    meta = {"preset": p.name, "Pass@(K,T) mode": "announced (budget in the prompt, separate rollouts per T)",
            "tasks": f"{p.eval.n_tasks} held-out {p.task.size}x{p.task.size} FrozenLake maps per RL seed (each seed "
                     f"its own maps, key fold_in({TASK_KEY}, seed)), {p.eval.n_samples} samples per task and budget; "
                     "the base is evaluated on every seed's maps and each RL - base difference is paired per seed",
            "RL": f"{len(p.seeds)} seeds x {p.iterations} iterations of {p.n_tasks} tasks x {p.group_size} rollouts",
            "budget tiers": ", ".join(str(t) for t in metrics["meta.tiers"]),
            "K": ", ".join(str(k) for k in metrics["meta.ks"]),
            "budget T_max": str(p.task.t_max),
            "statistics": f"{stats.INTERVAL_METHOD} RL arms compared with GRPO are paired by seed index; figures "
                          "average / pool the included seeds"}
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
                                      if run_dir.done(os.path.join(run.dir, "arms", arm, f"seed{seed}"))])


def main(argv=None):
    args = cli.parser(__doc__.splitlines()[0], run_options=True).parse_args(argv)
    with cli.clear_errors():
        run = cli.make_run(args)
        base = run.load_policy(os.path.join(run.dir, "base"))
        metrics, figures, evals, bounds = evaluate(run, base, collect_policies(run))
        path, _ = write_report(run, metrics, figures, evals, bounds)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
