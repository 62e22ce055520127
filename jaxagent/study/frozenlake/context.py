"""What every finding group of the FrozenLake study's eval stage reads (`EvalContext`): the run and its preset,
the Pass@ results by label, the structural bound per seed, the seeds' health, and the metrics dict with its
`estimates.Estimator`. `evaluate.evaluate` builds it; each `*_rows` module writes its findings through it.

Labels: `base/seed<s>` (the base on seed s's held-out maps), `<arm>/seed<s>`; `headline` holds the headline
evaluation (finding 1 at full budget on maps of its own) of `base/seed<s>` and `grpo/seed<s>` when the preset has
one. Arrays: per_task [U, J, P] (budget tiers x values of K x held-out tasks), p_star [U, P].
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxagent.eval import health
from jaxagent.study.frozenlake.estimates import Estimator, number


@dataclasses.dataclass
class EvalContext:
    """The eval stage's inputs and outputs, shared by the finding groups (module doc). `m` is the flat metrics
    dict (filled in order: the order of its keys is the order of metrics.json), `est` writes into it."""
    run: object
    base: object                      # the base policy's params
    policies: object                  # (arm, seed) -> params, loaded on demand (`common.policies.SavedPolicies`)
    tiers: list
    rcfg: object                      # the evaluation rollout's config (`measure.eval_setup`)
    tasks: dict                       # seed -> held-out maps
    evals: dict                       # label -> Pass@ result of every mode
    bounds: dict                      # seed -> the structural bound (`pass_drivers.upper_bound`)
    hl: dict                          # (arm, seed) -> health.SeedHealth
    m: dict
    est: Estimator
    headline: dict = dataclasses.field(default_factory=dict)         # label -> headline evaluation (finding 1)
    headline_bounds: dict = dataclasses.field(default_factory=dict)  # seed -> the bound on its headline maps

    @property
    def preset(self):
        return self.run.preset

    @property
    def ks(self) -> list:
        return list(self.preset.eval.ks)

    @property
    def kmax_i(self) -> int:
        """Index of the largest K."""
        return int(np.argmax(self.ks))

    @property
    def k1_i(self) -> int:
        """Index of the smallest K (K=1 in every preset)."""
        return int(np.argmin(self.ks))

    @property
    def full(self) -> int:
        """Index of the full-budget tier."""
        return len(self.tiers) - 1

    tight = 0                         # index of the tightest tier

    @property
    def all_seeds(self) -> list:
        return sorted(self.tasks)

    @property
    def arms(self) -> list:
        return sorted({a for a, _ in self.policies})

    def per_task(self, label: str, mode: str = "announced") -> np.ndarray:
        """float[U, J, P]: Pass@K per tier and task of one label's evaluation."""
        return np.asarray(self.evals[label][mode]["per_task"], np.float64)

    def arm_seeds(self, arm: str) -> list:
        return sorted(s for a, s in self.policies if a == arm)

    def arm_per_task(self, arm: str, mode: str = "announced") -> np.ndarray:
        """Mean over the arm's included seeds (every seed when none is included), each on its own maps."""
        seeds = [s for s in self.arm_seeds(arm) if self.hl[(arm, s)].included] or self.arm_seeds(arm)
        return np.mean([self.per_task(f"{arm}/seed{s}", mode) for s in seeds], axis=0)

    def base_per_task(self) -> dict:
        """seed -> the base's per_task on that seed's maps."""
        return {s: self.per_task(f"base/seed{s}") for s in self.all_seeds}

    def headline_per_task(self, label: str) -> np.ndarray:
        """float[1, J, P]: Pass@K at full budget per task of one label's headline evaluation."""
        return np.asarray(self.headline[label]["per_task"], np.float64)

    def training_success(self, arm: str, seed: int) -> list[float]:
        """The arm seed's training-batch success rate per iteration, in log order (its metrics.jsonl)."""
        recs = health.read_log(os.path.join(self.run.dir, "arms", arm, f"seed{seed}", "metrics.jsonl"))
        return [v for v in (number(r.get("success_rate")) for r in recs) if np.isfinite(v)]

    def bound_per_task(self) -> dict:
        """seed -> float[U, J, P], the structural bound per tier, K and task."""
        return {s: np.asarray(self.bounds[s]["per_task"], np.float64) for s in self.all_seeds}

    def solvable(self) -> dict:
        """seed -> bool[U, P]: p* > 0 at the tier (the task is solvable there)."""
        return {s: np.asarray(self.bounds[s]["p_star"]) > 0 for s in self.all_seeds}
