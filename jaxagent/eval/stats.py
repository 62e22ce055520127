"""Seed-aware statistics of the study: t-intervals over seeds, cluster bootstrap, MDE, TOST, verdict rules.

Dimension legend (this module): Sd seeds (clusters), Un units within one seed (tasks, states, actions,
pairs), R bootstrap replicates.

The study's unit of replication is the RL seed: states, tasks and actions measured on one trained policy are
correlated through that policy, so they are never pooled across seeds as if independent. Every estimator takes
`units_per_seed`, a sequence with one entry per seed; an entry is a 1-D array of unit values [U_s], or a tuple
of 1-D arrays that are resampled independently within the seed (e.g. (NLL of RL actions, NLL of base actions)).
A statistic maps a list of such entries to one number; the default is the mean over seeds of each seed's mean,
so every seed weighs the same whatever its number of units.

Interval methods (`seed_estimate`, `INTERVAL_METHOD`):
- 2 <= S < MIN_BOOT_SEEDS (20): the seed-level statistics v_s = stat([units_s]) are S iid draws (the seed
  means carry the within-seed noise, so nothing is counted twice): mean v-bar, SE = sd(v, ddof=1) / sqrt(S),
  CI = v-bar -/+ t_{1-alpha/2, S-1} SE, the Student-t interval (Student 1908, "The probable error of a mean",
  Biometrika 6(1); any standard text, e.g. Casella & Berger 2002, sec. 9.2). It is exact for normal seed
  values at any ratio of between- to within-seed variance.
- S >= MIN_BOOT_SEEDS: two-stage cluster bootstrap (Davison & Hinkley 1997, "Bootstrap Methods and their
  Application", sec. 3.8, "strategy 1": resample clusters with replacement, then units with replacement within
  each chosen cluster); percentile interval, SE = standard deviation of the R replicates.
- S < 2: "n/a" with the reason (between-seed variance is not estimable from one seed).
Why t below 20 seeds: with few clusters the percentile bootstrap's interval is too narrow when between-seed
variance dominates (its spread uses the divisor S, not S - 1, and normal rather than t tails) and too wide when
within-seed variance dominates (the second stage adds the within-seed variance a second time). On normal
hierarchical data with 32 units per seed, `cluster_bootstrap` (1000 replicates) at S = 5 covers the true mean
in 0.84 of 1000 replications with between-seed sd 1 and within-seed sd 0.1, and in 0.98 with the sds swapped
(nominal 0.95); the t-interval covers it in 0.947 and 0.958 of 2000 (tests/test_stats.py asserts >= 0.93 at
S = 3, 5, 10 in both regimes, and the bootstrap's under-coverage at S = 5).

Minimum detectable effect (`mde`; Bloom 1995, "Minimum detectable effects", Evaluation Review 19(5), eq. 1):
MDE = (q_{1 - alpha/2} + q_{power}) * SE, q the Student-t quantile with S - 1 df for the t-interval (3.72 SE at
S = 5, alpha 0.05, 80% power) and the standard normal quantile for the bootstrap (2.80 SE): the true effect a
two-sided test at level alpha detects with probability `power` at this sample size. `seeds_needed` inverts it
for the number of seeds.

Equivalence (`tost`; Schuirmann 1987, J. Pharmacokinet. Biopharm. 15(6), two one-sided tests): a difference is
equivalent to zero within margin m at level alpha iff the (1 - 2 alpha) interval lies inside (-m, m).

Verdicts (`decide`, `VERDICT_RULE`): every outcome is reachable for every row type; a row whose structural bound
leaves less than E on the paper's side (or forces equivalence) is "untestable here (bound)", never decided.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as _sps

REPRODUCED, NOT_REPRODUCED, UNDERPOWERED, INCONCLUSIVE = "reproduced", "not reproduced", "underpowered", "inconclusive"
UNTESTABLE = "untestable here (bound)"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, UNDERPOWERED, INCONCLUSIVE, UNTESTABLE)
BOOTSTRAP, T_SEEDS, NOT_AVAILABLE = "cluster bootstrap", "t over seeds", "n/a"
MIN_BOOT_SEEDS = 20
INTERVAL_METHOD = (
    f"seeds are the unit of replication: with fewer than {MIN_BOOT_SEEDS} seeds a Student-t interval over the "
    f"per-seed values (seeds - 1 degrees of freedom), with {MIN_BOOT_SEEDS} or more a two-stage cluster "
    "bootstrap (seeds, then units within each seed), and the MDE from the same quantiles at 80% power.")
VERDICT_RULE = (
    "d is the measured difference signed so that the paper's direction is positive, CI its 95% interval, "
    "MDE = (q(0.975) + q(0.8)) x SE its minimum detectable effect (80% power, two-sided 5%, q the quantiles of "
    f"the interval's own distribution: Student t with seeds - 1 degrees of freedom below {MIN_BOOT_SEEDS} "
    "seeds), and E the reference effect of the finding. If the structural bound of the measurement leaves less "
    "than E of room on the paper's side (for a parity finding: less than the margin m on both sides of 0, so "
    "equivalence is forced), the finding is **untestable here (bound)**. "
    "Directional findings: **reproduced** if the whole CI lies above 0; **not reproduced** if it lies below 0, "
    "or if it holds 0 and its upper end is below E (E is excluded, whatever the MDE); **underpowered** if the "
    "CI holds both 0 and E and MDE > E; **inconclusive** if it holds both with MDE <= E, without E, or without "
    "an interval. Parity findings (the paper reports no difference): **reproduced** if the two one-sided tests "
    "at 5% show equivalence within the stated margin m (the 90% CI inside (-m, m)); **not reproduced** if the "
    "95% CI excludes 0; **underpowered** if neither and MDE > m; **inconclusive** otherwise. A zero-width CI "
    "is decided as a point by the same rules.")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A seed-aware estimate: point value, (1 - alpha) interval [lo, hi], (1 - 2 alpha) interval [lo90, hi90]
    (for TOST), standard error, minimum detectable effect, degrees of freedom (inf for the bootstrap), the number
    of seeds and units used, the method (BOOTSTRAP, T_SEEDS, NOT_AVAILABLE) and a reason when not available."""

    mean: float
    lo: float
    hi: float
    lo90: float
    hi90: float
    se: float
    mde: float
    df: float
    n_seeds: int
    n_units: int
    method: str
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.method != NOT_AVAILABLE and math.isfinite(self.lo) and math.isfinite(self.hi)

    def as_dict(self) -> dict:
        """Numbers (NaN where undefined) plus the method / reason strings, keyed by field name."""
        return dataclasses.asdict(self)


