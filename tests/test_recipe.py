"""jaxagent.eval.recipe and the recipe verdict: each check turns a row that the data would decide into "untestable
here (recipe)", and a row just across each check's boundary stays decided by the data."""
import math

import pytest
from scipy import stats as sps

from jaxagent.eval import findings as F
from jaxagent.eval import recipe, stats
from jaxagent.study.host import dynamics as host_dynamics, likelihood as host_likelihood, metrics as host_metrics

BY_KEY = {f.key: f for f in F.DEFAULT_FINDINGS}


def _est(lo, hi, n=5):
    mean, half = (lo + hi) / 2, (hi - lo) / 2
    se = half / float(sps.t.ppf(0.975, n - 1))
    h90 = float(sps.t.ppf(0.95, n - 1)) * se
    return stats.Estimate(mean, lo, hi, mean - h90, mean + h90, se, 3 * se, n - 1, n, 64 * n, stats.T_SEEDS)


def _metrics(f, lo, hi, **extra):
    e = _est(lo, hi)
    m = {f"{f.diff}.{k}": v for k, v in e.as_dict().items()}
    m.update(extra)
    return m


# ----------------------------------------------------------------------------- stats.decide(recipe=...)
def test_a_recipe_reason_overrides_every_data_verdict():
    est = _est(0.02, 0.20)  # reproduced on its own
    assert stats.decide(est, +1, 0.1)[0] == stats.REPRODUCED
    assert stats.decide(est, +1, 0.1, recipe="the KL budget") == (stats.RECIPE, "the KL budget")
    assert stats.decide(None, +1, 0.1, recipe="why")[0] == stats.RECIPE  # even without an estimate
    assert stats.decide(est, +1, 0.1, recipe="")[0] == stats.REPRODUCED  # an empty reason is no reason
    assert stats.RECIPE in stats.VERDICTS and "untestable here (recipe)" in stats.VERDICT_RULE
    with pytest.raises(ValueError, match="margin"):  # argument errors still come first
        stats.decide(est, 0, None, None, recipe="why")


# ----------------------------------------------------------------------------- parity: each arm moved >= m
def test_parity_moves_boundary():
    assert recipe.parity_moves({"grpo": 0.06, "gigpo": 0.05}, 0.05) is None  # both at least m: decided
    why = recipe.parity_moves({"grpo": 0.004, "gigpo": 0.015}, 0.05, 100.0)  # bfcl-toy's moves
    assert why is not None and "grpo +0.4 points, gigpo +1.5 points" in why and "±5 points" in why
    assert recipe.parity_moves({"grpo": 0.2, "gigpo": -0.049}, 0.05) is not None  # one arm short is enough
    assert recipe.parity_moves({"grpo": 0.2, "gigpo": -0.05}, 0.05) is None  # a fall of m is a move too
    assert recipe.parity_moves({"grpo": math.nan, "gigpo": 0.0}, 0.05) is None  # unknown: left to the data
    with pytest.raises(ValueError, match="margin"):
        recipe.parity_moves({"a": 0.1}, 0.0)


def test_frozenlake_budgetmix_parity_row_needs_both_arms_to_move():
    f = BY_KEY["f8_budgetmix_t100"]  # margin 4 points
    inside = dict(lo=-0.01, hi=0.01)  # equivalent on its own
    m = _metrics(f, **inside, **{f"{f.key}.moved.grpo": 0.10, f"{f.key}.moved.budgetmix": 0.04})
    assert F.finding_verdict(f, m)[0] == stats.REPRODUCED
    m[f"{f.key}.moved.budgetmix"] = 0.039
    v, why = F.finding_verdict(f, m)
    assert v == stats.RECIPE and "budgetmix +3.9" in why
    del m[f"{f.key}.moved.budgetmix"]  # a run without the moves: judged as before
    assert F.finding_verdict(f, m)[0] == stats.REPRODUCED


