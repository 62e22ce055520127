"""Tests of jaxagent.eval.plots (PNG files) and jaxagent.eval.report (verdict rule, sourced numbers)."""
import json
import math
import re
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.eval import plots, report
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
                                            bound_T=np.minimum(grid[:, 3] + 0.1, 1.0),
                                            bands={"base": (grid[:, 3] - 0.05, grid[:, 3] + 0.05)}),
        "pass_at_k": plots.pass_at_k_curves(ks, {"base": grid[3], "RL": grid[3] * 1.05}, out / "pass_k.png", budget=8),
        "step_quality_depth": plots.step_quality_by_depth(edges, [0.3, 0.4, np.nan, 0.6], [0.2, 0.2, np.nan, 0.1],
                                                          [0.5, 0.4, np.nan, 0.3], [0.5, 0.4, np.nan, 0.2],
                                                          [0.45, 0.42, np.nan, 0.3], out / "depth.png"),
        "nll_hist": plots.likelihood_histograms({"RL actions": np.random.default_rng(0).normal(12, 3, 200),
                                                 "base actions": np.random.default_rng(1).normal(10, 3, 200)},
                                                out / "nll.png"),
        "dynamics": plots.training_dynamics([0, 10, 20], [0.2, 0.35, 0.53], [0.6, 0.55, 0.5], out / "dyn.png"),
    }


def test_plots_write_nonempty_pngs(figure_paths):
    for name, path in figure_paths.items():
        assert _is_png(path), name
    with pytest.raises(ValueError, match="does not match"):
        plots.pass_kt_heatmap(np.zeros((2, 3)), [1, 2], [1, 2], "unused.png")
    with pytest.raises(ValueError, match="finite"):
        plots.likelihood_histograms({"a": [np.nan]}, "unused.png")


def test_verdict_rule():
    v = report.verdict
    assert v(0.1, 0.5, +1) == report.REPRODUCED
    assert v(-0.5, -0.1, +1) == report.NOT_REPRODUCED
    assert v(-0.1, 0.5, +1) == report.INCONCLUSIVE
    assert v(-0.5, -0.1, -1) == report.REPRODUCED
    assert v(0.1, 0.5, -1) == report.NOT_REPRODUCED
    assert v(-0.1, 0.2, 0) == report.REPRODUCED
    assert v(0.1, 0.2, 0) == report.NOT_REPRODUCED
    assert v(None, 0.2, +1) == report.INCONCLUSIVE
    assert v(float("nan"), 0.2, +1) == report.INCONCLUSIVE
    assert v(0.0, 0.2, +1) == report.INCONCLUSIVE  # the CI must exclude zero
    with pytest.raises(ValueError, match="direction"):
        v(0.1, 0.2, 2)


def test_paper_figures_and_default_findings_are_consistent():
    figs = report.PAPER_FIGURES
    assert figs["f2_frozenlake_t25_base"]["value"] == 30.3 and figs["f2_frozenlake_t25_grpo"]["value"] == 28.7
    assert figs["f3_frozenlake_rl_better"]["value"] == 42.8 and figs["f5_matched_bfcl_diff"]["value"] == 805.8
    assert figs["f6_r_single_delta"]["value"] == -0.097 and figs["f8_gain_t25"]["value"] == 7.5
    assert (figs["f8_gain_t25_model_a"]["value"] + figs["f8_gain_t25_model_b"]["value"]) / 2 == pytest.approx(7.475)
    assert all(set(v) >= {"value", "description", "unit"} and v["description"] for v in figs.values())
    for f in report.DEFAULT_FINDINGS:
        paper_keys = [r.paper for r in f.rows if r.paper] + ([f.diff_paper] if f.diff_paper else [])
        assert all(k in figs for k in paper_keys), f.key
        by_label = {r.measured.rsplit(".", 1)[1]: r.paper for r in f.rows if r.measured}
        if by_label.get("rl") and by_label.get("base"):  # the paper's pair fixes the direction
            assert np.sign(figs[by_label["rl"]]["value"] - figs[by_label["base"]]["value"]) == f.direction, f.key
        if f.diff_paper:
            assert np.sign(figs[f.diff_paper]["value"]) == f.direction, f.key
    assert len({f.key for f in report.DEFAULT_FINDINGS}) == len(report.DEFAULT_FINDINGS)


