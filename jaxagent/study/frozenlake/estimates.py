"""Seed-aware estimates of the FrozenLake study's eval stage: each arm seed's health (`seed_health`), the metrics
dict writer (`Estimator`: `common.estimates.put_estimate` on the seeds whose arms are all included, an all-seeds
sensitivity line when a seed is left out), and the small conversions the findings share (`number`, `mean`,
`scored`, `to_np`).
"""
from __future__ import annotations

import os

import numpy as np

from jaxagent.eval import health, stats, step_quality
from jaxagent.study.common.estimates import put_estimate


def seed_health(run, policies) -> dict:
    """{(arm, seed): health.SeedHealth} from each arm seed's metrics.jsonl."""
    return {(a, s): health.classify_seed(health.read_log(os.path.join(run.dir, "arms", a, f"seed{s}",
                                                                        "metrics.jsonl")))
            for a, s in policies}


class Estimator:
    """Writes seed-aware estimates into the metrics dict: `<key>.*` on the included seeds (healthy, degraded,
    unknown) and, when some seed is excluded, `<key>.all.*` on every seed (the sensitivity line)."""

    def __init__(self, m, hl):
        self.m, self.hl = m, hl

    def _ok(self, arms, s):
        return all(self.hl.get((a, s)) is None or self.hl[(a, s)].included for a in arms)

    def put(self, key, units_by_seed: dict, arms, stat=stats.mean_of_seed_means) -> stats.Estimate:
        """`put_estimate` over the seeds whose every arm in `arms` is included, naming why each other was left out."""
        seeds = sorted(units_by_seed)
        reasons = {s: ", ".join(f"{a} {self.hl[(a, s)].status}" for a in arms if not self.hl[(a, s)].included)
                   for s in seeds if not self._ok(arms, s)}
        return put_estimate(self.m, key, units_by_seed, [s for s in seeds if self._ok(arms, s)],
                            " & ".join(arms), stat, reasons)

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


def number(x) -> float:
    """x as a float, NaN when it is not a number (a log row without the key, or null)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


def mean(x):
    """The mean of `x` as a float; NaN when it is empty."""
    x = np.asarray(x, np.float64)
    return float(x.mean()) if x.size else float("nan")


def scored(x, name, n_actions):
    """A step-quality / error-state result's per-state sampled and exact quality of one policy, an invalid
    reply scored as invalid (`step_quality.score_outcomes`)."""
    q = np.asarray(x["q"], np.float32)[:, :n_actions]
    out = step_quality.score_outcomes(np.asarray(x[f"probs_{name}"]), q, np.asarray(x[f"draws_{name}"]))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def to_np(tree):
    """A dict of arrays as numpy arrays."""
    return {k: np.asarray(v) for k, v in tree.items()}
