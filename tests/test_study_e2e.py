"""A miniature of the study (`experiments.reproduce --preset ci`) end to end: every stage, the report,
resumability, and that every number the report prints comes from the run's own files."""
import json
import os

import pytest

from experiments import reproduce
from jaxagent.eval import report


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    reproduce.main(["--preset", "ci", "--root", root])
    return os.path.join(root, "ci")


@pytest.mark.slow
def test_reproduce_writes_every_stage(ci_run):
    for part in ("config.json", "base/DONE", "base/policy/config.json", "base/policy/model.safetensors",
                 "arms/grpo/seed0/DONE", "arms/budgetmix/seed1/policy/model.safetensors",
                 "arms/grpo/seed0/metrics.jsonl", "arms/grpo/seed0/dynamics.jsonl", "eval/base.json",
                 "metrics.json", "report.md", "timing.json", "figures/pass_at_t.png", "figures/pass_kt_base.png"):
        assert os.path.exists(os.path.join(ci_run, part)), part


@pytest.mark.slow
def test_report_structure_and_numbers_come_from_the_run(ci_run):
    text = open(os.path.join(ci_run, "report.md")).read()
    assert text.startswith("# jaxagent toy study: ci")
    for heading in ("1. Pass@K at full budget", "2. FrozenLake, 25% budget", "3. Step quality on matched states",
                    "8. BudgetMix vs full-budget RL", "Beyond the paper: announced vs hidden budget"):
        assert heading in text, heading
    assert "figures/pass_at_t.png" in text
    metrics = json.load(open(os.path.join(ci_run, "metrics.json")))
    # rebuild the report from the saved metrics: the same text, and every printed number traced
    figs = {k: os.path.join(ci_run, "figures", v) for k, v in
            {"pass_at_t": "pass_at_t.png", "pass_kt_heatmap": "pass_kt_base.png", "pass_at_k": "pass_at_k.png"}.items()}
    rep = report.build_report({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, ci_run, figures=figs)
    nums = report.printed_numbers(rep)
    assert len(nums) > 10
    for text_, value, source in nums:
        kind, key = source.split(":", 1)
        if kind == "run":
            assert metrics[key] == pytest.approx(value), key
        else:
            assert report.PAPER_FIGURES[key]["value"] == pytest.approx(value), key
    # the verdicts in the report are the rule's
    for f in report.DEFAULT_FINDINGS:
        if f"{f.diff}.lo" in metrics:
            assert rep.verdicts[f.key] == report.verdict(metrics[f"{f.diff}.lo"], metrics[f"{f.diff}.hi"], f.direction)


@pytest.mark.slow
def test_rerun_skips_finished_stages(ci_run, capsys):
    before = os.path.getmtime(os.path.join(ci_run, "arms", "grpo", "seed0", "DONE"))
    reproduce.main(["--preset", "ci", "--root", os.path.dirname(ci_run)])
    assert os.path.getmtime(os.path.join(ci_run, "arms", "grpo", "seed0", "DONE")) == before
    assert "done already" in capsys.readouterr().out