RUN_METRICS = {
    "f2_tight_frozenlake": {"base": 0.3125, "rl": 0.2719, "diff": {"mean": -0.0406, "lo": -0.0712, "hi": -0.0108}},
    "f3_step_frozenlake": {"share_rl_better": 0.4375, "share_rl_worse": 0.375,  # share_equal not measured
                           "mean_q_base": 0.6123, "mean_q_rl": 0.6348, "diff": {"mean": 0.0225, "lo": 0.0103, "hi": 0.0351}},
    "f5_nll": {"base": 10.714, "rl": 10.9, "diff": {"mean": 0.186, "lo": -0.137, "hi": 0.512}},
    "f5_matched_bfcl": {"n_pairs": 57, "n_tasks": 23, "diff": {"mean": 612.3, "lo": 301.9, "hi": 907.4}},
    "f6_r_multi": {"first": 0.21, "last": 0.5, "diff": {"mean": 0.29}},  # no CI measured
    "f8_budgetmix_t100": {"base": 0.7013, "rl": 0.7041, "diff": {"mean": 0.0028, "lo": -0.0113, "hi": 0.0171}},
}
EXPECTED = {"f2_tight_frozenlake": report.REPRODUCED, "f3_step_frozenlake": report.NOT_REPRODUCED,
            "f5_nll": report.INCONCLUSIVE, "f5_matched_bfcl": report.REPRODUCED, "f6_r_multi": report.INCONCLUSIVE,
            "f8_budgetmix_t100": report.REPRODUCED}


@pytest.fixture(scope="module")
def built(tmp_path_factory, figure_paths):
    run_dir = tmp_path_factory.mktemp("report")
    (run_dir / "a.json").write_text(json.dumps({k: RUN_METRICS[k] for k in list(RUN_METRICS)[:3]}))
    (run_dir / "b.json").write_text(json.dumps({k: RUN_METRICS[k] for k in list(RUN_METRICS)[3:]}))
    metrics = report.load_metrics([run_dir / "a.json", run_dir / "b.json"])
    rep = report.build_report(metrics, run_dir, figures=figure_paths, meta={"Pass@(K,T) mode": "truncated"})
    path = report.write_report(rep, run_dir / "report.md")
    return metrics, rep, path, run_dir


def test_report_verdicts_follow_the_rule(built):
    _, rep, path, _ = built
    assert rep.verdicts == EXPECTED
    text = open(path).read()
    assert text == rep.markdown and "truncated" in text
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## ")[1:]}
    titles = {f.key: f.title for f in report.DEFAULT_FINDINGS}
    for key, want in EXPECTED.items():
        assert f"**Verdict: {want}**" in sections[titles[key]], key
    assert "Not measured in this run" in sections and titles["f1_breadth"] in sections["Not measured in this run"]


def _table_numbers(markdown):
    """Numbers in the measured and paper columns of every table row (labels excluded)."""
    found = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and not set(cells[1]) <= set("-"):
            for cell in cells[1:]:
                found += re.findall(r"-?\d+(?:\.\d+)?", cell)
    return found


def test_every_printed_number_comes_from_the_inputs(built):
    metrics, rep, _, _ = built
    listed = report.printed_numbers(rep)
    assert len(listed) > 20
    for text, value, source in listed:
        kind, key = source.split(":", 1)
        if kind == "run":
            assert value == metrics[key], source
            scale = next(n.scale for n in rep.numbers if n.source == source and n.text == text)
            assert float(text) == pytest.approx(value * scale, abs=0.051), source
        else:
            assert kind == "paper" and value == report.PAPER_FIGURES[key]["value"], source
            assert float(text) == pytest.approx(value, abs=0.051), source
    assert Counter(_table_numbers(rep.markdown)) == Counter(t for t, _, _ in listed)  # nothing printed unsourced
    printed_sources = {s for _, _, s in listed}
    assert "run:f5_matched_bfcl.diff.lo" in printed_sources and "paper:f5_matched_bfcl_diff" in printed_sources
    assert "run:f6_r_multi.diff.mean" in printed_sources
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
    (tmp_path / "x.json").write_text(json.dumps({"k": 1.0}))
    (tmp_path / "y.json").write_text(json.dumps({"k": 2.0}))
    with pytest.raises(ValueError, match="more than one file"):
        report.load_metrics([tmp_path / "x.json", tmp_path / "y.json"])
    assert math.isnan(report.load_metrics([tmp_path / "x.json"]).get("missing", float("nan")))
