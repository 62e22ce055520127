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


def test_seed_estimate_picks_the_method_by_number_of_seeds():
    rng = np.random.default_rng(0)
    three = _seeds(rng, 3, 20, 0.2, 0.1, 0.3)
    est = stats.seed_estimate(three)
    want = stats.t_interval([u.mean() for u in three])
    assert est.method == stats.T_SEEDS and est.n_units == 60
    assert (est.mean, est.lo, est.hi) == pytest.approx((want.mean, want.lo, want.hi))
    six = _seeds(rng, 6, 20, 0.2, 0.1, 0.3)
    boot = stats.seed_estimate(six, n_boot=300)
    assert boot.method == stats.BOOTSTRAP and boot.df == math.inf
    assert boot.mean == pytest.approx(np.mean([u.mean() for u in six]))
    single = stats.seed_estimate([np.ones(50)])
    assert single.method == stats.NOT_AVAILABLE and "one seed" in single.reason
    # a seed without units is dropped, not counted
    assert stats.seed_estimate(three + [np.zeros(0)]).n_seeds == 3
    assert stats.seed_estimate([]).reason == "no seed with data"


def test_cluster_bootstrap_sees_between_seed_variance():
    """Seed offsets dominate: the cluster SE follows sd(seed means)/sqrt(S), not the pooled-units SE."""
    rng = np.random.default_rng(1)
    units = _seeds(rng, 8, 200, 0.0, 1.0, 0.1)
    est = stats.cluster_bootstrap(units, n_boot=1000, rng_seed=3)
    between = np.std([u.mean() for u in units], ddof=1) / math.sqrt(8)
    pooled = np.concatenate(units)
    naive = pooled.std(ddof=1) / math.sqrt(pooled.size)
    assert 0.7 * between < est.se < 1.3 * between
    assert est.se > 10 * naive
    assert est.mde == pytest.approx(stats.mde(est.se))
    assert est.lo < est.mean < est.hi and est.lo < est.lo90 < est.hi90 < est.hi


def test_tuple_entries_resample_each_sample_within_the_seed():
    rng = np.random.default_rng(2)
    entries = [(rng.normal(1.0 + o, 0.2, 30), rng.normal(o, 0.2, 40)) for o in rng.normal(0, 2.0, 6)]
    est = stats.seed_estimate(entries, stats.mean_difference, n_boot=400)
    assert est.mean == pytest.approx(np.mean([a.mean() - b.mean() for a, b in entries]))
    assert est.lo < 1.0 < est.hi and est.hi - est.lo < 0.5  # the shared seed offset cancels in the difference
    assert est.n_units == 6 * 70


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
    # a true effect of known size (0.3) with 8 seeds is detected
    est = stats.seed_estimate(_seeds(rng, 8, 50, 0.3, 0.05, 0.2), n_boot=500)
    assert stats.decide(est, +1, effect=0.3)[0] == stats.REPRODUCED
    assert stats.decide(est, -1, effect=0.3)[0] == stats.NOT_REPRODUCED  # opposite to the paper's sign
    # a null effect with enough power (MDE << E) is not reproduced
    null = stats.seed_estimate(_seeds(rng, 8, 50, 0.0, 0.01, 0.05), n_boot=500)
    assert null.lo < 0 < null.hi and null.mde < 0.3
    verdict, reason = stats.decide(null, +1, effect=0.3)
    assert verdict == stats.NOT_REPRODUCED and "excludes E" in reason
    # low power (few seeds, large noise): underpowered
    weak = stats.seed_estimate(_seeds(rng, 3, 5, 0.05, 0.5, 1.0))
    assert weak.mde > 0.3 and stats.decide(weak, +1, effect=0.3)[0] == stats.UNDERPOWERED
    # parity with a true zero and enough data: TOST equivalent -> reproduced
    par = stats.seed_estimate(_seeds(rng, 8, 100, 0.0, 0.005, 0.02), n_boot=500)
    assert stats.tost(par, 0.04)
    assert stats.decide(par, 0, margin=0.04)[0] == stats.REPRODUCED
    # ... with little data: the CI contains 0 but that is not parity
    par_weak = stats.seed_estimate(_seeds(rng, 3, 5, 0.0, 0.2, 0.5))
    assert par_weak.lo < 0 < par_weak.hi and not stats.tost(par_weak, 0.04)
    assert stats.decide(par_weak, 0, margin=0.04)[0] == stats.UNDERPOWERED
    # a real difference where the paper reports parity
    diff = stats.seed_estimate(_seeds(rng, 8, 100, 0.2, 0.005, 0.02), n_boot=500)
    assert stats.decide(diff, 0, margin=0.04)[0] == stats.NOT_REPRODUCED


def test_decide_hand_intervals_and_errors():
    def est(mean, lo, hi, mde, lo90=None, hi90=None):
        return stats.Estimate(mean, lo, hi, lo if lo90 is None else lo90, hi if hi90 is None else hi90, 1.0, mde,
                              4.0, 5, 50, stats.T_SEEDS)
    assert stats.decide(est(0.1, -0.1, 0.3, 0.2), +1, effect=0.5)[0] == stats.NOT_REPRODUCED
    assert stats.decide(est(0.1, -0.1, 0.6, 0.4), +1, effect=0.5)[0] == stats.INCONCLUSIVE  # holds 0 and E
    assert stats.decide(est(0.1, -0.1, 0.6, 0.6), +1, effect=0.5)[0] == stats.UNDERPOWERED
    assert stats.decide(est(0.1, -0.1, 0.6, 0.4), +1, effect=None)[0] == stats.INCONCLUSIVE
    assert stats.decide(est(-0.3, -0.5, -0.1, 0.4), -1, effect=0.5)[0] == stats.REPRODUCED
    assert stats.decide(est(0.0, -0.1, 0.1, 0.03, -0.05, 0.05), 0, margin=0.04)[0] == stats.INCONCLUSIVE
    assert stats.decide(est(0.0, -0.1, 0.1, 0.2, -0.05, 0.05), 0, margin=0.04)[0] == stats.UNDERPOWERED
    assert stats.decide(None, +1, effect=0.1) == (stats.INCONCLUSIVE, "no interval (no estimate)")
    assert stats.decide(stats.t_interval([1.0]), +1, effect=0.1)[0] == stats.INCONCLUSIVE
    with pytest.raises(ValueError, match="direction"):
        stats.decide(est(0, -1, 1, 1), 2)
    with pytest.raises(ValueError, match="margin"):
        stats.decide(est(0, -1, 1, 1), 0)
    with pytest.raises(ValueError, match="at least one unit"):
        stats.cluster_bootstrap([np.zeros(0)])


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
    # the collapse: 0.98 -> 0.16 -> 0.0
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


def test_zero_width_interval_decides_nothing():
    """Both policies at a ceiling (every seed and unit the same difference): no verdict either way."""
    est = stats.seed_estimate([np.zeros(16), np.zeros(16), np.zeros(16)])
    assert est.available and est.se == 0 and est.lo == est.hi == 0
    for direction, margin in ((1, None), (-1, None), (0, 0.04)):
        verdict, reason = stats.decide(est, direction, effect=0.1, margin=margin)
        assert verdict == stats.INCONCLUSIVE and "no variation" in reason