def test_host_gigpo_parity_reads_the_moves_from_the_pass_table_on_the_solvable_tasks():
    f7 = next(f for f in host_metrics.domain_findings("bfcl", "BFCL") if f.key == "bfcl.f7_gigpo")
    # all-task moves +1.0 and +1.5 points at T=2 with 25% of tasks solvable: +4 and +6 on the row's tasks
    m = _metrics(f7, -0.01, 0.01, **{"bfcl.f7_gigpo.tier_turns": 2.0, "bfcl.bound.t2": 0.25,
                                     "bfcl.pass.base.t2.k1": 0.10, "bfcl.pass.grpo.t2.k1": 0.11,
                                     "bfcl.pass.gigpo.t2.k1": 0.115})
    v, why = F.finding_verdict(f7, m)
    assert v == stats.RECIPE and "grpo +4 points, gigpo +6 points" in why
    m["bfcl.pass.grpo.t2.k1"] = 0.113  # +5.2 on the solvable tasks: both moved the margin
    assert F.finding_verdict(f7, m)[0] == stats.REPRODUCED


# ----------------------------------------------------------------------------- designed errors
def test_designed_tilt_boundary():
    assert recipe.designed_tilt(0.097, 0.097, "slips") is not None
    assert recipe.designed_tilt(0.09, 0.097, "slips") is None
    assert recipe.designed_tilt(math.nan, 0.097, "slips") is None
    assert "probability 0.5" in recipe.designed_tilt(0.5, -0.097, "the base's first submission slips")


def test_code_r_single_is_untestable_when_the_base_slips_by_design():
    f = next(f for f in host_dynamics.finding("code", "Coding") if f.key == "code.f6_r_single")
    m = _metrics(f, 0.016, 0.070)  # code-toy's measured +0.043, "not reproduced (opposite)" on its own
    assert F.finding_verdict(f, m)[0] == stats.OPPOSITE
    m["code.recipe.base_slip_rate"] = 0.5
    v, why = F.finding_verdict(f, m)
    assert v == stats.RECIPE and "first submission slips with probability 0.5" in why
    m["code.recipe.base_slip_rate"] = 0.09  # below E = 0.097: the slips cannot cancel the paper's fall
    assert F.finding_verdict(f, m)[0] == stats.OPPOSITE
    r_multi = next(f for f in host_dynamics.finding("code", "Coding") if f.key == "code.f6_r_multi")
    assert r_multi.recipe is None


def test_host_shrink_is_untestable_only_for_a_recovering_expert():
    f2 = next(f for f in host_metrics.domain_findings("sql", "SQL") if f.key == "sql.f2_shrink")
    m = _metrics(f2, 0.011, 0.063, **{"sql.recipe.base_slip_rate": 0.5, "sql.recipe.recovering_expert": 0.0})
    assert F.finding_verdict(f2, m)[0] == stats.OPPOSITE
    m["sql.recipe.recovering_expert"] = 1.0
    assert F.finding_verdict(f2, m)[0] == stats.RECIPE


# ----------------------------------------------------------------------------- LLR rows
@pytest.mark.parametrize("key", ["f5_llr_rl", "f5_matched_frozenlake"])
def test_frozenlake_llr_rows_are_reported_not_judged(key):
    f = BY_KEY[key]
    v, why = F.finding_verdict(f, _metrics(f, -0.8, -0.3))  # RL under 1 nat above base: read "opposite" before
    assert v == stats.RECIPE and why == recipe.LLR_SCALE_REASON
    assert BY_KEY["f5_nll"].recipe is None  # the per-action NLL row stays judged


def test_host_llr_rows_are_reported_not_judged():
    fs = {f.key: f for f in host_likelihood.findings("bfcl", "BFCL")}
    assert fs["bfcl.f5_llr_rl"].recipe is recipe.llr_check and fs["bfcl.f5_matched"].recipe is recipe.llr_check
    assert fs["bfcl.f5_nll"].recipe is None
