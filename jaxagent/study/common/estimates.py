"""The seed-aware estimate writer both studies' findings use (`put_estimate`) and the seeds' health lines
(`health_metrics`), into a flat metrics dict.

An estimate is `stats.seed_estimate` over the included seeds (units nested in seeds; collapsed and diverged seeds
left out, `health.SeedHealth.included`) written as `<key>.*` with a `<key>.seeds` line naming the seeds used and
excluded; when some seed is excluded, the same estimate over every seed follows as `<key>.all.*` (the sensitivity
line).
"""
from __future__ import annotations

from typing import Callable, Collection, Mapping, Optional

from jaxagent.eval import stats

MAIN_ARM = "grpo"   # the arm most findings read (each study's RL policy compared with its base)


def put_estimate(m: dict, key: str, units_by_seed: Mapping, included: Collection,
                 arms: str = MAIN_ARM, stat: Callable = stats.mean_of_seed_means,
                 reasons: Optional[Mapping] = None) -> stats.Estimate:
    """`stats.seed_estimate` (statistic `stat`) of the units of the seeds in `included` into `<key>.*`, and of
    every seed into `<key>.all.*` when some are excluded; `arms` names whose seeds they are in the `<key>.seeds`
    line, `reasons` {seed: why} says after each excluded seed why it was left out (None: the seed alone)."""
    seeds = sorted(units_by_seed)
    kept = [s for s in seeds if s in included]
    dropped = [s for s in seeds if s not in included]
    est = stats.seed_estimate([units_by_seed[s] for s in kept], stat)
    named = [f"{s} ({reasons[s]})" if reasons is not None else str(s) for s in dropped]
    _write(m, key, est, f"{arms} seeds {', '.join(map(str, kept)) or 'none'}; "
                        f"{'excluded: ' + ', '.join(named) if dropped else 'none excluded'}")
    if dropped:
        est_all = stats.seed_estimate([units_by_seed[s] for s in seeds], stat)
        _write(m, f"{key}.all", est_all, f"{arms} seeds {', '.join(map(str, seeds))}")
    return est


def _write(m: dict, key: str, est: stats.Estimate, seeds_text: str) -> None:
    for name, v in est.as_dict().items():
        m[f"{key}.{name}"] = v
    m[f"{key}.seeds"] = seeds_text


def health_metrics(m: dict, health_by_seed: Mapping) -> None:
    """Writes each arm seed's `health.SeedHealth` into the metrics dict `m` as `health.<arm>.seed<s>.*`."""
    for (a, s), h in sorted(health_by_seed.items()):
        prefix = f"health.{a}.seed{s}"
        m[f"{prefix}.status"], m[f"{prefix}.reason"] = h.status, h.reason
        m[f"{prefix}.min_valid"], m[f"{prefix}.last_valid"] = h.min_valid, h.last_valid
        m[f"{prefix}.last_success"], m[f"{prefix}.iterations"] = h.last_success, h.iterations
