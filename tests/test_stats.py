"""Tests of jaxagent.eval.stats (seed-aware intervals, MDE, TOST, verdict rules) and jaxagent.eval.health,
on synthetic data whose answer is known."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from jaxagent.eval import health, stats


def _seeds(rng, n_seeds, n_units, effect, seed_sd, unit_sd):
    """Units nested in seeds: value = effect + seed offset + unit noise."""
    offsets = rng.normal(0.0, seed_sd, n_seeds)
    return [effect + o + rng.normal(0.0, unit_sd, n_units) for o in offsets]


def test_mde_formula():
    assert stats.mde(1.0) == pytest.approx(1.959964 + 0.841621, rel=1e-5)  # 2.80 SE
    assert stats.mde(0.5, df=4) == pytest.approx(0.5 * (sps.t.ppf(0.975, 4) + sps.t.ppf(0.8, 4)), rel=1e-9)
    assert stats.mde(2.0, alpha=0.1, power=0.9) == pytest.approx(2.0 * (1.644854 + 1.281552), rel=1e-5)
    with pytest.raises(ValueError, match="power"):
        stats.mde(1.0, power=1.0)


def test_t_interval_hand_values():
    v = np.array([0.1, 0.3, 0.2, 0.6])
    est = stats.t_interval(v)
    se = v.std(ddof=1) / 2
    assert est.method == stats.T_SEEDS and est.n_seeds == 4 and est.df == 3
    assert est.mean == pytest.approx(0.3) and est.se == pytest.approx(se)
    assert est.hi - est.mean == pytest.approx(sps.t.ppf(0.975, 3) * se)
    assert est.hi90 - est.mean == pytest.approx(sps.t.ppf(0.95, 3) * se)
    one = stats.t_interval([0.4, float("nan")])
    assert one.method == stats.NOT_AVAILABLE and "between-seed" in one.reason and one.mean == 0.4
    assert not one.available


def test_seed_estimate_is_the_t_interval_at_every_number_of_seeds():
    rng = np.random.default_rng(0)
    three = _seeds(rng, 3, 20, 0.2, 0.1, 0.3)
    est = stats.seed_estimate(three)
    want = stats.t_interval([u.mean() for u in three])
    assert est.method == stats.T_SEEDS and est.n_units == 60
    assert (est.mean, est.lo, est.hi) == pytest.approx((want.mean, want.lo, want.hi))
    for n in (6, 20, 25):  # the same interval at 20 seeds and more
        many = _seeds(rng, n, 20, 0.2, 0.1, 0.3)
        est = stats.seed_estimate(many)
        want = stats.t_interval([u.mean() for u in many])
        assert est.method == stats.T_SEEDS and est.df == n - 1, n
        assert (est.lo, est.hi, est.lo90, est.hi90) == pytest.approx((want.lo, want.hi, want.lo90, want.hi90)), n
    assert "every number of seeds" in stats.INTERVAL_METHOD and "Student-t" in stats.INTERVAL_METHOD
    single = stats.seed_estimate([np.ones(50)])
    assert single.method == stats.NOT_AVAILABLE and "one seed" in single.reason
    # a seed without units is dropped, not counted
    assert stats.seed_estimate(three + [np.zeros(0)]).n_seeds == 3
    assert stats.seed_estimate([]).reason == "no seed with data"


def test_tuple_entries_give_one_value_per_seed():
    rng = np.random.default_rng(2)
    entries = [(rng.normal(1.0 + o, 0.2, 30), rng.normal(o, 0.2, 40)) for o in rng.normal(0, 2.0, 6)]
    est = stats.seed_estimate(entries, stats.mean_difference)
    assert est.method == stats.T_SEEDS and est.n_seeds == 6 and est.n_units == 6 * 70
    assert est.mean == pytest.approx(np.mean([a.mean() - b.mean() for a, b in entries]))
    assert est.lo < 1.0 < est.hi and est.hi - est.lo < 0.5  # the shared seed offset cancels in the difference


def test_t_interval_coverage_on_a_null():
    """3 seeds, 95% t-interval over seed means: coverage of the true mean is near 95%."""
    rng = np.random.default_rng(3)
    hits = []
    for _ in range(400):
        est = stats.seed_estimate(_seeds(rng, 3, 10, 0.0, 0.5, 0.5))
        hits.append(est.lo <= 0.0 <= est.hi)
    assert 0.92 <= np.mean(hits) <= 0.985


def test_pooling_states_across_seeds_would_claim_an_effect_the_seeds_do_not_support():
    """Seed means +0.3, -0.25, +0.2 with many precise states each: pooled states give a tight interval above 0,
    the seed-aware interval contains 0 (and with a 0.05 reference effect the verdict is underpowered)."""
    rng = np.random.default_rng(4)
    units = [m + rng.normal(0.0, 0.05, 400) for m in (0.3, -0.25, 0.2)]
    pooled = np.concatenate(units)
    naive_lo = pooled.mean() - 1.96 * pooled.std(ddof=1) / math.sqrt(pooled.size)
    assert naive_lo > 0
    est = stats.seed_estimate(units)
    assert est.lo < 0 < est.hi
    assert stats.decide(est, +1, effect=0.05)[0] == stats.UNDERPOWERED


def test_verdicts_on_synthetic_data_with_known_answers():
    rng = np.random.default_rng(5)
    # a true effect of known size (0.3) with 8 seeds: on the paper's side and reaching E
    est = stats.seed_estimate(_seeds(rng, 8, 50, 0.3, 0.05, 0.2))
    assert est.lo > 0 and est.hi >= 0.3
    assert stats.decide(est, +1, effect=0.3)[0] == stats.REPRODUCED
    assert stats.decide(est, -1, effect=0.3) == (stats.OPPOSITE, "the 95% CI lies on the opposite side of 0")
    # ... a quarter of the paper's size: the sign reproduces, the size does not (one verdict says both)
    assert stats.decide(est, +1, effect=1.2)[0] == stats.SMALLER
    # a null effect with enough seeds: E is excluded
    null = stats.seed_estimate(_seeds(rng, 8, 50, 0.0, 0.01, 0.05))
    assert null.lo < 0 < null.hi
    verdict, reason = stats.decide(null, +1, effect=0.3)
    # the reason names the paper-side end and E with the row's sign: a row expecting a fall says so
    assert verdict == stats.NOT_REPRODUCED and f"end {null.hi:.3g} falls short of E = 0.3" in reason
    verdict, reason = stats.decide(null, -1, effect=0.3)
    assert verdict == stats.NOT_REPRODUCED and f"end {null.lo:.3g} falls short of E = -0.3" in reason
    # few seeds, large noise: the CI holds both 0 and E
    weak = stats.seed_estimate(_seeds(rng, 3, 5, 0.05, 0.5, 1.0))
    assert weak.lo < 0 and weak.hi > 0.3 and stats.decide(weak, +1, effect=0.3)[0] == stats.UNDERPOWERED
    # parity with a true zero and enough data: TOST equivalent -> reproduced
    par = stats.seed_estimate(_seeds(rng, 8, 100, 0.0, 0.005, 0.02))
    assert stats.tost(par, 0.04) and stats.decide(par, 0, margin=0.04)[0] == stats.REPRODUCED
    # ... with little data: the CI holds 0 but that is not parity, nor a difference
    par_weak = stats.seed_estimate(_seeds(rng, 3, 5, 0.0, 0.2, 0.5))
    assert par_weak.lo < 0 < par_weak.hi and not stats.tost(par_weak, 0.04)
    assert stats.decide(par_weak, 0, margin=0.04)[0] == stats.INCONCLUSIVE
    # a real difference beyond the margin where the paper reports parity
    diff = stats.seed_estimate(_seeds(rng, 8, 100, 0.2, 0.005, 0.02))
    assert diff.lo > 0.04 and stats.decide(diff, 0, margin=0.04)[0] == stats.NOT_REPRODUCED


def _hand(lo, hi, lo90=None, hi90=None, mean=None):
    """An Estimate with hand-set intervals (t over 5 seeds), the 90% CI the 95% one unless given."""
    mean = (lo + hi) / 2 if mean is None else mean
    return stats.Estimate(mean, lo, hi, lo if lo90 is None else lo90, hi if hi90 is None else hi90, 0.1, 0.3, 4.0,
                          5, 50, stats.T_SEEDS)


# (95% CI of the measured difference, direction, E, room, verdict): each branch and the case just across each of
# its boundaries
DIRECTIONAL = [
    ((0.10, 0.30), +1, 0.3, None, stats.REPRODUCED),            # above 0, upper end reaches E (== E)
    ((0.10, 0.2999), +1, 0.3, None, stats.SMALLER),             # above 0, just short of E
    ((0.001, 0.20), +1, 0.3, None, stats.SMALLER),              # just above 0
    ((0.0, 0.20), +1, 0.3, None, stats.NOT_REPRODUCED),         # touches 0: holds it; upper end short of E
    ((-0.10, 0.2999), +1, 0.3, None, stats.NOT_REPRODUCED),     # holds 0, just short of E
    ((-0.10, 0.30), +1, 0.3, None, stats.UNDERPOWERED),         # holds 0 and E
    ((-0.20, 0.0), +1, 0.3, None, stats.NOT_REPRODUCED),        # touches 0 from below: holds it
    ((-0.20, -0.001), +1, 0.3, None, stats.OPPOSITE),           # just below 0
    ((-0.30, -0.10), -1, 0.3, None, stats.REPRODUCED),          # a fall the size of the paper's
    ((-0.2999, -0.10), -1, 0.3, None, stats.SMALLER),
    ((-0.2999, 0.10), -1, 0.3, None, stats.NOT_REPRODUCED),
    ((-0.30, 0.10), -1, 0.3, None, stats.UNDERPOWERED),
    ((0.001, 0.20), -1, 0.3, None, stats.OPPOSITE),
    ((0.001, 0.20), +1, None, None, stats.REPRODUCED),          # without E: sign only
    ((0.0, 0.20), +1, None, None, stats.INCONCLUSIVE),
    ((-0.20, -0.001), +1, None, None, stats.OPPOSITE),
    # the bound's room blocks only the size: [+5.7, +7.3] with room 9 and E 10 is a sign result
    ((0.057, 0.073), +1, 0.10, (-0.5, 0.09), stats.SMALLER),
    ((0.057, 0.12), +1, 0.10, (-0.5, 0.0999), stats.SMALLER),   # even a CI past E: the bound caps the size
    ((0.057, 0.12), +1, 0.10, (-0.5, 0.10), stats.REPRODUCED),  # room == E: the size is testable
    ((-0.02, 0.12), +1, 0.10, (-0.5, 0.0999), stats.UNTESTABLE),  # holds 0: only the size could decide it
    ((-0.02, 0.12), +1, 0.10, (-0.5, 0.10), stats.UNDERPOWERED),
    ((-0.12, -0.02), +1, 0.10, (-0.5, 0.05), stats.OPPOSITE),   # a sign result on the other side stands too
    ((0.01, 0.02), +1, 0.10, (-0.5, 0.001), stats.SMALLER),     # a sliver of room is still room for the sign
    ((0.01, 0.02), +1, 0.10, (-0.5, 0.0), stats.UNTESTABLE),    # none at all: the paper's side is impossible
    ((-0.02, -0.01), -1, 0.10, (0.0, 0.5), stats.UNTESTABLE),
]


@pytest.mark.parametrize("ci, direction, effect, room, want", DIRECTIONAL)
def test_directional_branches_and_their_boundaries(ci, direction, effect, room, want):
    verdict, reason = stats.decide(_hand(*ci), direction, effect=effect, room=room, scale=100)
    assert verdict == want, reason
    if room is not None and verdict in (stats.SMALLER, stats.UNTESTABLE) and effect is not None:
        assert "the bound allows" in reason, reason


def test_bound_limited_reasons_name_the_bound_in_the_report_scale():
    verdict, reason = stats.decide(_hand(0.057, 0.073), +1, effect=0.10, room=(-0.5, 0.09), scale=100)
    assert verdict == stats.SMALLER
    assert reason == ("the 95% CI lies on the paper's side of 0; the bound allows at most 9 on the paper's side, "
                      "less than E = 10, so the size cannot be tested")
    assert stats.decide(_hand(0.057, 0.073), +1, effect=0.10, scale=100) == (
        stats.SMALLER, "the 95% CI lies on the paper's side of 0 and its far end 7.3 is short of E = 10")
    verdict, reason = stats.decide(_hand(-0.02, 0.12), +1, effect=0.10, room=(-0.5, 0.04), scale=100)
    assert verdict == stats.UNTESTABLE and "at most 4 on the paper's side, less than E = 10" in reason
    verdict, reason = stats.decide(_hand(-0.04, -0.02), -1, effect=0.10, room=(-0.06, 0.5), scale=100)
    assert verdict == stats.SMALLER and "at most -6 on the paper's side, less than E = -10" in reason


# (95% CI, 90% CI, room, verdict) of a parity row with margin 0.1
PARITY = [
    ((-0.15, 0.15), (-0.0999, 0.0999), None, stats.REPRODUCED),   # 90% CI just inside +-m
    ((-0.15, 0.15), (-0.10, 0.05), None, stats.INCONCLUSIVE),     # touches -m: not inside
    ((0.042, 0.098), (0.049, 0.091), None, stats.REPRODUCED),     # CI excludes 0, yet equivalent within m
    ((0.1001, 0.30), (0.12, 0.28), None, stats.NOT_REPRODUCED),   # 95% CI just wholly above +m
    ((0.10, 0.30), (0.12, 0.28), None, stats.INCONCLUSIVE),       # touches +m: not wholly outside
    ((-0.30, -0.1001), (-0.28, -0.12), None, stats.NOT_REPRODUCED),
    ((-0.30, -0.10), (-0.28, -0.12), None, stats.INCONCLUSIVE),
    ((-0.30, 0.30), (-0.20, 0.20), None, stats.INCONCLUSIVE),     # wide: neither
    ((0.2, 0.3), (0.21, 0.29), (-0.05, 0.0999), stats.UNTESTABLE),  # the bound forces |d| < m
    ((0.2, 0.3), (0.21, 0.29), (-0.05, 0.10), stats.NOT_REPRODUCED),  # room == m: decided by the data
]


@pytest.mark.parametrize("ci, ci90, room, want", PARITY)
def test_parity_branches_and_their_boundaries(ci, ci90, room, want):
    verdict, reason = stats.decide(_hand(*ci, *ci90), 0, margin=0.1, room=room, scale=100)
    assert verdict == want, reason
    if want == stats.UNTESTABLE:
        assert "equivalence is forced by the bound" in reason and "less than the margin 10" in reason


def test_decide_without_an_interval_and_bad_arguments():
    assert stats.decide(None, +1, effect=0.1) == (stats.INCONCLUSIVE, "no interval (no estimate)")
    assert stats.decide(stats.t_interval([1.0]), +1, effect=0.1)[0] == stats.INCONCLUSIVE
    assert stats.decide(None, +1, effect=0.3, room=(0.0, 0.1))[0] == stats.INCONCLUSIVE  # no estimate at all
    with pytest.raises(ValueError, match="direction"):
        stats.decide(_hand(-1, 1), 2)
    with pytest.raises(ValueError, match="margin"):
        stats.decide(_hand(-1, 1), 0)
    with pytest.raises(ValueError, match="room"):
        stats.decide(_hand(-1, 1), +1, effect=0.3, room=(0.2, -0.2))


# ----------------------------------------------------------------------------- seed health
def _log(valid, success=None, **extra):
    success = success if success is not None else [0.3] * len(valid)
    return [{"iteration": i, "valid_action_rate": v, "success_rate": s, "loss": 0.1, **extra}
            for i, (v, s) in enumerate(zip(valid, success))]


def test_classify_seed_rules():
    h = health.classify_seed(_log([0.98, 0.99, 0.97, 1.0]))
    assert h.status == health.HEALTHY and h.included and h.min_valid == 0.97
    h = health.classify_seed(_log([0.98, 0.90, 0.97, 1.0]))
    assert h.status == health.DEGRADED and h.included and "iteration 1" in h.reason
    # a collapsed seed: 0.98 -> 0.16 -> 0.0
    h = health.classify_seed(_log([0.98, 0.16, 0.02, 0.0, 0.0], [0.3, 0.1, 0.0, 0.0, 0.0]))
    assert h.status == health.COLLAPSED and not h.included and "valid-action rate" in h.reason
    h = health.classify_seed(_log([0.98, 0.97, 0.99, 0.99], [0.4, 0.0, 0.0, 0.0]))
    assert h.status == health.COLLAPSED and "success 0" in h.reason
    h = health.classify_seed(_log([0.98, 0.4, 0.45, 0.6]))  # recovered above 0.5 at the end: degraded only
    assert h.status == health.DEGRADED
    recs = _log([0.98, 0.99, 0.97])
    recs[1]["grad_norm"] = float("nan")
    h = health.classify_seed(recs)
    assert h.status == health.DIVERGED and "grad_norm" in h.reason and not h.included
    assert health.classify_seed([]).status == health.UNKNOWN
    assert health.classify_seed(_log([0.3, 0.2])).status == health.COLLAPSED  # fewer than 3 logged: all of them


def test_read_log_and_describe(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"valid_action_rate": 0.99, "success_rate": 0.5, "kl": NaN}\n\n')
    recs = health.read_log(path)
    assert len(recs) == 1 and math.isnan(recs[0]["kl"])
    assert health.classify_seed(recs).status == health.DIVERGED
    assert health.read_log(tmp_path / "absent.jsonl") == []
    hl = {0: health.classify_seed(_log([1.0] * 3)), 2: health.classify_seed(_log([0.1] * 3))}
    assert health.describe_seeds("grpo", [0, 1, 2], hl) == "grpo seeds 0, 1 (excluded: 2 collapsed)"


def test_zero_width_interval_is_never_decided_as_a_point():
    """Every seed the same difference (all at 0, or all at 0.2): no variance, no test, whatever the row."""
    for value in (0.0, 0.2):
        est = stats.seed_estimate([np.full(16, value)] * 3)
        assert est.available and est.lo == pytest.approx(value) and est.hi == pytest.approx(value)
        assert stats.no_variance(est)
        for direction in (+1, -1):
            for effect in (0.1, None):
                verdict, reason = stats.decide(est, direction, effect=effect)
                assert verdict == stats.NO_VARIANCE and "zero-width" in reason, (value, direction, effect)
        assert stats.decide(est, 0, margin=0.04)[0] == stats.NO_VARIANCE
        assert stats.decide(est, 0, margin=0.3)[0] == stats.NO_VARIANCE
    # the bound comes first: a parity row it forces stays untestable, as does a directional row with no room
    zero = stats.seed_estimate([np.zeros(16)] * 3)
    assert stats.decide(zero, 0, margin=0.04, room=(-0.01, 0.01))[0] == stats.UNTESTABLE
    assert stats.decide(zero, +1, effect=0.1, room=(-0.5, 0.0))[0] == stats.UNTESTABLE
    # just across: a CI of width 1e-6 is an interval, decided by the rules
    assert not stats.no_variance(_hand(0.2, 0.2 + 1e-6))
    assert stats.decide(_hand(0.2, 0.2 + 1e-6), +1, effect=0.3)[0] == stats.SMALLER
    assert stats.decide(_hand(0.2, 0.2), +1, effect=0.3)[0] == stats.NO_VARIANCE


# ----------------------------------------------------------------------------- coverage at the study's sizes
def _hierarchical(rng, n_reps, n_seeds, n_units, seed_sd, unit_sd):
    """[R, S, U] replications of units nested in seeds with true mean 0: seed offset + unit noise."""
    return rng.normal(0.0, seed_sd, (n_reps, n_seeds, 1)) + rng.normal(0.0, unit_sd, (n_reps, n_seeds, n_units))


@pytest.mark.parametrize("seed_sd, unit_sd", [(1.0, 0.1), (0.1, 1.0)], ids=["between", "within"])
def test_seed_estimate_covers_at_three_five_and_ten_seeds(seed_sd, unit_sd):
    """The interval `seed_estimate` gives at S = 3, 5, 10 seeds (32 units each) covers the true mean in >= 0.93
    of 2000 replications, whether between- or within-seed variance dominates (nominal 0.95; the binomial SE of
    a coverage of 0.95 over 2000 replications is 0.005)."""
    rng = np.random.default_rng(11 if seed_sd > unit_sd else 12)
    for n_seeds in (3, 5, 10):
        reps = _hierarchical(rng, 2000, n_seeds, 32, seed_sd, unit_sd)
        ests = [stats.seed_estimate(list(r)) for r in reps]
        assert all(e.method == stats.T_SEEDS and e.df == n_seeds - 1 for e in ests)
        coverage = np.mean([e.lo <= 0.0 <= e.hi for e in ests])
        assert 0.93 <= coverage <= 0.97, (n_seeds, coverage)


# ----------------------------------------------------------------------------- every verdict for every row type
def _exact_seeds(mean, se, n_seeds=5, n_units=32, seed=0):
    """Synthetic units nested in seeds whose seed means have exactly the given mean and SE (sd / sqrt(S)), so
    `seed_estimate` lands where a verdict rule wants it: random seed offsets and unit noise, standardised."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n_seeds)
    z = (z - z.mean()) / z.std(ddof=1)
    noise = rng.normal(0.0, 0.3, (n_seeds, n_units))
    noise -= noise.mean(axis=1, keepdims=True)
    return [mean + zs * se * math.sqrt(n_seeds) + u for zs, u in zip(z, noise)]


