"""Seed health of an RL run from its per-iteration training log (metrics.jsonl: one record per iteration).

Dimension legend (this module): It logged iterations.

A collapsed seed (the policy stops producing valid actions, every reward and advantage becomes 0 and it never
recovers) or a diverged one says nothing about what RL improves, so the study's primary verdicts exclude them
and every verdict names the seeds it used (`HEALTH_RULE`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

HEALTHY, DEGRADED, COLLAPSED, DIVERGED, UNKNOWN = "healthy", "degraded", "collapsed", "diverged", "unknown"
INCLUDED = (HEALTHY, DEGRADED, UNKNOWN)   # statuses whose seeds enter the primary verdicts
DEGRADED_VALID, COLLAPSED_VALID, LAST_N = 0.95, 0.5, 3
# Training-health keys checked for non-finite values (whichever the log has).
DIVERGENCE_KEYS = ("loss", "pg_loss", "value_loss", "grad_norm", "kl", "entropy", "drift", "ratio_mean",
                   "mean_return", "success_rate", "valid_action_rate", "mismatch_mean")
HEALTH_RULE = (
    f"each seed's training log (metrics.jsonl) is classified, first match wins: **diverged** if any of "
    f"{', '.join(DIVERGENCE_KEYS)} is non-finite at some iteration; **collapsed** if the valid-action rate is "
    f"< {COLLAPSED_VALID} at each of the last {LAST_N} iterations, or the training success rate is 0 at each "
    f"of the last {LAST_N} iterations (fewer logged: all of them); **degraded** if the valid-action rate is "
    f"< {DEGRADED_VALID} at some iteration; **healthy** otherwise; **unknown** without a log. Primary verdicts "
    f"use healthy, degraded and unknown seeds and exclude collapsed and diverged ones.")


@dataclasses.dataclass(frozen=True)
class SeedHealth:
    """The status of one seed, the reason in words, and the log's summary numbers (NaN when absent)."""

    status: str
    reason: str
    iterations: int
    min_valid: float
    last_valid: float
    last_success: float

    @property
    def included(self) -> bool:
        return self.status in INCLUDED


def _series(records: Sequence[Mapping], key: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(key)
        if v is None or isinstance(v, (str, bool)):
            continue
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            continue
    return out


def classify_seed(records: Sequence[Mapping]) -> SeedHealth:
    """`HEALTH_RULE` on one seed's per-iteration records (dicts with success_rate, valid_action_rate, ...)."""
    nan = math.nan
    if not records:
        return SeedHealth(UNKNOWN, "no training log", 0, nan, nan, nan)
    valid, success = _series(records, "valid_action_rate"), _series(records, "success_rate")
    min_valid = min(valid) if valid else nan
    last_valid = valid[-1] if valid else nan
    last_success = success[-1] if success else nan
    summary = (len(records), min_valid, last_valid, last_success)
    for key in DIVERGENCE_KEYS:
        for i, r in enumerate(records):
            v = r.get(key)
            if isinstance(v, (int, float)) and not math.isfinite(float(v)):
                it = r.get("iteration", i)
                return SeedHealth(DIVERGED, f"{key} = {v} at iteration {it}", *summary)
    tail_valid, tail_success = valid[-LAST_N:], success[-LAST_N:]
    if tail_valid and max(tail_valid) < COLLAPSED_VALID:
        return SeedHealth(COLLAPSED, f"valid-action rate < {COLLAPSED_VALID} over the last {len(tail_valid)} "
                                     f"iterations (max {max(tail_valid):.2f})", *summary)
    if tail_success and max(tail_success) == 0.0:
        return SeedHealth(COLLAPSED, f"training success 0 over the last {len(tail_success)} iterations", *summary)
    if valid and min_valid < DEGRADED_VALID:
        worst = valid.index(min_valid)
        return SeedHealth(DEGRADED, f"valid-action rate {min_valid:.3f} < {DEGRADED_VALID} at iteration "
                                    f"{records[worst].get('iteration', worst)}", *summary)
    return SeedHealth(HEALTHY, f"valid-action rate >= {DEGRADED_VALID} throughout" if valid
                      else "no valid-action rate logged", *summary)


def read_log(path: str | os.PathLike) -> list[dict]:
    """The records of a JSONL log (one JSON object a line; NaN / Infinity as Python's json writes them);
    an absent file reads as no records."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def describe_seeds(arm: str, seeds: Sequence[int], health: Mapping[int, SeedHealth]) -> str:
    """'grpo seeds 0, 1 (excluded: 2 collapsed)' for the seeds of one arm and their health."""
    used = [s for s in seeds if health.get(s) is None or health[s].included]
    dropped = [f"{s} {health[s].status}" for s in seeds if health.get(s) is not None and not health[s].included]
    text = f"{arm} seeds {', '.join(map(str, used)) if used else 'none'}"
    return text + (f" (excluded: {', '.join(dropped)})" if dropped else "")
