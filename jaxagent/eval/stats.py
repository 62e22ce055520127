"""Seed-aware statistics of the study: t-intervals over seeds, MDE, TOST, the verdict rule, seeds to decide.

Dimension legend (this module): Sd seeds (clusters), Un units within one seed (tasks, states, actions, pairs).

The unit of replication is the RL seed: units measured on one trained policy are never pooled across seeds as if
independent. Every estimator takes `units_per_seed`, one entry per seed: a 1-D array of unit values [U_s], or a tuple
of such arrays (e.g. (NLL of RL actions, NLL of base actions)); a statistic maps a list of entries to one number,
by default the mean over seeds of each seed's mean (every seed weighs the same).
Interval (`seed_estimate`, `t_interval`, `INTERVAL_METHOD`), at every S >= 2: v_s = stat([units_s]), SE =
sd(v, ddof=1) / sqrt(S), CI = v-bar -/+ t_{1-alpha/2, S-1} SE, the Student-t interval (Student 1908, Biometrika
6(1); Casella & Berger 2002, sec. 9.2); S < 2: "n/a". MDE (`mde`; Bloom 1995, Evaluation Review 19(5), eq. 1):
(t_{1-alpha/2} + t_{power}) x SE. Equivalence (`tost`; Schuirmann 1987, J. Pharmacokinet. Biopharm. 15(6)): the
(1 - 2 alpha) CI inside (-m, m). Verdicts (`decide`, `VERDICT_RULE`): sign and size apart; `seeds_needed` gives a
range from the sd's 95% CI. Seed sets pooled (`pool_blocked`): a t-interval with the within-set mean square, N - B
df. Why a t-interval and its measured coverage: docs/study.md, "Statistics".
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as _sps

REPRODUCED, NOT_REPRODUCED, UNDERPOWERED, INCONCLUSIVE = "reproduced", "not reproduced", "underpowered", "inconclusive"
SMALLER = "reproduced in direction, smaller than the paper"
OPPOSITE = "not reproduced (opposite)"
NO_VARIANCE = "inconclusive (no variance)"
UNTESTABLE = "untestable here (bound)"
RECIPE = "untestable here (recipe)"
VERDICTS = (REPRODUCED, SMALLER, NOT_REPRODUCED, OPPOSITE, UNDERPOWERED, INCONCLUSIVE, NO_VARIANCE, UNTESTABLE,
            RECIPE)
T_SEEDS, NOT_AVAILABLE = "t over seeds", "n/a"
POOLED = "t over seeds, seed sets pooled and blocked by set"
INTERVAL_METHOD = (
    "seeds are the unit of replication: a Student-t interval over the per-seed values (seeds - 1 degrees of "
    "freedom) at every number of seeds, and the MDE from the same quantiles at 80% power. The seeds of one run "
    "share its base, so the interval covers RL's seed-to-seed spread on that base, not the base's own: a second "
    "seed set (--seed-offset, its own base and maps) replicates that.")
VERDICT_RULE = (
    "d is the measured difference signed so that the paper's direction is positive, CI its 95% Student-t "
    "interval over seeds and E the finding's reference effect; sign and size are judged apart. Directional "
    "findings: **reproduced** if the CI lies wholly above 0 and its upper end reaches E (not wholly short of "
    "the paper's size); **reproduced in direction, smaller than the paper** if it lies wholly above 0 and "
    "wholly below E; **not reproduced** if it holds 0 and its upper end is below E; **not reproduced "
    "(opposite)** if it lies wholly below 0; **underpowered** if it holds both 0 and E. Without E only the sign "
    "is judged (a CI holding 0 is **inconclusive**). A structural bound that leaves less than E on the paper's "
    "side blocks only the size: a CI wholly above 0 is then \"reproduced in direction, smaller than the "
    "paper\" (the reason names the bound), one wholly below 0 \"not reproduced (opposite)\", one holding 0 "
    "**untestable here (bound)**, as is every row whose bound leaves nothing on the paper's side. Parity "
    "findings (the paper reports no difference; margin m): **reproduced** if the two one-sided tests at 5% show "
    "equivalence (the 90% CI inside (-m, m)); **not reproduced** only if the 95% CI lies wholly outside [-m, m]; "
    "**inconclusive** otherwise; **untestable here (bound)** if the bound leaves less than m on both sides of 0 "
    "(equivalence is forced). A zero-width CI (every seed the same value) is **inconclusive (no variance)**, "
    "never decided as a point; no interval: **inconclusive**. A row whose outcome the training recipe or the "
    "base's design decides rather than the arms (a parity row whose arms did not each move the margin from the "
    "base, a row tilted by errors the base was built to make, a cumulative log-likelihood ratio at a toy "
    "recipe's KL budget) is **untestable here (recipe)** with the reason, whatever the interval. For an "
    "underpowered row the report gives the "
    "seeds that would bring the MDE down to E as a range, from the 95% chi-square interval of the per-seed sd.")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A seed-aware estimate: point value, (1 - alpha) interval [lo, hi], (1 - 2 alpha) interval [lo90, hi90]
    (for TOST), standard error, minimum detectable effect, degrees of freedom (S - 1), the number of seeds and
    units used, the method (T_SEEDS, NOT_AVAILABLE, or "given" for an interval read back without its method) and
    a reason when not available."""

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