E, M = 0.3, 0.1  # reference effect of the directional rows, margin of the parity rows
# (row, paper's difference mean, SE, room in the paper's sign, expected verdict); at 5 seeds the 95% CI is
# mean -/+ 2.78 SE, the 90% CI mean -/+ 2.13 SE; "sign only" rows have no E
CASES = [
    ("directional", 0.5, 0.05, None, stats.REPRODUCED),           # [0.36, 0.64]: above 0, reaches E
    ("directional", 0.15, 0.02, None, stats.SMALLER),             # [0.09, 0.21]: above 0, short of E
    ("directional", -0.1, 0.1, None, stats.NOT_REPRODUCED),       # [-0.38, 0.18]: holds 0, short of E
    ("directional", -0.5, 0.05, None, stats.OPPOSITE),            # CI on the wrong side
    ("directional", 0.15, 0.1, None, stats.UNDERPOWERED),         # [-0.13, 0.43]: holds 0 and E
    ("directional", 0.2, 0.0, None, stats.NO_VARIANCE),           # every seed at 0.2
    ("directional", 0.5, 0.05, (-1.0, 0.2), stats.SMALLER),       # above 0; the bound caps the size at 0.2 < E
    ("directional", 0.1, 0.1, (-1.0, 0.2), stats.UNTESTABLE),     # holds 0 and the bound caps the size
    ("sign only", -0.1, 0.1, None, stats.INCONCLUSIVE),           # holds 0, no E
    ("sign only", 0.5, 0.05, None, stats.REPRODUCED),
    ("parity", 0.0, 0.01, None, stats.REPRODUCED),                # 90% CI +-0.02 inside +-M
    ("parity", 0.07, 0.01, None, stats.REPRODUCED),               # 95% CI [0.042, 0.098] misses 0: still parity
    ("parity", 0.3, 0.02, None, stats.NOT_REPRODUCED),            # the 95% CI lies wholly above M
    ("parity", 0.0, 0.05, None, stats.INCONCLUSIVE),              # neither
    ("parity", 0.0, 0.0, None, stats.NO_VARIANCE),                # every seed at 0 (e.g. both arms solve nothing)
    ("parity", 0.0, 0.01, (-0.05, 0.08), stats.UNTESTABLE),       # the bound forces |d| <= 0.08 < M
]
PARITY_VERDICTS = {stats.REPRODUCED, stats.NOT_REPRODUCED, stats.INCONCLUSIVE, stats.NO_VARIANCE, stats.UNTESTABLE}


