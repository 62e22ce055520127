"""experiments/sweep.py's base grid (`jaxagent.study.frozenlake.sweep.sweep_base`): each SFT setting trains a base
and reports its held-out figures."""
import json

from experiments import sweep
from jaxagent.study.frozenlake import sweep as sweep_lib


def test_base_grid_reports_each_setting(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sweep_lib.BASE_GRIDS, "base", {"two_steps": dict(steps=2), "three_steps": dict(steps=3)})
    out = tmp_path / "rows.jsonl"
    sweep.main(["--preset", "ci", "--grid", "base", "--heldout-tasks", "2", "--heldout-samples", "2",
                "--root", str(tmp_path), "--seed-offset", "3", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["setting"] for r in rows] == ["two_steps", "three_steps"]
    for r in rows:
        assert r["base_seed"] == 1003  # the run's SFT key follows --seed-offset
        assert 0.0 <= r["heldout_pass1"] <= 1.0 and 0.0 <= r["heldout_valid"] <= 1.0
    assert [r["steps"] for r in rows] == [2, 3]
    assert "| two_steps | 1003 |" in capsys.readouterr().out