def seed_estimate(units_per_seed: Sequence, stat: Callable = mean_of_seed_means, *, alpha: float = 0.05,
                  power: float = 0.8) -> Estimate:
    """The study's estimator of a quantity measured on units nested in seeds (module docstring): seeds without
    units are dropped; `t_interval` over the per-seed statistics stat([units_s]) at every S >= 2; fewer: "n/a"
    with the reason."""
    entries = [_as_entry(e) for e in units_per_seed]
    entries = [e for e in entries if _entry_size(e) > 0]
    s = len(entries)
    n_units = sum(_entry_units(e) for e in entries)
    per_seed = np.asarray([stat([e]) for e in entries], np.float64)
    est = t_interval(per_seed, alpha=alpha, power=power, n_units=n_units)
    if est.method == NOT_AVAILABLE and s == 1:
        return dataclasses.replace(est, reason="one seed with data: between-seed variance is not estimable")
    if est.method == NOT_AVAILABLE and s == 0:
        return dataclasses.replace(est, reason="no seed with data")
    return est


def pool_blocked(estimates: Sequence[Estimate], *, alpha: float = 0.05, power: float = 0.8) -> Estimate:
    """Seed sets pooled, blocked by set: the t-interval of B independent `t_interval` estimates of one quantity,
    each set b with n_b seeds, mean m_b and per-seed sd sd_b = se_b sqrt(n_b), as one sample with a fixed offset
    per set (a randomized-block one-way layout; Montgomery, Design and Analysis of Experiments, ch. 4):
    mean = sum n_b m_b / N, s^2 = sum (n_b - 1) sd_b^2 / (N - B) (the within-set mean square), SE = s / sqrt(N),
    df = N - B. A set's offset (its maps, its machine's arithmetic) moves its mean, not s, so a constant shift
    between sets does not widen the interval nor enter its centre beyond its share. Sets without an interval
    (fewer than 2 seeds) are left out; fewer than 2 sets left: "n/a" with the reason."""
    _check_level(alpha, "alpha")
    ok = [e for e in estimates if e.available and e.n_seeds >= 2 and math.isfinite(e.se)]
    if len(ok) < 2:
        return _not_available(f"{len(ok)} seed set(s) with an interval: pooling needs >= 2")
    n = np.asarray([e.n_seeds for e in ok], np.float64)
    means = np.asarray([e.mean for e in ok], np.float64)
    sds = np.asarray([e.se for e in ok], np.float64) * np.sqrt(n)
    big_n, df = float(n.sum()), float(n.sum() - len(ok))
    mean = float((n * means).sum() / big_n)
    se = float(math.sqrt(((n - 1) * sds ** 2).sum() / df) / math.sqrt(big_n))
    h95, h90 = _quantile(1 - alpha / 2, df) * se, _quantile(1 - alpha, df) * se
    return Estimate(mean, mean - h95, mean + h95, mean - h90, mean + h90, se, mde(se, df, alpha, power), df,
                    int(big_n), int(sum(e.n_units for e in ok)), POOLED)