def _not_available(reason: str, n_seeds: int = 0, n_units: int = 0, mean: float = math.nan) -> Estimate:
    nan = math.nan
    return Estimate(mean, nan, nan, nan, nan, nan, nan, nan, n_seeds, n_units, NOT_AVAILABLE, reason)


@functools.lru_cache(maxsize=4096)
def _quantile(p: float, df: float) -> float:
    """Standard normal (df = inf) or Student-t quantile; cached because the same few (p, df) recur."""
    return float(_sps.norm.ppf(p)) if not math.isfinite(df) else float(_sps.t.ppf(p, df))


def mde(se: float, df: float = math.inf, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect (q_{1-alpha/2} + q_power) * se (module docstring; Bloom 1995, eq. 1)."""
    _check_level(alpha, "alpha")
    _check_level(power, "power")
    if not (se >= 0):
        return math.nan
    return (_quantile(1 - alpha / 2, df) + _quantile(power, df)) * float(se)


def _check_level(x: float, name: str) -> None:
    if not (0.0 < float(x) < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {x}")


# ----------------------------------------------------------------------------- units and statistics
def _as_entry(entry):
    if isinstance(entry, tuple):
        return tuple(np.asarray(a, np.float64).reshape(-1) for a in entry)
    return np.asarray(entry, np.float64).reshape(-1)


def _entry_size(entry) -> int:
    return min(a.size for a in entry) if isinstance(entry, tuple) else entry.size


def _entry_units(entry) -> int:
    return sum(a.size for a in entry) if isinstance(entry, tuple) else entry.size


def mean_of_seed_means(entries) -> float:
    """(1/S) sum_s mean(units_s): every seed weighs the same."""
    return float(np.mean([np.mean(e) for e in entries]))


def mean_difference(entries) -> float:
    """(1/S) sum_s [mean(a_s) - mean(b_s)] for entries (a_s, b_s) of two unit samples per seed
    (e.g. per-action NLL of RL actions and of base actions under base, docs/study.md finding 5)."""
    return float(np.mean([np.mean(a) - np.mean(b) for a, b in entries]))


def _resample(entry, rng):
    if isinstance(entry, tuple):
        return tuple(a[rng.integers(0, a.size, a.size)] for a in entry)
    return entry[rng.integers(0, entry.size, entry.size)]


# ----------------------------------------------------------------------------- interval estimators
def t_interval(values_Sd, *, alpha: float = 0.05, power: float = 0.8, n_units: int | None = None) -> Estimate:
    """Student-t interval over seed-level values v_s (one number per seed; NaNs dropped):
    mean = v-bar, SE = sd(v, ddof=1) / sqrt(S), CI = mean -/+ t_{1-alpha/2, S-1} SE, MDE with t quantiles.
    Fewer than 2 finite values give "n/a" with the reason."""
    _check_level(alpha, "alpha")
    v = np.asarray(values_Sd, np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    s = int(v.size)
    units = s if n_units is None else int(n_units)
    if s < 2:
        return _not_available(f"{s} seed(s) with a value: between-seed variance needs >= 2", s, units,
                              float(v.mean()) if s else math.nan)
    df = float(s - 1)
    se = float(v.std(ddof=1) / math.sqrt(s))
    mean = float(v.mean())
    h95, h90 = _quantile(1 - alpha / 2, df) * se, _quantile(1 - alpha, df) * se
    return Estimate(mean, mean - h95, mean + h95, mean - h90, mean + h90, se, mde(se, df, alpha, power), df, s,
                    units, T_SEEDS)


def cluster_bootstrap(units_per_seed: Sequence, stat: Callable = mean_of_seed_means, *, n_boot: int = 1000,
                      alpha: float = 0.05, power: float = 0.8, rng_seed: int = 0) -> Estimate:
    """Two-stage cluster bootstrap (module docstring; Davison & Hinkley 1997, sec. 3.8): each replicate draws S
    seeds with replacement, then each drawn seed's units with replacement (tuple entries: each array
    independently), and evaluates `stat`. Point value = stat of the data; percentile (1 - alpha) and
    (1 - 2 alpha) intervals; SE = sd of the replicates; replicates where stat is NaN are dropped."""
    _check_level(alpha, "alpha")
    if int(n_boot) < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    entries = [_as_entry(e) for e in units_per_seed]
    if not entries or any(_entry_size(e) == 0 for e in entries):
        raise ValueError("cluster_bootstrap needs at least one seed and at least one unit in every seed")
    rng = np.random.default_rng(rng_seed)
    s = len(entries)
    reps = np.empty(int(n_boot))
    for r in range(int(n_boot)):
        pick = rng.integers(0, s, s)
        reps[r] = stat([_resample(entries[i], rng) for i in pick])
    reps = reps[np.isfinite(reps)]
    n_units = sum(_entry_units(e) for e in entries)
    point = float(stat(entries))
    if reps.size < 2 or not math.isfinite(point):
        return _not_available("the statistic is undefined on the data or on most resamples", s, n_units, point)
    lo, hi, lo90, hi90 = np.quantile(reps, [alpha / 2, 1 - alpha / 2, alpha, 1 - alpha])
    se = float(reps.std(ddof=1))
    return Estimate(point, float(lo), float(hi), float(lo90), float(hi90), se, mde(se, math.inf, alpha, power),
                    math.inf, s, n_units, BOOTSTRAP)


def seed_estimate(units_per_seed: Sequence, stat: Callable = mean_of_seed_means, *, n_boot: int = 1000,
                  alpha: float = 0.05, power: float = 0.8, min_boot_seeds: int = MIN_BOOT_SEEDS,
                  rng_seed: int = 0) -> Estimate:
    """The study's estimator of a quantity measured on units nested in seeds (module docstring): seeds without
    units are dropped; >= min_boot_seeds (MIN_BOOT_SEEDS = 20) seeds: `cluster_bootstrap`; 2..min_boot_seeds-1:
    `t_interval` over the per-seed statistics stat([units_s]); fewer: "n/a" with the reason."""
    entries = [_as_entry(e) for e in units_per_seed]
    entries = [e for e in entries if _entry_size(e) > 0]
    s = len(entries)
    n_units = sum(_entry_units(e) for e in entries)
    if s >= int(min_boot_seeds):
        return cluster_bootstrap(entries, stat, n_boot=n_boot, alpha=alpha, power=power, rng_seed=rng_seed)
    per_seed = np.asarray([stat([e]) for e in entries], np.float64)
    est = t_interval(per_seed, alpha=alpha, power=power, n_units=n_units)
    if est.method == NOT_AVAILABLE and s == 1:
        return dataclasses.replace(est, reason="one seed with data: between-seed variance is not estimable")
    if est.method == NOT_AVAILABLE and s == 0:
        return dataclasses.replace(est, reason="no seed with data")
    return est


# ----------------------------------------------------------------------------- equivalence and verdicts
def tost(est: Estimate, margin: float) -> bool:
    """Two one-sided tests at level alpha (Schuirmann 1987): equivalent iff -margin < lo90 and hi90 < margin,
    the (1 - 2 alpha) interval inside (-margin, margin). No interval: False."""
    if not (margin > 0):
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    return est.available and math.isfinite(est.lo90) and -margin < est.lo90 and est.hi90 < margin


def paper_side_room(room: tuple[float, float], direction: int) -> float:
    """The largest difference the structural bound allows on the paper's side. room = (lo, hi): the range of the
    difference the bound allows, in the difference's own units and sign. direction +1: hi; -1: -lo; 0 (parity):
    max(hi, -lo), the largest departure from 0 on either side."""
    lo, hi = _check_room(room)
    if direction == 1:
        return hi
    if direction == -1:
        return -lo
    if direction == 0:
        return max(hi, -lo)
    raise ValueError(f"direction must be -1, 0 or +1, got {direction}")


def _check_room(room) -> tuple[float, float]:
    lo, hi = (float(x) for x in room)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"room must be (lo, hi) with lo <= hi, got {room}")
    return lo, hi


def _num(x: float) -> str:
    return f"{x:.3g}"


def decide(est: Estimate | None, direction: int, effect: float | None = None, margin: float | None = None, *,
           room: tuple[float, float] | None = None, scale: float = 1.0) -> tuple[str, str]:
    """Verdict and its reason from `VERDICT_RULE`, in this order:
    1. direction must be +1 / -1 (the sign of the paper's difference) or 0 (the paper reports parity, needs
       margin > 0); no estimate or no interval: inconclusive.
    2. room = (lo, hi), the range of the difference the structural bound allows (difference units and sign), if
       given: directional with E, `paper_side_room` < E: untestable here (bound); parity, `paper_side_room` <
       margin: untestable here (bound) (equivalence is forced by the bound).
    3. a zero-width CI is decided as a point by the rules below.
    4. directional, d = direction * difference: reproduced if the whole CI > 0; not reproduced if the CI < 0, or
       if it holds 0 and its paper-side end is below E (whatever the MDE); underpowered if it holds 0 and E and
       MDE > E; inconclusive otherwise or without E.
    5. parity: reproduced if TOST (90% CI inside (-margin, margin)); not reproduced if the 95% CI excludes 0;
       underpowered if MDE > margin; inconclusive otherwise.
    effect: the reference effect size E (magnitude, in the difference's units; None: no power rule). scale:
    the factor the report prints the difference with (e.g. 100 for points); reasons quote numbers times scale."""
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")
    if direction == 0 and (margin is None or not margin > 0):
        raise ValueError(f"a parity finding needs an equivalence margin > 0, got {margin}")
    if est is None or not est.available:
        why = "no estimate" if est is None else (est.reason or "not available")
        return INCONCLUSIVE, f"no interval ({why})"
    e = None if effect is None or not math.isfinite(effect) or effect == 0 else abs(float(effect))
    if room is not None:
        side = paper_side_room(room, direction)
        if direction != 0 and e is not None and side < e:
            return UNTESTABLE, (f"the bound allows at most {_num(side * scale)} on the paper's side, less than "
                                f"E = {_num(e * scale)}")
        if direction == 0 and side < margin:
            return UNTESTABLE, (f"the bound allows at most {_num(side * scale)} either side of 0, less than the "
                                f"margin {_num(margin * scale)}: equivalence is forced by the bound")
    if direction == 0:
        if tost(est, margin):
            return REPRODUCED, "equivalent within the margin (TOST: 90% CI inside it)"
        if est.lo > 0 or est.hi < 0:
            return NOT_REPRODUCED, "the 95% CI excludes 0"
        if not math.isfinite(est.mde):
            return INCONCLUSIVE, "neither equivalent nor different, and the MDE is unknown"
        if est.mde > margin:
            return UNDERPOWERED, "neither equivalent nor different, MDE > margin"
        return INCONCLUSIVE, "neither equivalent nor different, MDE <= margin"
    d_lo, d_hi = sorted((direction * est.lo, direction * est.hi))
    if d_lo > 0:
        return REPRODUCED, "the 95% CI excludes 0 on the paper's side"
    if d_hi < 0:
        return NOT_REPRODUCED, "the 95% CI excludes 0 on the opposite side"
    if e is None:
        return INCONCLUSIVE, "the 95% CI contains 0 and there is no reference effect"
    if d_hi < e:
        # signed as the row's values, so a row that expects a fall reads "-0.035 falls short of E = -0.097"
        return NOT_REPRODUCED, (f"the 95% CI contains 0 and its paper-side end {_num(direction * d_hi * scale)} "
                                f"falls short of E = {_num(direction * e * scale)} (E excluded)")
    if not math.isfinite(est.mde):
        return INCONCLUSIVE, "the 95% CI contains both 0 and E and its MDE is unknown"
    if est.mde > e:
        return UNDERPOWERED, "the 95% CI contains both 0 and E and MDE > E"
    return INCONCLUSIVE, "the 95% CI contains both 0 and E although MDE <= E"


def seeds_needed(est: Estimate | None, effect: float | None, *, alpha: float = 0.05, power: float = 0.8,
                 max_seeds: int = 1000) -> int | None:
    """The smallest number of seeds S >= 2 with (t_{1-alpha/2, S-1} + t_{power, S-1}) * sd / sqrt(S) <= E, the
    MDE of a t-interval over S seeds (module docstring; Bloom 1995, eq. 1) with the per-seed sd estimated as
    sd = est.se * sqrt(est.n_seeds). None if the estimate, its SE or E is unknown, or if S > max_seeds."""
    _check_level(alpha, "alpha")
    _check_level(power, "power")
    if est is None or effect is None or not math.isfinite(effect) or effect == 0 or int(max_seeds) < 2:
        return None
    if est.n_seeds < 1 or not (math.isfinite(est.se) and est.se >= 0):
        return None
    e, top = abs(float(effect)), int(max_seeds)
    sd = float(est.se) * math.sqrt(est.n_seeds)

    def detectable(s: int) -> bool:
        return (_sps.t.ppf(1 - alpha / 2, s - 1) + _sps.t.ppf(power, s - 1)) * sd / math.sqrt(s) <= e

    # the MDE falls with S (t quantiles fall with df, 1/sqrt(S) falls), and t quantiles exceed the normal ones,
    # so the normal-quantile solution ((z_{1-a/2} + z_power) sd / E)^2 is a lower bound: bisect above it
    z = float(_sps.norm.ppf(1 - alpha / 2) + _sps.norm.ppf(power))
    lo = max(2, math.ceil((z * sd / e) ** 2))
    if lo > top or not detectable(top):
        return None
    hi = top
    while lo < hi:
        mid = (lo + hi) // 2
        if detectable(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
