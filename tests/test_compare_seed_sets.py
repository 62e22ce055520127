"""experiments.compare_seed_sets: one row per measured finding, verdicts from the same rule as the report."""
import json

import pytest

from experiments import compare_seed_sets


def _est(mean, lo, hi, mde):
    return {"mean": mean, "lo": lo, "hi": hi, "lo90": lo, "hi90": hi, "se": (hi - lo) / 4, "mde": mde,
            "n_seeds": 5, "method": "cluster bootstrap"}


def _run(tmp_path, name, f1_diff):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"f1_breadth": {"diff": f1_diff, "k1": _est(0.2, 0.17, 0.23, 0.03)}}))
    return str(d)


def test_table_marks_agreement_and_disagreement(tmp_path):
    a = _run(tmp_path, "standard", _est(0.14, 0.10, 0.19, 0.05))     # CI above 0: reproduced
    b = _run(tmp_path, "standard-s5", _est(0.02, -0.03, 0.07, 0.05))  # holds 0, MDE <= E = 10, E excluded
    lines = compare_seed_sets.table([a, b]).splitlines()
    assert len(lines) == 4  # header, rule, the K=1 row and finding 1
    assert lines[2].startswith("| 1. RL stays above base at full budget, K=1")
    assert "+20.0 [17.0, 23.0] reproduced | +20.0 [17.0, 23.0] reproduced | yes |" in lines[2]
    assert "+14.0 [10.0, 19.0] reproduced | +2.0 [-3.0, 7.0] not reproduced | **no** |" in lines[3]


def test_missing_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the eval stage"):
        compare_seed_sets.table([str(tmp_path)])