@pytest.mark.parametrize("direction", [+1, -1, 0])
def test_every_row_type_reaches_every_verdict(direction):
    """Seed-level data (5 seeds of 32 units) landing on each branch: a directional row reaches all eight
    verdicts, a parity row its five (it has no size and no opposite side)."""
    reached = set()
    for i, (row, mean, se, room, want) in enumerate(CASES):
        if (row == "parity") != (direction == 0):
            continue
        sign = direction or 1  # the measured difference carries the paper's sign
        est = stats.seed_estimate(_exact_seeds(sign * mean, se, seed=i))
        assert est.method == stats.T_SEEDS and est.n_seeds == 5
        assert est.mean == pytest.approx(sign * mean) and est.se == pytest.approx(se, abs=1e-12)
        room_d = None if room is None else tuple(sorted((sign * room[0], sign * room[1])))
        if direction == 0:
            verdict, reason = stats.decide(est, 0, margin=M, room=room_d)
        else:
            verdict, reason = stats.decide(est, direction, effect=E if row == "directional" else None, room=room_d)
        assert verdict == want, (row, direction, mean, se, room, verdict, reason)
        reached.add(verdict)
    # every verdict but the recipe's, which only `decide(recipe=...)` gives (tests/test_recipe.py)
    assert reached == (PARITY_VERDICTS if direction == 0 else set(stats.VERDICTS) - {stats.RECIPE})