def between_sets_p(estimates: Sequence[Estimate]) -> float:
    """The p-value of the one-way F test that B seed sets share one mean (Montgomery, ch. 3): F = [sum n_b (m_b -
    m)^2 / (B - 1)] / s^2 with s^2 the within-set mean square of `pool_blocked`, on (B - 1, N - B) df. Small: the
    sets differ beyond their seeds' spread (each set's own base and maps move its mean), so an interval over one
    set's seeds, or the pooled one, holds for those bases only. NaN below 2 sets with an interval."""
    ok = [e for e in estimates if e.available and e.n_seeds >= 2 and math.isfinite(e.se)]
    if len(ok) < 2:
        return math.nan
    n = np.asarray([e.n_seeds for e in ok], np.float64)
    means = np.asarray([e.mean for e in ok], np.float64)
    sds = np.asarray([e.se for e in ok], np.float64) * np.sqrt(n)
    b, big_n = len(ok), float(n.sum())
    within = float(((n - 1) * sds ** 2).sum() / (big_n - b))
    between = float((n * (means - (n * means).sum() / big_n) ** 2).sum() / (b - 1))
    if within == 0:
        return 0.0 if between > 0 else 1.0
    return float(_sps.f.sf(between / within, b - 1, big_n - b))


# ----------------------------------------------------------------------------- equivalence and verdicts
def tost(est: Estimate, margin: float) -> bool:
    """Two one-sided tests at level alpha (Schuirmann 1987): equivalent iff -margin < lo90 and hi90 < margin,
    the (1 - 2 alpha) interval inside (-margin, margin). No interval: False."""
    if not (margin > 0):
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    return est.available and math.isfinite(est.lo90) and -margin < est.lo90 and est.hi90 < margin


def no_variance(est: Estimate) -> bool:
    """Whether the 95% CI has zero width (every seed gave the same value, up to rounding): such an interval is
    no test of anything, so `decide` never reads it as a point."""
    return est.available and est.hi - est.lo <= 1e-12 * max(1.0, abs(est.mean))


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
           room: tuple[float, float] | None = None, scale: float = 1.0,
           recipe: str | None = None, room_source: str = "the bound") -> tuple[str, str]:
    """Verdict and its reason by `VERDICT_RULE`, in this order:
    1. direction must be +1 / -1 (the sign of the paper's difference) or 0 (parity, needs margin > 0); a
       recipe reason (`recipe`, non-empty: why the recipe, not the arms, decides the row): untestable here
       (recipe), whatever the estimate; no estimate or no interval: inconclusive.
    2. room = (lo, hi), the range of the difference the bound allows (difference units and sign), if given and
       `paper_side_room` is below the margin of a parity row, or <= 0 for a directional row: untestable here
       (bound), whatever the interval.
    3. a zero-width CI (`no_variance`): inconclusive (no variance).
    4. parity: reproduced if TOST (90% CI inside (-margin, margin)); not reproduced if the 95% CI lies wholly
       outside [-margin, margin]; inconclusive otherwise.
    5. directional, with d = direction x difference and [lo, hi] its 95% CI: hi < 0: not reproduced (opposite);
       lo > 0: reproduced if hi >= E (or without E), reproduced in direction, smaller than the paper if hi < E
       or if the bound's room < E; lo <= 0 <= hi: inconclusive without E, untestable here (bound) if the room
       < E, not reproduced if hi < E, underpowered otherwise (the CI holds both 0 and E).
    effect: the reference effect E (magnitude, in the difference's units; None: sign only). scale: the factor
    the report prints the difference with (e.g. 100 for points); reasons quote numbers times scale, signed as
    the row's values (a row expecting a fall reads "E = -10"). `room_source`: what sets the room, as the reasons
    name it ("the bound": the structural bound; a row whose room comes from its own data names that)."""
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")
    if direction == 0 and (margin is None or not margin > 0):
        raise ValueError(f"a parity finding needs an equivalence margin > 0, got {margin}")
    if recipe:
        return RECIPE, recipe
    if est is None or not est.available:
        why = "no estimate" if est is None else (est.reason or "not available")
        return INCONCLUSIVE, f"no interval ({why})"
    side = None if room is None else paper_side_room(room, direction)
    if direction == 0 and side is not None and side < margin:
        return UNTESTABLE, (f"{room_source} allows at most {_num(side * scale)} either side of 0, less than the "
                            f"margin {_num(margin * scale)}: equivalence is forced by {room_source}")
    if direction != 0 and side is not None and side <= 0:
        return UNTESTABLE, f"{room_source} allows no difference on the paper's side (at most {_num(side * scale)})"
    if no_variance(est):
        return NO_VARIANCE, (f"every seed gave {_num(est.mean * scale)}: a zero-width interval tests nothing")
    if direction == 0:
        return _parity(est, margin, scale)
    e = None if effect is None or not math.isfinite(effect) or effect == 0 else abs(float(effect))
    return _directional(est, direction, e, side, scale, room_source)


