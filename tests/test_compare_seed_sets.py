"""jaxagent.study.frozenlake.seed_sets: one row per measured finding (DEFAULT_FINDINGS order, real tier in the title),
cells "value [CI] **verdict** (why)", verdicts from the same rule as the report."""
import json

import pytest

from jaxagent.study.frozenlake import seed_sets
from jaxagent.eval import findings, stats

findings_by_key = {f.key: f for f in findings.DEFAULT_FINDINGS}


def _est(mean, lo, hi, mde, n=5):
    """A t-interval estimate as metrics.json holds it (se from the CI's half width, t with n - 1 df)."""
    half = (hi - lo) / 2
    return {"mean": mean, "lo": lo, "hi": hi, "lo90": mean - 0.8 * half, "hi90": mean + 0.8 * half,
            "se": half / 2.776, "mde": mde, "df": n - 1, "n_seeds": n, "method": stats.T_SEEDS}


def _run(tmp_path, name, pass1, breadth, t25, t25_turns):
    d = tmp_path / name
    d.mkdir()
    metrics = {"meta": {"t_max": 8},
               "f1_pass1": {"diff": pass1, "room_lo": -0.3, "room_hi": 0.6},
               "f1_breadth": {"diff": breadth},
               "f8_budgetmix_t25": {"diff": t25, "tier_turns": t25_turns, "room_lo": -0.2, "room_hi": 0.3}}
    (d / "metrics.json").write_text(json.dumps(metrics))
    return str(d)


def test_table_rows_cells_and_agreement(tmp_path):
    a = _run(tmp_path, "standard", _est(0.20, 0.17, 0.23, 0.03), _est(0.14, 0.10, 0.19, 0.05),
             _est(0.03, -0.05, 0.11, 0.20), 2)
    b = _run(tmp_path, "standard-s5", _est(0.18, 0.12, 0.24, 0.05), _est(0.02, -0.03, 0.07, 0.05),
             _est(0.04, -0.06, 0.12, 0.22), 2)
    lines = seed_sets.table([a, b]).splitlines()
    assert lines[0].endswith("| pooled, blocked by set | same verdict | primary row |") and "`standard-s5`" in lines[0]
    assert len(lines) == 5  # header, rule, f1_pass1, f1_breadth, f8 at 25%
    titles = {f.key: f.title for f in findings.DEFAULT_FINDINGS}
    # DEFAULT_FINDINGS order: the headline first
    assert lines[2].startswith(f"| {titles['f1_pass1']} (RL - base (points)) |")
    assert ("+20.0 [17.0, 23.0] **reproduced** (the 95% CI lies on the paper's side of 0 and reaches E = 10) | "
            "+18.0 [12.0, 24.0] **reproduced** (the 95% CI lies on the paper's side of 0 and reaches E = 10) | "
            "+19.0 [") in lines[2]
    assert lines[2].endswith("| yes | confirmed: reproduced |")
    # f1 breadth: reproduced in one, CI holding 0 and ending below E = 10 points in the other
    assert "+14.0 [10.0, 19.0] **reproduced**" in lines[3] and "+2.0 [-3.0, 7.0] **not reproduced**" in lines[3]
    assert lines[3].endswith("| **no** | **not confirmed** (sets differ) |")
    # f8 at 25%: the real tier in the title, underpowered with the seeds that would decide it
    assert "8. BudgetMix vs full-budget RL at 25% of T_max (T=2 of 8)" in lines[4]
    assert lines[4].count("**underpowered**") == 3  # both sets and the pooled line
    assert lines[4].endswith("| yes | both sets: underpowered |")
    for run in (a, b):  # the range of seeds from the sd's interval, as the report prints it
        m = seed_sets.load_run(run)
        few, many = findings.seeds_to_decide(findings_by_key["f8_budgetmix_t25"], m)
        assert few < many and f"; about {few}-{many} seeds would decide it)" in lines[4]
    assert "| yes | " in lines[4]


def test_a_row_the_bound_limits_keeps_its_sign_and_opposite_is_its_own_verdict(tmp_path):
    above, holds = _est(0.03, 0.01, 0.05, 0.02), _est(0.02, -0.01, 0.05, 0.02)
    a, b = _run(tmp_path, "a", above, above, above, 3), _run(tmp_path, "b", above, holds, holds, 3)
    for d in (a, b):
        m = json.loads((tmp_path / d / "metrics.json").read_text())
        m["f8_budgetmix_t25"]["room_hi"] = 0.05  # at most 5 points on the paper's side, E = 7.5
        (tmp_path / d / "metrics.json").write_text(json.dumps(m))
    lines = seed_sets.table([a, b]).splitlines()
    row = lines[4]
    assert (f"+3.0 [1.0, 5.0] **{stats.SMALLER}** (the 95% CI lies on the paper's side of 0; the bound allows at "
            "most 5 on the paper's side, less than E = 7.5, so the size cannot be tested)") in row
    assert f"+2.0 [-1.0, 5.0] **{stats.UNTESTABLE}** (the 95% CI holds 0 and the bound allows at most 5" in row
    assert "(T=3 of 8: 38% of T_max, not the nominal 25%)" in row and row.endswith("| **no** | **not confirmed** (sets differ) |")
    # a CI on the opposite side is "not reproduced (opposite)", a different verdict from a CI holding 0
    c = _run(tmp_path, "c", above, _est(-0.05, -0.08, -0.02, 0.02), above, 2)
    d = _run(tmp_path, "d", above, _est(0.01, -0.02, 0.04, 0.02), above, 2)
    breadth = seed_sets.table([c, d]).splitlines()[3]
    assert ("-5.0 [-8.0, -2.0] **not reproduced (opposite)** (the 95% CI lies on the opposite side of 0)"
            in breadth)
    assert "+1.0 [-2.0, 4.0] **not reproduced** (the 95% CI holds 0" in breadth and "| **no** |" in breadth