def test_room_reasons_in_the_difference_scale():
    est = stats.seed_estimate(_exact_seeds(0.5, 0.05))  # reproduced without a bound
    verdict, reason = stats.decide(est, +1, effect=0.04, room=(-0.05, 0.02), scale=100)
    assert verdict == stats.SMALLER
    assert reason == ("the 95% CI lies on the paper's side of 0; the bound allows at most 2 on the paper's side, "
                      "less than E = 4, so the size cannot be tested")
    assert stats.decide(est, +1, effect=0.3, room=(-1.0, 0.3))[0] == stats.REPRODUCED  # room == E is enough
    assert stats.decide(est, +1, room=(-1.0, 0.01))[0] == stats.REPRODUCED  # no E: the room blocks nothing
    par = stats.seed_estimate(_exact_seeds(0.3, 0.02))
    verdict, reason = stats.decide(par, 0, margin=0.1, room=(-0.05, 0.08), scale=100)
    assert verdict == stats.UNTESTABLE and reason == ("the bound allows at most 8 either side of 0, less than the "
                                                      "margin 10: equivalence is forced by the bound")


def test_paper_side_room():
    assert stats.paper_side_room((-0.3, 0.1), +1) == 0.1
    assert stats.paper_side_room((-0.3, 0.1), -1) == 0.3
    assert stats.paper_side_room((-0.3, 0.1), 0) == 0.3
    assert stats.paper_side_room((-0.05, 0.4), 0) == 0.4
    assert stats.paper_side_room((0.02, 0.4), -1) == -0.02  # the bound allows nothing on the paper's side
    with pytest.raises(ValueError, match="direction"):
        stats.paper_side_room((0.0, 1.0), 2)
    with pytest.raises(ValueError, match="room"):
        stats.paper_side_room((float("nan"), 1.0), 1)