def _parity(est: Estimate, margin: float, scale: float) -> tuple[str, str]:
    m = f"±{_num(margin * scale)}"
    if tost(est, margin):
        return REPRODUCED, f"equivalent within {m} (TOST: the 90% CI lies inside it)"
    if est.lo > margin or est.hi < -margin:
        return NOT_REPRODUCED, f"the 95% CI lies wholly outside {m}"
    return INCONCLUSIVE, f"the 90% CI is not inside {m} and the 95% CI is not wholly outside it"


def _directional(est: Estimate, direction: int, e: float | None, side: float | None,
                 scale: float, room_source: str = "the bound") -> tuple[str, str]:
    d_lo, d_hi = sorted((direction * est.lo, direction * est.hi))
    end, e_text = _num(direction * d_hi * scale), "" if e is None else f"E = {_num(direction * e * scale)}"
    blocked = e is not None and side is not None and side < e
    bound = ("" if not blocked else
             f"{room_source} allows at most {_num(direction * side * scale)} on the paper's side, less than {e_text}")
    if d_hi < 0:
        return OPPOSITE, "the 95% CI lies on the opposite side of 0"
    if d_lo > 0:
        if e is None:
            return REPRODUCED, "the 95% CI lies on the paper's side of 0 (no reference effect: sign only)"
        if blocked:
            return SMALLER, f"the 95% CI lies on the paper's side of 0; {bound}, so the size cannot be tested"
        if d_hi >= e:
            return REPRODUCED, f"the 95% CI lies on the paper's side of 0 and reaches {e_text}"
        return SMALLER, f"the 95% CI lies on the paper's side of 0 and its far end {end} is short of {e_text}"
    if e is None:
        return INCONCLUSIVE, "the 95% CI holds 0 and there is no reference effect (sign only)"
    if blocked:
        return UNTESTABLE, f"the 95% CI holds 0 and {bound}: only a CI wholly on one side of 0 could decide it"
    if d_hi < e:
        return NOT_REPRODUCED, f"the 95% CI holds 0 and its paper-side end {end} falls short of {e_text}"
    return UNDERPOWERED, f"the 95% CI holds both 0 and {e_text}"


