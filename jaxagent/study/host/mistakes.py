"""What RL changed in a toy host run's submissions: the held-out episodes of the base and of each trained policy at
one announced budget, each final submission sorted by what is wrong with it (the `submission_mistake` of the env's
noisy expert, `experts.expert_for`, one of its `mistake_kinds`). SQL (`experts.sql.submission_mistake`): solved, a
slip of the gold query, a slip with other values, other values only, another query, no submission. Coding
(`experts.code.program_mistake`): the same kinds for the reference program (its literals for values). BFCL
(`experts.bfcl.BFCLExpert.submission_mistake`, the episode replayed): solved, a slip (a call with a required
argument left out), wrong calls, no call, out of budget, other.

It answers the question a toy study's verdicts raise (docs/host_study.md, "Toy presets"): did RL unlearn the noisy
expert's slips, or change something else? `mistake_table` runs it on a finished run directory
(`experiments.mistakes`). The episodes are sampled afresh (key `MISTAKE_KEY`), not read from the evaluation's
cache, which keeps no replies.

Dimension legend (CONVENTIONS.md): B episodes.
"""
from __future__ import annotations

import collections
import os
from typing import Callable

import jax
import numpy as np

from jaxagent.models import weights
from jaxagent.sampling import Sampler
from jaxagent.study.host import stages as host_stages
from jaxagent.study.host.experts import NoisyExpert, expert_for
from jaxagent.study.host.run import HostRun

MISTAKE_KEY = 2024
# env registry names whose envs have a noisy expert that sorts submissions (`experts.expert_for`): what
# experiments.mistakes checks before it opens a run (which builds the env)
ENVS = ("sql", "code", "bfcl")


def sorting_expert(run: HostRun) -> NoisyExpert:
    """The noisy expert of the run's env (`experts.expert_for`); ValueError where it has none that sorts
    submissions by mistake."""
    expert = expert_for(run.world.env)
    if expert is None or not expert.mistake_kinds:
        raise ValueError(f"the {run.world.domain.name!r} env does not sort submissions by mistake "
                         f"({', '.join(ENVS)} do)")
    return expert


def mistake_shares(run: HostRun, params, budget: int, n_samples: int, key=None) -> dict:
    """{kind: share of episodes} over the `mistake_kinds` of the env's noisy expert (`sorting_expert`), and
    "episodes": the count, for `params` on every held-out task x `n_samples` at the announced `budget`, in rollout
    batches of the preset's evaluation batch size."""
    expert = sorting_expert(run)
    if not 1 <= budget <= run.preset.task.t_max:
        raise ValueError(f"budget must be in [1, T_max = {run.preset.task.t_max}], got {budget}")
    p, tasks, traces = run.preset, run.world.heldout_tasks, []
    fn = host_stages.make_host_rollout_fn(run.world, run.cfg, p.task, tasks, sampler=Sampler(temperature=1.0),
                                          compute_dtype=p.compute_dtype, mesh=run.mesh, on_trace=traces.append)
    idx_B = np.repeat(np.arange(len(tasks)), n_samples)
    key = jax.random.key(MISTAKE_KEY) if key is None else key
    counts = collections.Counter()
    for lo in range(0, len(idx_B), p.eval.batch_size):
        idx = idx_B[lo:lo + p.eval.batch_size]
        ro = fn(params, idx, np.full(len(idx), budget, np.int32), jax.random.fold_in(key, lo))
        solved, trace = np.asarray(ro.success), traces[-1]
        for b in range(len(idx)):
            counts[expert.submission_mistake(trace.tasks[b], trace.actions[b], bool(solved[b]))] += 1
    n = sum(counts.values())
    return {**{kind: counts[kind] / n for kind in expert.mistake_kinds}, "episodes": n}


def mistake_table(run: HostRun, budget: int, n_samples: int, arms=None,
                  progress: Callable[[str], None] = lambda _: None) -> str:
    """A markdown table of `mistake_shares` (%) for the base (base/policy, or the checkpoint) and every finished
    arm/seed policy of the run (`arms`: these arms only), at `budget` with `n_samples` per held-out task."""
    policies = [("base", os.path.join(run.dir, "base", "policy"))]
    if not os.path.isdir(policies[0][1]):
        policies = [("base", run.checkpoint)]
    for arm in arms or run.preset.arms:
        for seed in run.preset.seeds:
            path = os.path.join(run.dir, "arms", arm, f"seed{seed}", "policy")
            if os.path.isdir(path):
                policies.append((f"{arm} seed {seed}", path))
    kinds = sorting_expert(run).mistake_kinds
    lines = [f"Held-out submissions at an announced budget of {budget} turn(s), {n_samples} per task (% of episodes)",
             "", "| policy | " + " | ".join(kinds) + " | episodes |", "|---|" + "---|" * (len(kinds) + 1)]
    for label, path in policies:
        shares = mistake_shares(run, weights.load(path, mesh=run.mesh)[1], budget, n_samples)
        lines.append(f"| {label} | " + " | ".join(f"{100 * shares[k]:.1f}" for k in kinds)
                     + f" | {shares['episodes']} |")
        progress(lines[-1])
    return "\n".join(lines) + "\n"