def test_seeds_for_sd_is_the_smallest_s_whose_mde_reaches_e():
    sd = 0.1 * math.sqrt(5)
    needed = [stats.seeds_for_sd(sd, e) for e in (0.1, 0.2, 0.3, 0.5, 1.0)]
    assert all(a >= b for a, b in zip(needed, needed[1:])) and needed[0] > needed[-1] >= 2
    for e, s in zip((0.1, 0.2, 0.3, 0.5, 1.0), needed):
        assert stats.mde(sd / math.sqrt(s), df=s - 1) <= e + 1e-12
        if s > 2:
            assert stats.mde(sd / math.sqrt(s - 1), df=s - 2) > e
    assert stats.seeds_for_sd(sd, -0.3) == stats.seeds_for_sd(sd, 0.3)  # E is a magnitude
    assert stats.seeds_for_sd(sd, 1e-3) is None  # about 3.9e5 seeds, beyond max_seeds
    assert 3.8e5 < stats.seeds_for_sd(sd, 1e-3, max_seeds=10 ** 6) < 4e5
    assert stats.seeds_for_sd(0.0, 0.3) == 2  # no variance at all


def test_sd_interval_is_the_chi_square_interval():
    """At 3 seeds the per-seed sd's 95% interval is [0.52 sd, 6.29 sd] (chi-square with 2 df): an sd of 5.3
    points reads [2.8, 33.3], the range behind "about 5 seeds"."""
    est = stats.Estimate(0.0, -1, 1, -1, 1, 5.3 / math.sqrt(3), 1.0, 2.0, 3, 3, stats.T_SEEDS)
    lo, hi = stats.sd_interval(est)
    assert lo == pytest.approx(5.3 * math.sqrt(2 / sps.chi2.ppf(0.975, 2))) and lo == pytest.approx(2.76, abs=0.01)
    assert hi == pytest.approx(5.3 * math.sqrt(2 / sps.chi2.ppf(0.025, 2))) and hi == pytest.approx(33.3, abs=0.1)
    assert stats.sd_interval(stats.t_interval([1.0])) is None and stats.sd_interval(None) is None