def p_reproduced(effect: float, sd: float, n_seeds: int, e: float, *, alpha: float = 0.05) -> float:
    """P(a directional row is "reproduced") when the per-seed values are N(effect, sd^2), S = n_seeds of them,
    judged by `decide` without a room: P(lo > 0 and hi >= E) with lo, hi = v-bar -/+ t_{1-alpha/2, S-1} s / sqrt(S).
    Given s, both hold iff v-bar > max(t s / sqrt(S), E - t s / sqrt(S)), so P = E_s[1 - Phi((max(...) - effect) /
    (sd / sqrt(S)))] over (S - 1) s^2 / sd^2 ~ chi2_{S-1}, v-bar and s independent (normal samples), integrated
    on a quantile grid of the chi-square. `effect` and E in the row's units, signed so the paper's side is +."""
    if n_seeds < 2 or not sd > 0:
        raise ValueError(f"p_reproduced needs n_seeds >= 2 and sd > 0, got {n_seeds}, {sd}")
    df = n_seeds - 1
    q = (np.arange(4000) + 0.5) / 4000
    s = sd * np.sqrt(_sps.chi2.ppf(q, df) / df)
    h = _quantile(1 - alpha / 2, df) * s / math.sqrt(n_seeds)
    need = np.maximum(h, abs(float(e)) - h)
    return float(np.mean(_sps.norm.sf((need - float(effect)) / (sd / math.sqrt(n_seeds)))))


# ----------------------------------------------------------------------------- seeds to decide a row
def seeds_for_sd(sd: float, effect: float, *, alpha: float = 0.05, power: float = 0.8,
                 max_seeds: int = 1000) -> int | None:
    """The smallest number of seeds S >= 2 with (t_{1-alpha/2, S-1} + t_{power, S-1}) * sd / sqrt(S) <= |E|, the
    MDE of a t-interval over S seeds with per-seed sd `sd` (Bloom 1995, eq. 1); None if S > max_seeds."""
    e, top = abs(float(effect)), int(max_seeds)
    if top < 2 or not (sd >= 0) or e == 0:
        return None

    def detectable(s: int) -> bool:
        return (_quantile(1 - alpha / 2, s - 1) + _quantile(power, s - 1)) * sd / math.sqrt(s) <= e

    # the MDE falls with S (t quantiles fall with df, 1/sqrt(S) falls), and t quantiles exceed the normal ones,
    # so the normal-quantile solution ((z_{1-a/2} + z_power) sd / E)^2 is a lower bound: bisect above it
    z = _quantile(1 - alpha / 2, math.inf) + _quantile(power, math.inf)
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


def sd_interval(est: Estimate, level: float = 0.95) -> tuple[float, float] | None:
    """The `level` confidence interval of the per-seed sd sigma, sd = est.se * sqrt(S) with S - 1 df:
    [sd sqrt((S-1) / chi2_{(1+level)/2, S-1}), sd sqrt((S-1) / chi2_{(1-level)/2, S-1})] (the chi-square
    interval for a normal variance, Casella & Berger 2002, sec. 9.2.2); None below 2 seeds or without an SE."""
    _check_level(level, "level")
    if est is None or est.n_seeds < 2 or not (math.isfinite(est.se) and est.se >= 0):
        return None
    df = est.n_seeds - 1
    sd = float(est.se) * math.sqrt(est.n_seeds)
    return (sd * math.sqrt(df / _sps.chi2.ppf((1 + level) / 2, df)),
            sd * math.sqrt(df / _sps.chi2.ppf((1 - level) / 2, df)))


def seeds_needed(est: Estimate | None, effect: float | None, *, alpha: float = 0.05, power: float = 0.8,
                 level: float = 0.95, max_seeds: int = 1000) -> tuple[int | None, int | None] | None:
    """(fewest, most): `seeds_for_sd` at the two ends of the per-seed sd's `level` interval (`sd_interval`), the
    range of seeds that would bring the MDE down to E given what the seeds say of their spread (at 3 seeds
    the sd's 95% interval spans a factor of 12, so one number would mislead). An end is None when it exceeds
    max_seeds; the whole is None if the estimate, its SE or E is unknown or there are fewer than 2 seeds."""
    _check_level(alpha, "alpha")
    _check_level(power, "power")
    if effect is None or not math.isfinite(effect) or effect == 0:
        return None
    sds = sd_interval(est, level)
    if sds is None:
        return None
    return tuple(seeds_for_sd(sd, effect, alpha=alpha, power=power, max_seeds=max_seeds) for sd in sds)
