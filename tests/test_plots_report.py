"""Tests of jaxagent.eval.plots (PNG files) and jaxagent.eval.report (verdict rule, sourced numbers)."""
import dataclasses
import json
import math
import re
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.eval import plots, report, stats
from jaxagent.eval import findings as findings_lib
from jaxagent.eval.passk import CI

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    data = open(path, "rb").read()
    return data[:8] == PNG_MAGIC and len(data) > 2000


@pytest.fixture(scope="module")
def figure_paths(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "figs"
    budgets, ks = [2, 4, 6, 8], [1, 2, 4, 8]
    grid = np.linspace(0.1, 0.9, 16).reshape(4, 4)
    edges = np.linspace(0, 1, 5)
    return {
        "pass_kt_heatmap": plots.pass_kt_heatmap(grid, budgets, ks, out / "heatmap.png"),
        "pass_at_t": plots.pass_at_t_curves(budgets, {"base": grid[:, 3], "RL": grid[:, 3] * 0.9}, out / "pass_t.png",
                                            bound_U=np.minimum(grid[:, 3] + 0.1, 1.0),
                                            bands={"base": (grid[:, 3] - 0.05, grid[:, 3] + 0.05)}),
        "pass_at_k": plots.pass_at_k_curves(ks, {"base": grid[3], "RL": grid[3] * 1.05}, out / "pass_k.png", budget=8),
        "step_quality_depth": plots.step_quality_by_depth(edges, [0.3, 0.4, np.nan, 0.6], [0.2, 0.2, np.nan, 0.1],
                                                          [0.5, 0.4, np.nan, 0.3], [0.5, 0.4, np.nan, 0.2],
                                                          [0.45, 0.42, np.nan, 0.3], out / "depth.png"),
        "nll_hist": plots.likelihood_histograms({"RL actions": np.random.default_rng(0).normal(12, 3, 200),
                                                 "base actions": np.random.default_rng(1).normal(10, 3, 200)},
                                                out / "nll.png"),
        "dynamics": plots.training_dynamics([0, 10, 20], [0.2, 0.35, 0.53], [0.6, 0.55, 0.5], out / "dyn.png"),
        "dynamics_seeds": plots.training_dynamics_seeds(
            {"seed 0": ([-1, 0, 2], [np.nan, 0.2, 0.4], [0.6, 0.55, 0.5]),
             "seed 1": ([-1, 0, 2], [np.nan, 0.3, 0.2], [0.6, 0.6, 0.58])}, out / "dyn_seeds.png"),
        "learning_grpo": plots.learning_curves(
            {"seed 0 (healthy)": {"iteration": np.arange(4), "success_rate": [0.2, 0.3, 0.4, 0.5],
                                  "valid_action_rate": [0.97, 0.98, 0.99, 1.0], "kl": [0, 0.01, 0.02, 0.02],
                                  "kl_exact": [0, 0.02, 0.03, 0.03],
                                  "entropy": [1.2, 1.1, 1.0, 0.9]},
             "seed 2 (collapsed)": {"iteration": np.arange(4), "success_rate": [0.2, 0.0, 0.0, 0.0],
                                    "valid_action_rate": [0.98, 0.16, 0.0, 0.0]}},
            out / "learning_grpo.png", title="grpo", styles={"seed 2 (collapsed)": ":"}),
    }


def test_plots_write_nonempty_pngs(figure_paths):
    for name, path in figure_paths.items():
        assert _is_png(path), name
    with pytest.raises(ValueError, match="does not match"):
        plots.pass_kt_heatmap(np.zeros((2, 3)), [1, 2], [1, 2], "unused.png")
    with pytest.raises(ValueError, match="finite"):
        plots.likelihood_histograms({"a": [np.nan]}, "unused.png")
    with pytest.raises(ValueError, match="no seed logged"):
        plots.learning_curves({"seed 0": {"loss": [1.0]}}, "unused.png")
    with pytest.raises(ValueError, match="at least one seed"):
        plots.training_dynamics_seeds({}, "unused.png")


def test_paper_figures_and_default_findings_are_consistent():
    figs = findings_lib.PAPER_FIGURES
    assert figs["f2_frozenlake_t25_base"]["value"] == 30.3 and figs["f2_frozenlake_t25_grpo"]["value"] == 28.7
    assert figs["f3_frozenlake_rl_better"]["value"] == 42.8 and figs["f5_matched_bfcl_diff"]["value"] == 805.8
    assert figs["f6_r_single_delta"]["value"] == -0.097 and figs["f8_gain_t25"]["value"] == 7.5
    assert (figs["f8_gain_t25_model_a"]["value"] + figs["f8_gain_t25_model_b"]["value"]) / 2 == pytest.approx(7.475)
    assert all(set(v) >= {"value", "description", "unit"} and v["description"] for v in figs.values())
    for f in findings_lib.DEFAULT_FINDINGS:
        paper_keys = [r.paper for r in f.rows if r.paper] + ([f.diff_paper] if f.diff_paper else [])
        assert all(k in figs for k in paper_keys), f.key
        by_label = {r.measured.rsplit(".", 1)[1]: r.paper for r in f.rows if r.measured}
        if by_label.get("rl") and by_label.get("base"):  # the paper's pair fixes the direction
            assert np.sign(figs[by_label["rl"]]["value"] - figs[by_label["base"]]["value"]) == f.direction, f.key
        if f.diff_paper:
            assert np.sign(figs[f.diff_paper]["value"]) == f.direction, f.key
        # every finding can be decided: a parity finding states its margin, every other its reference effect
        if f.direction == 0:
            assert f.margin and f.margin > 0 and f.effect_source, f.key
        else:
            assert f.effect and f.effect > 0 and f.effect_source, f.key
    assert len({f.key for f in findings_lib.DEFAULT_FINDINGS}) == len(findings_lib.DEFAULT_FINDINGS)
    by_key = {f.key: f for f in findings_lib.DEFAULT_FINDINGS}
    # f1 and f2 are different contrasts: the gap at the largest K, and its change from full to tight budget
    assert by_key["f1_breadth"].diff != by_key["f2_shrink_frozenlake"].diff
    assert by_key["f2_shrink_frozenlake"].direction == -1
    assert by_key["f8_budgetmix_t25"].effect == pytest.approx(0.075)
    assert by_key["f4_error_frozenlake"].effect == pytest.approx(0.513 - 0.386)


def _est(mean, lo=None, hi=None, mde=None, lo90=None, hi90=None, seeds="grpo seeds 0, 1; none excluded", n=2):
    """A stats.Estimate as metrics.json holds it (t over seeds)."""
    out = {"mean": mean, "seeds": seeds}
    if lo is not None:
        out.update(lo=lo, hi=hi, lo90=lo if lo90 is None else lo90, hi90=hi if hi90 is None else hi90,
                   se=(hi - lo) / 4, mde=mde, df=n - 1, n_seeds=n, n_units=16 * n, method="t over seeds", reason="")
    return out


RUN_METRICS = {
    "meta": {"t_max": 8},
    "f1_pass1": {"base": 0.3, "rl": 0.45, "bound": 0.55, "room_lo": -0.3, "room_hi": 0.25,
                 "diff": _est(0.15, 0.08, 0.22, 0.06)},
    "f1_breadth": {"gap_k1": 0.12, "gap_k2": 0.09, "base": 0.5, "rl": 0.6,
                   "diff": {**_est(0.1, 0.04, 0.16, 0.08, seeds="grpo seeds 0, 1; excluded: 2 (grpo collapsed)"),
                            "all": _est(0.03, -0.2, 0.26, 0.3, seeds="grpo seeds 0, 1, 2", n=3)}},
    "f2_shrink_frozenlake": {"gap_full": 0.2, "gap_tight": 0.05, "solvable_tight": 0.125, "base_tight": 0.3125,
                             "rl_tight": 0.36, "tier_turns": 2, "room_lo": -0.5125, "room_hi": 0.1,
                             "diff": _est(-0.15, -0.25, -0.05, 0.08)},
    "f3_step_frozenlake": {"share_rl_better": 0.4375, "share_rl_worse": 0.375,  # share_equal not measured
                           "mean_q_base": 0.6123, "mean_q_rl": 0.6348, "diff": _est(0.0225, 0.0103, 0.0351, 0.02)},
    "f5_nll": {"base": 10.714, "rl": 10.9, "diff": _est(0.186, -0.137, 0.512, 0.45)},
    "f5_matched_bfcl": {"n_pairs": 57, "n_tasks": 23, "diff": {"mean": 612.3, "lo": 301.9, "hi": 907.4}},  # CI only
    "f6_r_multi": {"first": 0.21, "last": 0.5, "diff": {"mean": 0.29}},  # no CI measured
    "f8_budgetmix_t25": {"base": 0.3, "rl": 0.31, "tier_turns": 2, "room_lo": -0.3, "room_hi": 0.4,
                         "diff": _est(0.01, -0.2, 0.22, 0.3)},
    "f8_budgetmix_t50": {"base": 0.62, "rl": 0.64, "bound": 0.65, "tier_turns": 4, "room_lo": -0.62,
                         "room_hi": 0.03, "diff": _est(0.02, 0.01, 0.03, 0.01)},
    "f8_budgetmix_t100": {"base": 0.7013, "rl": 0.7041, "tier_turns": 8, "room_lo": -0.7, "room_hi": 0.2,
                          "diff": _est(0.0028, -0.0113, 0.0171, 0.02, lo90=-0.009, hi90=0.015)},
    "health": {"grpo": {"seed0": {"status": "healthy", "reason": "valid-action rate >= 0.95 throughout",
                                  "min_valid": 0.97, "last_valid": 0.99, "last_success": 0.5},
                        "seed2": {"status": "collapsed", "reason": "training success 0 over the last 3 iterations",
                                  "min_valid": 0.0, "last_valid": 0.0, "last_success": 0.0}}},
}
EXPECTED = {"f1_pass1": stats.REPRODUCED, "f1_breadth": stats.REPRODUCED,
            "f2_shrink_frozenlake": stats.REPRODUCED,
            "f3_step_frozenlake": stats.OPPOSITE,  # the CI lies on the opposite side of 0
            "f5_nll": stats.NOT_REPRODUCED,  # CI holds 0, its upper end 0.512 < E = 19% of 10.714
            "f5_matched_bfcl": stats.RECIPE, "f6_r_multi": stats.INCONCLUSIVE,
            "f8_budgetmix_t25": stats.UNDERPOWERED,  # the CI holds 0 and the paper's 7.5 points
            "f8_budgetmix_t50": stats.SMALLER,  # above 0; the bound allows 3 points above GRPO, E = 5.3
            "f8_budgetmix_t100": stats.REPRODUCED}  # TOST: 90% CI inside +/-4 points


@pytest.fixture(scope="module")
def built(tmp_path_factory, figure_paths):
    run_dir = tmp_path_factory.mktemp("report")
    keys = list(RUN_METRICS)
    (run_dir / "a.json").write_text(json.dumps({k: RUN_METRICS[k] for k in keys[:4]}))
    (run_dir / "b.json").write_text(json.dumps({k: RUN_METRICS[k] for k in keys[4:]}))
    metrics = report.load_metrics([run_dir / "a.json", run_dir / "b.json"], keep_text=True)
    rep = report.build_report(metrics, run_dir, figures=figure_paths, meta={"Pass@(K,T) mode": "truncated"})
    path = report.write_report(rep, run_dir / "report.md")
    return metrics, rep, path, run_dir


def test_report_verdicts_follow_the_rule(built):
    metrics, rep, path, _ = built
    assert rep.verdicts == EXPECTED
    text = open(path).read()
    assert text == rep.markdown and "truncated" in text
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## ")[1:]}
    titles = {f.key: findings_lib.finding_title(f, metrics) for f in findings_lib.DEFAULT_FINDINGS}
    by_key = {f.key: f for f in findings_lib.DEFAULT_FINDINGS}
    summary = sections["Summary: one row per finding"]
    assert ("| finding | measured | paper | 95% CI | MDE (reference) | bound allows | verdict | why | seeds |"
            in summary)
    for key, want in EXPECTED.items():
        sec = sections[titles[key]]
        assert f"**Verdict: {want}**: {rep.reasons[key]}" in sec, key
        assert "Seeds: " in sec, key
        assert f"Would have been not reproduced with: {by_key[key].falsified_by}." in sec, key
        row = next(line for line in summary.splitlines() if line.startswith(f"| {titles[key]} |"))
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert cells[6] == want and cells[7].startswith(rep.reasons[key].replace("|", "/")), key
        room = findings_lib.room_from_metrics(by_key[key], metrics)
        if room is None:
            assert cells[5] == "—", key
        else:  # the bound's range, in the difference's printed units, in the summary and the section
            s_ = by_key[key].diff_scale
            allowed = f"[{room[0] * s_:.1f}, {room[1] * s_:.1f}]"
            assert cells[5] == allowed, key
            assert f"The bound allows differences in {allowed}" in sec, key
    assert "Not measured in this run" in sections and titles["f7_process_frozenlake"] in sections["Not measured in this run"]
    # the real tier in the titles of tier rows
    assert "8. BudgetMix vs full-budget RL at 25% of T_max (T=2 of 8)" in titles["f8_budgetmix_t25"]
    assert "tightest tier (T=2 of 8)" in titles["f2_shrink_frozenlake"]
    # an underpowered row gives the range of seeds that would decide it; a bound-limited one the bound's reason
    # (2 seeds: the sd's 95% interval reaches 32 times the sd, so the far end is over 1000 seeds)
    few, many = findings_lib.seeds_to_decide(by_key["f8_budgetmix_t25"], metrics)
    assert few >= 2 and many is None
    t25 = next(line for line in summary.splitlines() if line.startswith(f"| {titles['f8_budgetmix_t25']} |"))
    assert f"about {few} to over 1000 seeds would decide it" in t25
    assert "the bound allows at most 3 on the paper's side, less than E = 5.3" in rep.reasons["f8_budgetmix_t50"]
    # the seeds each verdict used are named, exclusions included, and the all-seeds sensitivity is printed
    f1 = sections[titles["f1_breadth"]]
    assert "Seeds: grpo seeds 0, 1; excluded: 2 (grpo collapsed)." in f1
    assert "Sensitivity, every seed" in f1 and "grpo seeds 0, 1, 2" in f1
    assert "| RL - base at K=1 (points) | 12.0 | — |" in f1 and "K=4" not in f1  # optional rows
    # the seed-health table names the collapsed seed and embeds the learning curves
    hs = sections["Seed health"]
    assert "| grpo | 2 | collapsed | training success 0 over the last 3 iterations |" in hs
    assert "Excluded from the primary verdicts: grpo seed 2 (collapsed)." in hs
    assert "learning_grpo.png" in hs
    # the f5 reference effect is relative to the measured base NLL
    f5 = next(f for f in findings_lib.DEFAULT_FINDINGS if f.key == "f5_nll")
    assert findings_lib.reference_effect(f5, metrics) == pytest.approx(10.714 * 1.95 / 10.25)


def _table_numbers(markdown):
    """Numbers in the value columns of every table (labels, seed lists and reasons excluded)."""
    found, cols = [], None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cols is None:  # a header row: pick the value columns
            if cells[0] == "quantity":
                cols = [1, 2]
            elif cells[0] == "finding":
                cols = [1, 2, 3, 4, 5]  # measured, paper, CI, MDE, bound allows (not the why column)
            elif cells[0] == "arm":
                cols = [4, 5, 6]
            else:
                cols = []
            continue
        if set(cells[0]) <= set("-"):
            continue
        for i in cols:
            found += re.findall(r"-?\d+(?:\.\d+)?", cells[i])
    return found


def test_every_printed_number_comes_from_the_inputs(built):
    metrics, rep, _, _ = built
    listed = report.printed_numbers(rep)
    assert len(listed) > 40
    findings = {f.key: f for f in findings_lib.DEFAULT_FINDINGS}
    for text, value, source in listed:
        kind, key = source.split(":", 1)
        scale = next(n.scale for n in rep.numbers if n.source == source and n.text == text)
        if kind == "run":
            assert value == metrics[key], source
        elif kind == "paper":
            assert value == findings_lib.PAPER_FIGURES[key]["value"], source
        else:
            assert kind == "rule", source
            fkey, what = key.rsplit(".", 1)
            f = findings[fkey]
            want = f.margin if what == "margin" else findings_lib.reference_effect(f, metrics)
            assert value == pytest.approx(want), source
        assert float(text) == pytest.approx(value * scale, abs=0.051), source
    assert Counter(_table_numbers(rep.markdown)) <= Counter(t for t, _, _ in listed)  # nothing printed unsourced
    assert len(_table_numbers(rep.markdown)) > 40
    printed_sources = {s for _, _, s in listed}
    assert "run:f5_matched_bfcl.diff.lo" in printed_sources and "paper:f5_matched_bfcl_diff" in printed_sources
    assert "run:f6_r_multi.diff.mean" in printed_sources and "rule:f8_budgetmix_t100.margin" in printed_sources
    assert "run:health.grpo.seed2.last_valid" in printed_sources
    assert "| tie (%) | — | — |" in rep.markdown  # a metric the run did not write prints no number


def test_report_embeds_figures_by_relative_path(built):
    _, rep, _, run_dir = built
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", rep.markdown)
    assert links and all(not link.startswith("/") and (run_dir / link).exists() for link in links)
    assert any(link.endswith("pass_t.png") for link in links)


def test_flatten_and_load_metrics(tmp_path):
    flat = report.flatten_metrics({"a": {"ci": CI(jnp.float32(0.5), jnp.float32(0.25), 1.0), "n": np.int32(3)},
                                   "skip": np.zeros(3), "name": "x"})
    assert flat == {"a.ci.mean": 0.5, "a.ci.lo": 0.25, "a.ci.hi": 1.0, "a.n": 3.0}
    assert report.flatten_metrics({"a": {"seeds": "grpo seeds 0"}}, keep_text=True) == {"a.seeds": "grpo seeds 0"}
    (tmp_path / "x.json").write_text(json.dumps({"k": 1.0}))
    (tmp_path / "y.json").write_text(json.dumps({"k": 2.0}))
    with pytest.raises(ValueError, match="more than one file"):
        report.load_metrics([tmp_path / "x.json", tmp_path / "y.json"])
    assert math.isnan(report.load_metrics([tmp_path / "x.json"]).get("missing", float("nan")))


def test_a_row_whose_bound_leaves_less_than_e_is_judged_on_its_sign_only_and_says_so(tmp_path):
    """f7 at the tightest tier: GRPO within 2 points of the bound cannot be beaten by E = 10 points, so a CI
    holding 0 is untestable here (bound) and one above 0 a sign result (smaller than the paper, the bound named);
    with room the usual rule decides it."""
    declared = next(x for x in findings_lib.DEFAULT_FINDINGS if x.key == "f7_process_frozenlake")
    f = dataclasses.replace(declared, recipe=None)  # the bound rule alone (the declared row is reported, not judged)

    def run(lo, hi, base, bound):
        m = report.flatten_metrics({"meta": {"t_max": 8}, "f7_process_frozenlake": {
            "base": base, "rl": base, "bound": bound, "room_lo": -base, "room_hi": bound - base, "tier_turns": 2,
            "diff": {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "lo90": lo, "hi90": hi, "se": (hi - lo) / 4,
                     "mde": 0.02, "n_seeds": 5, "method": "t over seeds"}}})
        return findings_lib.finding_verdict(f, m), report.build_report(m, tmp_path).markdown

    (v, why), md = run(-0.01, 0.015, 0.2344, 0.2544)
    assert v == stats.UNTESTABLE and why == ("the 95% CI holds 0 and the bound allows at most 2 on the paper's "
                                             "side, less than E = 10: only a CI wholly on one side of 0 could "
                                             "decide it")
    assert "The bound allows differences in [-23.4, 2.0] (points)" in md
    assert "| differences the structural bound allows | [-23.4, 2.0] | — |" in md
    assert "7. Oracle process reward vs GRPO, FrozenLake, tightest tier (T=2 of 8)" in md
    assert run(0.004, 0.02, 0.2375, 0.2656)[0][0] == stats.SMALLER  # a CI above 0: the sign stands
    m = report.flatten_metrics({"f7_process_frozenlake": {"diff": {"mean": 0.01, "lo": 0.004, "hi": 0.02}}})
    assert findings_lib.finding_verdict(declared, m)[0] == stats.RECIPE
    assert run(0.0, 0.0, 0.2344, 0.2544)[0][0] == stats.NO_VARIANCE   # every seed the same: no test
    assert run(-0.01, 0.02, 0.30, 0.60)[0][0] == stats.NOT_REPRODUCED   # room 30 points: E excluded
    assert run(0.004, 0.2, 0.30, 0.60)[0][0] == stats.REPRODUCED


def test_the_stability_row_names_its_room_as_grpos_own_fall(tmp_path):
    """f7 stability: the room is [GRPO's fall - 1, GRPO's fall], set by the data, not by a structural bound; a
    GRPO that fell 4 points leaves less than E = 10, and the reason and the report name GRPO's fall, not a bound."""
    f = next(x for x in findings_lib.DEFAULT_FINDINGS if x.key == "f7_stability_frozenlake")
    m = report.flatten_metrics({"meta": {"t_max": 8}, "f7_stability_frozenlake": {
        "grpo": 0.04, "oracle": 0.01, "room_lo": -0.96, "room_hi": 0.04, "tier_turns": 2,
        "diff": {"mean": 0.01, "lo": -0.01, "hi": 0.03, "lo90": -0.005, "hi90": 0.025, "se": 0.01, "mde": 0.02,
                 "n_seeds": 5, "method": "t over seeds"}}})
    v, why = findings_lib.finding_verdict(f, m)
    assert v == stats.UNTESTABLE and "GRPO's own fall allows at most 4 on the paper's side, less than E = 10" in why
    assert "bound" not in why
    md = report.build_report(m, tmp_path).markdown
    assert "| differences GRPO's own fall allows | [-96.0, 4.0] | — |" in md
    assert "GRPO's own fall allows differences in [-96.0, 4.0] (points)" in md
    assert findings_lib.room_phrases(next(x for x in findings_lib.DEFAULT_FINDINGS if x.key == "f1_pass1")) == (
        "differences the structural bound allows", "The bound allows differences in")