def test_seeds_needed_is_a_range_from_the_sd_interval():
    est = stats.seed_estimate(_exact_seeds(0.15, 0.1))  # 5 seeds, per-seed sd 0.1 * sqrt(5)
    assert stats.decide(est, +1, effect=0.3)[0] == stats.UNDERPOWERED
    sd_lo, sd_hi = stats.sd_interval(est)
    few, many = stats.seeds_needed(est, 0.3)
    assert (few, many) == (stats.seeds_for_sd(sd_lo, 0.3), stats.seeds_for_sd(sd_hi, 0.3))
    point = stats.seeds_for_sd(0.1 * math.sqrt(5), 0.3)
    assert few < point < many and many > 5 * few  # 5 seeds leave the sd uncertain by a factor of 4.8
    assert stats.seeds_needed(est, -0.3) == (few, many)
    assert stats.seeds_needed(est, 0.01) == (stats.seeds_for_sd(sd_lo, 0.01), None)  # the far end is over 1000
    assert stats.seeds_needed(est, 1e-4) == (None, None)
    assert stats.seeds_needed(est, None) is None and stats.seeds_needed(None, 0.3) is None
    assert stats.seeds_needed(stats.t_interval([1.0]), 0.3) is None


@pytest.mark.parametrize("effect, sd, n, e", [(11.0, 3.3, 5, 10.0), (11.0, 6.0, 3, 10.0), (5.0, 6.0, 5, 10.0),
                                              (-2.0, 4.0, 4, 7.5)])
def test_p_reproduced_is_the_rule_simulated(effect, sd, n, e):
    """P("reproduced") from the closed form against the rule itself (`decide`) on simulated seed values."""
    rng = np.random.default_rng(7)
    hits = [stats.decide(stats.t_interval(rng.normal(effect, sd, n)), +1, e)[0] == stats.REPRODUCED
            for _ in range(3000)]
    assert stats.p_reproduced(effect, sd, n, e) == pytest.approx(np.mean(hits), abs=0.025)
    with pytest.raises(ValueError, match="n_seeds >= 2 and sd > 0"):
        stats.p_reproduced(effect, 0.0, n, e)
