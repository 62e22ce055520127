"""The AOT check's command line (experiments/aot_check.py): argument errors, `--lowered` digests, and `--recheck`
of a stored record file reproducing it byte for byte (the library: tests/test_aot.py, tests/test_aot_host.py).
Skipped only when libtpu (the tpu-aot extra) is not installed.
"""
import json
import os

import pytest

from experiments import aot_check
from jaxagent.models import ops_gpu
from tests.aot_common import needs_cudnn, needs_libtpu

RECORDS = os.path.join(os.path.dirname(__file__), "..", "docs", "aot_records")


@needs_libtpu
def test_aot_check_refuses_a_toy_preset_with_a_pruned_vocabulary():
    with pytest.raises(SystemExit, match="vocabulary is its pruned tokenizer's"):
        aot_check.main(["--preset", "sql-toy"])


def test_aot_check_cli_takes_host_presets():
    with pytest.raises(SystemExit, match="unknown programs"):
        aot_check.main(["--preset", "qwen3-0.6b-1gpu-sql", "--programs", "host_nope"])


@needs_libtpu
def test_aot_check_cli_mesh_and_recheck(tmp_path):
    """--mesh overrides the preset's mesh (and must fit the topology); --recheck refuses records of another preset."""
    with pytest.raises(SystemExit, match="three positive"):
        aot_check.main(["--preset", "qwen3-4b-8gpu", "--mesh", "0", "4", "2"])
    with pytest.raises(SystemExit, match="does not match topology"):
        aot_check.main(["--preset", "qwen3-4b-8gpu", "--mesh", "1", "16", "1", "--topology", "v5p:2x2x2"])
    with pytest.raises(SystemExit, match="is not '<generation>"):
        aot_check.main(["--preset", "qwen3-4b-8gpu", "--topology", "v5p"])
    rec = tmp_path / "r.jsonl"
    rec.write_text('{"program": "train_step_grpo", "preset": "qwen3-8b-v5p"}\n')
    with pytest.raises(SystemExit, match="not of --preset qwen3-4b-8gpu"):
        aot_check.main(["--preset", "qwen3-4b-8gpu", "--recheck", str(rec)])


@needs_libtpu
@pytest.mark.slow
def test_recheck_reproduces_a_stored_record_file(capsys):
    """--recheck of docs/aot_records' qwen3-0.6b-1gpu-sql.jsonl prints that file byte for byte (the resident
    memory and the verdict as built now equal the stored ones); --lowered gives one digest per program."""
    path = os.path.join(RECORDS, "qwen3-0.6b-1gpu-sql.jsonl")
    assert aot_check.main(["--preset", "qwen3-0.6b-1gpu-sql", "--recheck", path, "--json"]) == 0
    with open(path) as f:
        assert capsys.readouterr().out == f.read()
    assert aot_check.main(["--preset", "qwen3-0.6b-1gpu-sql", "--layers", "1", "--programs", "host_decode",
                           "--topology", "v5p:1x1x1", "--lowered"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    rec = json.loads(line)
    assert rec["program"] == "host_decode" and len(rec["lowered_sha256"]) == 64


@needs_libtpu
def test_lowered_toy_preset_uses_the_toy_world(capsys):
    """A toy preset's programs are lowered on the world its run builds (the word-level tokenizer: its
    4-token replies hold a canonical action; on the Qwen3 tokenizer the rollout's canonical replies would not
    fit), R_single's plan generation at its plan prompt and reply."""
    assert aot_check.main(["--preset", "ci", "--topology", "v5p:2x2x1", "--layers", "1", "--programs",
                           "rollout_train", "plan_generate", "--lowered"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["program"] for r in recs] == ["rollout_train", "plan_generate"]
    assert all(len(r["lowered_sha256"]) == 64 for r in recs)


def test_gpu_target_errors_are_one_line(monkeypatch, capsys):
    """A GPU target with a topology, an unknown card, or (without cuDNN, or without the CUDA plugin) at all: one line
    saying what to do; a GPU preset's mesh larger than its cards."""
    with pytest.raises(SystemExit, match="not both"):
        aot_check.main(["--preset", "qwen3-0.6b-1gpu", "--target", "h100", "--topology", "v5p:1x1x1"])
    with pytest.raises(SystemExit):
        aot_check.main(["--preset", "qwen3-0.6b-1gpu", "--target", "a100"])
    assert "invalid choice: 'a100' (choose from 'h100', 'h200')" in capsys.readouterr().err
    monkeypatch.setattr(ops_gpu, "available", lambda: False)
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[gpu-aot\]'"):
        aot_check.main(["--preset", "qwen3-0.6b-1gpu", "--target", "h200", "--layers", "1", "--lowered"])


@needs_cudnn
def test_gpu_preset_lowers_for_its_gpu_by_default(capsys):
    """A GPU preset's programs are lowered for H100s unless told otherwise; the mesh must fit the cards."""
    assert aot_check.main(["--preset", "qwen3-0.6b-1gpu-sql", "--layers", "1", "--programs", "host_decode",
                           "--lowered"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["program"] == "host_decode"
    with pytest.raises(SystemExit, match="does not match topology h100:1x1x8"):
        aot_check.main(["--preset", "qwen3-4b-8gpu", "--mesh", "1", "16", "1"])
