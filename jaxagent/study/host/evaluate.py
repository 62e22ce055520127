"""The host-domain study's evaluation stage over a run directory (`run.HostRun`, `evaluate`): held-out Pass@(K,T) of
the base and of every trained arm x seed with the structural bound (`eval_policy`), each further held-out split
(`extra_split`), and the findings measured on the GRPO seeds' policies (`step_quality_seed`, `error_prefixes`,
`likelihood_seed`; `read_dynamics`), each cached in runs/<name>/eval/ and reused on a rerun. A seed's policies and
the base draw made for it sample with the same key (`seed_key`), so per-seed differences are paired.
The files under eval/: docs/host_study.md, "The run directory"; sampling keys and recipe checks
(`recipe_metrics`): "Data", Definitions.

Dimension legend (CONVENTIONS.md): U budget tiers, P tasks, Z samples per task and tier.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from jaxagent.eval import health
from jaxagent.sampling import Sampler
from jaxagent.study import run_dir
from jaxagent.study.common.progress import no_progress
from jaxagent.rl.memory_plan import resolve_compute_dtype
from jaxagent.study.host import (domains as host_domains, dynamics as host_dynamics,
                                 error_recovery as host_error_recovery, likelihood as host_likelihood,
                                 likelihood_scoring as host_likelihood_scoring, metrics as host_metrics,
                                 stages as host_stages, step_quality as host_step_quality)
from jaxagent.study.host.experts import NoisyExpert, expert_for
from jaxagent.study.host.run import HostRun


EVAL_KEY = 99  # the held-out episodes' sampling key (`seed_key`)


def seed_key(seed: int | None):
    """The sampling key of the held-out episodes paired with arm seed `seed` (None: the base's unpaired evaluation,
    `EVAL_KEY`): seed s's policies and the base draw `base/seed<s>` use the same key, so a per-seed difference
    RL - base is paired on the same random numbers and the seeds' differences are independent draws, each with its
    own base sample (the base's sampling error is then in the spread over seeds that the intervals use)."""
    return jax.random.key(EVAL_KEY) if seed is None else jax.random.fold_in(jax.random.key(EVAL_KEY), seed)


def eval_policy(run: HostRun, load_params, label: str, seed: int | None = None, split: str | None = None) -> dict:
    """Announced-mode Pass@(K,T) of the policy `load_params()` returns (called only when the evaluation is not
    cached) on the held-out tasks, sampled with `seed_key(seed)` (cached in eval/<label>.json with that seed as
    "key_seed"; a cache made with another key is re-evaluated; on a finding-3
    or finding-4 domain the log keeps each episode's replies and step flags, on a finding-5 domain each full-budget
    episode's tokens and policy-token spans (`host_likelihood_scoring.TokenLog`), and a cached log without them is
    re-evaluated, with the same key). `split`: a further held-out split of the world (`HostWorld.extra_heldout`),
    logged in eval/<split>/ without the findings' episode records; None: the domain's held-out split. The rollouts
    compact their decoding as replies end (`domain_findings`: the episodes' distribution, and so what each verdict
    could come out as, is unchanged)."""
    path = os.path.join(run.path("eval", *([split] if split else [])), f"{label.replace('/', '_')}.json")
    d = run.world.domain.name
    tasks = run.world.heldout_tasks if split is None else run.world.extra_heldout[split]
    keep = split is None and host_domains.uses_env(d, host_error_recovery.DOMAINS + host_step_quality.DOMAINS)
    f5 = split is None and host_domains.uses_env(d, host_likelihood.DOMAINS)  # finding 5: full-budget tokens kept
    if os.path.isfile(path):
        with open(path) as f:
            cached = json.load(f)
        if ((not keep or "episodes" in cached) and (not f5 or host_likelihood_scoring.LOG_KEY in cached)
                and cached.get("key_seed") == seed):
            return cached
    p, w, params = run.preset, run.world, load_params()
    traces = []
    ro_fn = host_stages.make_host_rollout_fn(w, run.cfg, p.task, tasks, sampler=Sampler(temperature=1.0),
                                             compute_dtype=p.compute_dtype, mesh=run.mesh,
                                             on_trace=traces.append if keep else None)
    tok_log = host_likelihood_scoring.TokenLog(run.tiers[-1])
    rollout = lambda idx, b, k: ro_fn(params, idx, b, k)  # noqa: E731
    raw = host_stages.run_pass_episodes(tok_log.wrap(rollout) if f5 else rollout, len(tasks), run.tiers,
                                        p.eval.n_samples, seed_key(seed), p.eval.batch_size)
    per_task = host_metrics.pass_grid(raw["success"], p.eval.ks)
    res = {**raw, "key_seed": seed, "ks": list(p.eval.ks), "split": split or w.domain.heldout_split,
           "task_ids": [getattr(t, "id", str(i)) for i, t in enumerate(tasks)],
           "per_task": per_task, "mean": per_task.mean(-1)}
    if keep:
        total = raw["status"].size
        sizes = [min(p.eval.batch_size, total - start) for start in range(0, total, p.eval.batch_size)]
        res["episodes"] = host_error_recovery.episode_records(traces, sizes)
    if f5:
        total = raw["status"].size
        sizes = [min(p.eval.batch_size, total - start) for start in range(0, total, p.eval.batch_size)]
        res[host_likelihood_scoring.LOG_KEY] = tok_log.log_entry(sizes, raw["status"].shape)
    run_dir.write_json(path, res)
    with open(path) as f:
        return json.load(f)


def read_dynamics(run: HostRun, policies) -> dict | None:
    """Finding 6's records per GRPO seed (arms/grpo/seed<s>/dynamics.jsonl, `host_dynamics.record`); None outside
    `host_dynamics.DOMAINS`."""
    if not host_domains.uses_env(run.world.domain.name, host_dynamics.DOMAINS):
        return None
    paths = {s: os.path.join(run.dir, "arms", a, f"seed{s}", "dynamics.jsonl") for a, s in policies
             if a == host_metrics.MAIN_ARM}
    return {s: health.read_log(path) for s, path in sorted(paths.items()) if os.path.isfile(path)}


def evaluate(run: HostRun, base, policies: dict, progress=no_progress) -> dict:
    """Stage 'eval': every policy's Pass@(K,T) (`eval_policy`; `policies` maps (arm, seed) to a trained policy,
    loaded one at a time), eval/bound.json, each arm seed's training health, the domain's findings on the GRPO
    seeds (3: `step_quality_seed`, 4: `error_prefixes`, 5: `likelihood_seed`, 6: `read_dynamics`), then every
    further held-out split's Pass@(K,T) (`extra_split`); returns the domain's flat metrics
    (`host_metrics.domain_metrics`, `split_labels`, `extra_split`)."""
    p, w, d = run.preset, run.world, run.world.domain.name
    seeds = sorted({s for _, s in policies})
    bar = progress(1 + len(seeds) + len(policies), "eval Pass@(K,T)", "policy")
    evals = {"base": eval_policy(run, lambda: base, "base")}
    bar.step()
    for s in seeds:  # the base's draw paired with each seed (`seed_key`)
        evals[f"base/seed{s}"] = eval_policy(run, lambda: base, f"base/seed{s}", s)
        bar.step()
    for a, s in policies:  # one policy loaded at a time (`study.SavedPolicies`)
        evals[f"{a}/seed{s}"] = eval_policy(run, lambda a=a, s=s: policies[(a, s)], f"{a}/seed{s}", s)
        bar.step()
    bar.close()
    bound = host_metrics.structural_bound(w.min_turns(w.heldout_tasks), run.tiers, p.eval.ks)
    run_dir.write_json(os.path.join(run.path("eval"), "bound.json"),
                       {**bound, "tiers": list(run.tiers), "ks": list(p.eval.ks),
                        "task_ids": evals["base"]["task_ids"]})
    logs = {(a, s): health.read_log(os.path.join(run.dir, "arms", a, f"seed{s}", "metrics.jsonl")) for a, s in policies}
    hl = {key: health.classify_seed(log) for key, log in logs.items()}
    per_task = {label: np.asarray(e["per_task"], np.float64) for label, e in evals.items()}
    # the findings' GRPO seeds, each seed's policy loaded only when its record is not cached
    seeds = [s for a, s in policies if a == host_metrics.MAIN_ARM]
    rl = lambda s: lambda: policies[(host_metrics.MAIN_ARM, s)]  # noqa: E731
    judged = stepq = lik = None
    if host_domains.uses_env(d, host_error_recovery.DOMAINS) and seeds:
        judged = {s: error_prefixes(run, base, rl(s), evals, s) for s in seeds}
    if host_domains.uses_env(d, host_step_quality.DOMAINS) and seeds:
        stepq = {s: step_quality_seed(run, base, rl(s), evals, s) for s in seeds}
    if host_domains.uses_env(d, host_likelihood.DOMAINS) and seeds:
        memo = {}  # base's episodes scored under base, shared by the seeds
        lik = {s: likelihood_seed(run, base, rl(s), evals, s, memo) for s in seeds}
    gigpo_turns = {s: [r["mean_turns"] for r in log if "mean_turns" in r]
                   for (a, s), log in logs.items() if a == "gigpo"}
    m = host_metrics.domain_metrics(d, per_task, bound, run.tiers, p.eval.ks, hl, n_train=len(w.train_tasks),
                                    n_heldout=len(w.heldout_tasks), error_prefixes=judged,
                                    likelihood=lik, dynamics=read_dynamics(run, policies), step_quality=stepq,
                                    batches={s: [r["success_rate"] for r in log if "success_rate" in r]
                                             for (a, s), log in logs.items() if a == host_metrics.MAIN_ARM},
                                    gigpo_turns=gigpo_turns or None, recovering_expert=recovering_expert(run))
    m.update(split_labels(run))
    m.update(recipe_metrics(run))
    for name in w.extra_heldout:  # after the held-out split's: a run stopped here resumes from the cached logs
        m.update(extra_split(run, base, policies, name, hl))
    return m


def split_labels(run: HostRun) -> dict:
    """Which split every number comes from: `<d>.split.heldout_name` and `<d>.split.train_name` (the env's split
    names), `<d>.split.heldout_note` (how the env makes it), and a note per further split the env does not offer."""
    w, d = run.world, run.world.domain.name
    notes = getattr(w.env, "split_notes", {})
    out = {f"{d}.split.train_name": w.domain.train_split, f"{d}.split.heldout_name": w.domain.heldout_split,
           f"{d}.split.heldout_note": notes.get(w.domain.heldout_split, w.domain.split_note)}
    for name in w.missing_splits:
        out[f"{d}.note.split_{name}"] = f"split '{name}' not evaluated: this env's tasks have no such split"
    return out


def extra_split(run: HostRun, base, policies: dict, name: str, health_by_seed: dict) -> dict:
    """Pass@(K,T) of every policy on the further held-out split `name` (the same sampling keys as the held-out
    split's), with its structural bound (eval/<name>/bound.json): `<d>.<name>.pass.<policy>.t<T>.k<k>`,
    `<d>.<name>.bound.t<T>`, `<d>.<name>.split.heldout` and `<d>.<name>.split.note` (`host_metrics.pass_metrics`),
    and each arm's RL - base Pass@1 with its interval, `<d>.<name>.gap.<arm>.t<T>.*` (`host_metrics.split_gaps`)."""
    p, w, d = run.preset, run.world, run.world.domain.name
    evals = {"base": eval_policy(run, lambda: base, "base", split=name)}
    for s in sorted({s for _, s in policies}):
        evals[f"base/seed{s}"] = eval_policy(run, lambda: base, f"base/seed{s}", s, split=name)
    for a, s in policies:
        evals[f"{a}/seed{s}"] = eval_policy(run, lambda a=a, s=s: policies[(a, s)], f"{a}/seed{s}", s, split=name)
    bound = host_metrics.structural_bound(w.min_turns(w.extra_heldout[name]), run.tiers, p.eval.ks)
    run_dir.write_json(os.path.join(run.path("eval", name), "bound.json"), {
        **bound, "tiers": list(run.tiers), "ks": list(p.eval.ks), "task_ids": evals["base"]["task_ids"]})
    per_task = {label: np.asarray(e["per_task"], np.float64) for label, e in evals.items()}
    prefix = f"{d}.{name}"
    m = host_metrics.pass_metrics(prefix, per_task, bound, run.tiers, p.eval.ks, health_by_seed)
    m.update(host_metrics.split_gaps(prefix, per_task, run.tiers, p.eval.ks, health_by_seed))
    m[f"{prefix}.split.heldout"] = len(w.extra_heldout[name])
    m[f"{prefix}.split.note"] = getattr(w.env, "split_notes", {}).get(name, "")
    return m


def recipe_metrics(run: HostRun) -> dict:
    """What the recipe checks read (`jaxagent.eval.recipe`): `<d>.recipe.base_slip_rate`, the probability the SFT
    base's expert slips on a first submission (`HostSFTSettings.noise`; 0 for a clean or no SFT base), and
    `<d>.recipe.recovering_expert` (1.0 when it recovers from slips given more turns, `recovering_expert`)."""
    s, d = run.preset.sft, run.world.domain.name
    return {f"{d}.recipe.base_slip_rate": float(s.noise) if s is not None else 0.0,
            f"{d}.recipe.recovering_expert": float(recovering_expert(run))}


def recovering_expert(run: HostRun, expert: NoisyExpert | None = None) -> bool:
    """Whether the run's SFT base imitates a noisy expert (`expert`, default the env's, `experts.expert_for`) that
    recovers from its slips given more turns (`host_metrics.RECOVERING_EXPERT_NOTE`): it checks first
    (`HostSFTSettings.check`), or it fixes some slips (`HostSFTSettings.slip_fix` > 0) and a fixed slip on some
    train task takes more turns than the reference (the slip, then the fix: coding, BFCL). False for an env without
    an expert."""
    s = run.preset.sft
    if s is None or s.noise == 0:
        return False
    if s.check > 0:
        return True
    if s.slip_fix == 0:
        return False
    env = run.world.env
    expert = expert_for(env) if expert is None else expert
    if expert is None:
        return False
    for task in run.world.train_tasks:
        slipped = expert.slipped_actions(task, s.seed, fix=1.0)
        if slipped is not None and len(slipped) > len(env.ground_truth_actions(task)):
            return True
    return False


def error_prefixes(run: HostRun, base, load_rl, evals: dict, seed: int) -> dict:
    """Finding 4 for GRPO seed `seed` (cached in eval/f4_grpo_seed<s>.json): the error prefixes of base's and the
    seed's full-budget held-out episodes, one continuation each by base and by the seed, judged per prefix
    (`host_error_recovery`)."""
    def compute(label):
        p, w = run.preset, run.world
        prefixes = host_error_recovery.prefixes_from_log(evals, ["base", label], w.heldout_tasks, p.task.t_max)
        key = jax.random.fold_in(jax.random.key(404), seed)
        acts = {}
        for i, (name, prm) in enumerate((("base", base), ("rl", load_rl()))):
            acts[name] = host_error_recovery.continue_prefixes(
                prm, run.cfg, w, p.task, prefixes, jax.random.fold_in(key, i), p.eval.batch_size,
                sampler=Sampler(temperature=1.0), compute_dtype=resolve_compute_dtype(p.compute_dtype),
                mesh=run.mesh)
        return {**host_error_recovery.judge(w.env, prefixes, acts["base"], acts["rl"]), "actions": acts}
    return seed_record(run, "f4", seed, compute)


def seed_record(run: HostRun, tag: str, seed: int, compute) -> dict:
    """A finding's record for GRPO seed `seed`, eval/<tag>_grpo_seed<s>.json: read when it exists, else
    `compute(label)` (label = 'grpo/seed<s>') and written (by process 0, `run_dir.write_json`)."""
    label = f"{host_metrics.MAIN_ARM}/seed{seed}"
    path = os.path.join(run.path("eval"), f"{tag}_{label.replace('/', '_')}.json")
    if not os.path.isfile(path):
        res = compute(label)
        run_dir.write_json(path, res)
        return res
    with open(path) as f:
        return json.load(f)


def step_quality_seed(run: HostRun, base, load_rl, evals: dict, seed: int) -> dict:
    """Finding 3 for GRPO seed `seed` (cached in eval/f3_grpo_seed<s>.json): matched states drawn in equal numbers
    (at most eval.step_states each) from base's and the seed's full-budget held-out episodes, G = eval.step_samples
    replies of each policy per state (the same key for both: common random numbers), each scored by its unit-test
    pass rate (`host_step_quality`)."""
    def compute(label):
        p, w = run.preset, run.world
        states = host_step_quality.states_from_log(evals, "base", label, w.heldout_tasks, seed=303 + seed,
                                                   n_states=p.eval.step_states)
        key = jax.random.fold_in(jax.random.key(303), seed)
        scores = {name: host_step_quality.sample_scores(
            prm, run.cfg, w, p.task, states, key, p.eval.batch_size, p.eval.step_samples, run.tiers[-1],
            sampler=Sampler(temperature=1.0), compute_dtype=resolve_compute_dtype(p.compute_dtype),
            mesh=run.mesh)
            for name, prm in (("base", base), ("rl", load_rl()))}
        return host_step_quality.record(states, scores["base"], scores["rl"])
    return seed_record(run, "f3", seed, compute)


def likelihood_seed(run: HostRun, base, load_rl, evals: dict, seed: int, memo: dict | None = None) -> dict:
    """Finding 5 for GRPO seed `seed` (cached in eval/f5_grpo_seed<s>.json): every policy token of base's and the
    seed's full-budget held-out episodes scored under both policies, per episode its action NLLs under base, its
    cumulative LLR and its policy-token count (`host_likelihood_scoring.score_seed`; rows per scoring batch: the train
    step's micro-batch, n_tasks x group_size / micro_batches, on the run's mesh and compute dtype)."""
    p = run.preset
    return seed_record(run, "f5", seed, lambda label: host_likelihood_scoring.score_seed(
        base, load_rl(), run.cfg, evals["base"], evals[label], batch_size=p.n_tasks * p.group_size // p.micro_batches,
        mesh=run.mesh, compute_dtype=resolve_compute_dtype(p.compute_dtype), max_width=p.task.max_context,
        memo=memo))


