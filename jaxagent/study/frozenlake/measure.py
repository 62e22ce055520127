"""What the FrozenLake study's eval stage measures per policy, each cached under the run's eval/ directory: held-out
maps per seed (`heldout_tasks`, `plan_tasks`, `headline_tasks`), Pass@(K,T) in every mode (`eval_policy`), the
headline evaluation of finding 1 at full budget (`headline_eval`), plan-mode success
(`plan_eval`), paired base-vs-RL diagnostics per seed (`pooled`), and the run's finished policies
(`collect_policies`). Placement: the training rollout's (`placement`; `evaluate` module doc).
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from jaxagent import sharding
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.eval import pass_drivers
from jaxagent.sampling import Sampler
from jaxagent.study import plan_mode, run_dir
from jaxagent.study.common.estimates import MAIN_ARM
from jaxagent.study.common.policies import SavedPolicies
from jaxagent.study.frozenlake.train import saved_policies

TASK_KEY, PASS_KEY, PLAN_KEY = 4242, 99, 600  # held-out maps, Pass@(K,T) sampling, plan-mode sampling (per seed)
HEADLINE_TASK_KEY, HEADLINE_PASS_KEY = 4343, 98  # the headline evaluation's maps and sampling (per seed)


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


def headline_tasks(run, seed: int):
    """Seed `seed`'s maps of the headline evaluation: preset.task.sample(fold_in(key(HEADLINE_TASK_KEY), seed),
    eval.headline_tasks), drawn apart from the Pass@ maps."""
    p = run.preset
    return p.task.sample(jax.random.fold_in(jax.random.key(HEADLINE_TASK_KEY), int(seed)), p.eval.headline_tasks)


def eval_setup(run):
    """(budget tiers, rollout config) of the evaluation: the preset's tiers and temperature-1 sampling."""
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


def cache_path(run, name: str) -> str:
    """eval/<name>.json of the run (a '/' in `name` becomes '_')."""
    return os.path.join(run.path("eval"), f"{name.replace('/', '_')}.json")


def eval_policy(run, load_params, label, tasks, seed: int) -> dict:
    """Pass@(K,T) in every mode of the policy `load_params()` returns on `tasks` (seed `seed`'s held-out maps),
    sampled with fold_in(key(PASS_KEY), seed); `load_params` is called only when eval/<label>.json, the cache,
    does not exist."""
    out_path = cache_path(run, label)
    if os.path.isfile(out_path):
        with open(out_path) as f:
            return json.load(f)
    p, params = run.preset, load_params()
    tiers, rcfg = eval_setup(run)
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


def headline_eval(run, load_params, label, tasks, seed: int) -> dict:
    """The headline evaluation (finding 1): Pass@K at the full budget T_max, announced, for every K of the preset, of
    the policy `load_params()` returns on `tasks` (`headline_tasks`), eval.headline_samples episodes per map,
    sampled with fold_in(key(HEADLINE_PASS_KEY), seed) (common random numbers for base and RL on one seed's maps);
    cached as eval/headline_<label>.json. Returns {"per_task": [1, J, P], "grid": [1, J], ...}."""
    out_path = cache_path(run, f"headline_{label}")
    if not os.path.isfile(out_path):
        p = run.preset
        _, rcfg = eval_setup(run)
        r = pass_drivers.pass_kt(run.world, run.cfg, load_params(), tasks,
                                 jax.random.fold_in(jax.random.key(HEADLINE_PASS_KEY), int(seed)),
                                 t_max=p.task.t_max, tiers=[p.task.t_max], n_samples=p.eval.headline_samples,
                                 ks=p.eval.ks, env_params=p.task.env_params(), rcfg=rcfg, mode="announced",
                                 batch_size=p.rollout_batch, n_boot=p.eval.n_boot, **placement(run))
        r.pop("success", None)
        run_dir.write_json(out_path, r)
    with open(out_path) as f:
        return json.load(f)


def plan_eval(run, load_params, label, tasks, seed: int) -> np.ndarray:
    """Plan-mode success float[P, Z] (`plan_mode.plan_success`: every move in one reply, no feedback) of the
    policy `load_params()` returns on `tasks` at the full budget, sampled with fold_in(key(PLAN_KEY), seed)
    (common random numbers for base and RL on one seed's maps); cached as eval/plan_<label>.json."""
    out_path = cache_path(run, f"plan_{label}")
    if not os.path.isfile(out_path):
        p = run.preset
        ok = plan_mode.plan_success(run.world, run.cfg, load_params(), np.asarray(tasks),
                                    jax.random.fold_in(jax.random.key(PLAN_KEY), int(seed)), t_max=p.task.t_max,
                                    n_samples=p.eval.n_plan_samples,
                                    env_params=p.task.env_params(), max_context=p.task.max_context,
                                    batch_size=p.rollout_batch, **placement(run))
        run_dir.write_json(out_path, {"success": np.asarray(ok, np.float64)})
    with open(out_path) as f:
        return np.asarray(json.load(f)["success"], np.float64)


def pooled(run, pairs_fn, name, base, policies, seeds):
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


def collect_policies(run) -> SavedPolicies:
    """The run's finished arm seeds, each loaded when asked for (`common.policies.SavedPolicies`)."""
    return saved_policies(run, [(arm, seed) for arm in run.preset.arms for seed in run.preset.seeds
                                if run_dir.done(os.path.join(run.dir, "arms", arm, f"seed{seed}"))])