def test_missing_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the eval stage"):
        seed_sets.table([str(tmp_path)])


def test_pooled_line_is_the_blocked_estimate_and_confirms_only_agreeing_sets(tmp_path):
    # set b sits 6 points above set a with the same spread: the pooled interval is the within-set one, centred
    # between them, not widened by the offset
    a = _run(tmp_path, "a", _est(0.10, 0.04, 0.16, 0.08), _est(0.10, 0.04, 0.16, 0.08), _est(0.0, -0.1, 0.1, 0.1), 2)
    b = _run(tmp_path, "b", _est(0.16, 0.10, 0.22, 0.08), _est(0.16, 0.10, 0.22, 0.08), _est(0.0, -0.1, 0.1, 0.1), 2)
    runs = [seed_sets.load_run(d) for d in (a, b)]
    f = findings_by_key["f1_pass1"]
    ests = [findings.estimate_from_metrics(m, f.diff) for m in runs]
    want = stats.pool_blocked(ests)
    assert want.mean == pytest.approx(0.13) and want.df == 8 and want.n_seeds == 10
    assert want.se == pytest.approx(ests[0].se * (5 ** 0.5) / (10 ** 0.5))  # same sd in both sets
    pooled = seed_sets.pooled_metrics(runs, f)
    assert pooled["f1_pass1.room_hi"] == pytest.approx(0.6) and pooled[f"{f.diff}.method"] == stats.POOLED
    row = seed_sets.table([a, b]).splitlines()[2]
    assert f"+13.0 [{100 * want.lo:.1f}, {100 * want.hi:.1f}] **reproduced**" in row
    assert row.endswith("| yes | confirmed: reproduced |")
    # a secondary row is never "confirmed"; one set alone cannot confirm a primary row
    assert findings_by_key["f3_step_frozenlake"].primary is False
    assert seed_sets.confirmation(findings_by_key["f3_step_frozenlake"], ["reproduced"] * 2, "reproduced") == "secondary"
    assert seed_sets.confirmation(f, ["reproduced"], None) == "primary: needs a second seed set"
    # sets that agree with each other but not with the pooled verdict do not confirm it
    assert seed_sets.confirmation(f, [stats.UNDERPOWERED] * 2, stats.REPRODUCED).startswith("**not confirmed**")
    assert seed_sets.confirmation(f, [stats.SMALLER] * 2, stats.SMALLER) == f"confirmed: {stats.SMALLER}"


def test_pool_blocked_matches_a_direct_within_set_computation():
    import numpy as np
    rng = np.random.default_rng(0)
    sets = [rng.normal(0.1, 0.05, 5), rng.normal(0.3, 0.05, 4) ]
    ests = [stats.t_interval(x) for x in sets]
    got = stats.pool_blocked(ests)
    resid = np.concatenate([x - x.mean() for x in sets])
    s2 = (resid ** 2).sum() / (9 - 2)
    se = np.sqrt(s2 / 9)
    from scipy import stats as sps
    assert got.mean == pytest.approx(np.concatenate(sets).mean())
    assert got.se == pytest.approx(se) and got.df == 7
    assert got.lo == pytest.approx(got.mean - sps.t.ppf(0.975, 7) * se)
    assert got.lo90 == pytest.approx(got.mean - sps.t.ppf(0.95, 7) * se)
    # fewer than two sets with an interval: n/a with the reason
    one = stats.pool_blocked([ests[0], stats.t_interval([0.1])])
    assert not one.available and "pooling needs >= 2" in one.reason


def test_sets_on_the_papers_side_that_differ_in_size_confirm_the_direction_and_say_the_sets_differ(tmp_path):
    # the quick pattern: both sets well above 0, one reaching E = 10 and one short of it, their means apart by
    # more than their seeds' spread
    a = _run(tmp_path, "a", _est(0.133, 0.113, 0.152, 0.03), _est(0.05, 0.04, 0.06, 0.02), _est(0.0, -0.1, 0.1, 0.1), 2)
    b = _run(tmp_path, "b", _est(0.080, 0.067, 0.094, 0.02), _est(0.05, 0.04, 0.06, 0.02), _est(0.0, -0.1, 0.1, 0.1), 2)
    lines = seed_sets.table([a, b]).splitlines()
    assert lines[2].endswith("| **no** | confirmed in direction; the size differs between sets |")
    assert "the sets differ beyond their seeds' spread (F test p = " in lines[2]
    assert "differ beyond" not in lines[3] and lines[3].endswith(f"| yes | confirmed: {stats.SMALLER} |")


def test_between_sets_p_is_the_one_way_f_test():
    import numpy as np
    from scipy import stats as sps
    rng = np.random.default_rng(3)
    sets = [rng.normal(0.10, 0.02, 5), rng.normal(0.13, 0.02, 5), rng.normal(0.11, 0.03, 4)]
    got = stats.between_sets_p([stats.t_interval(x) for x in sets])
    assert got == pytest.approx(sps.f_oneway(*sets).pvalue, rel=1e-9)
    assert np.isnan(stats.between_sets_p([stats.t_interval(sets[0])]))
