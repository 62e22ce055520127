"""docs/aot.md's tables (`jaxagent.aot.report`, `python -m experiments.aot_report`): the doc's tables section is
what the stored records render to; the records' file convention (a preset's file, its parts replacing programs,
a mesh variant's own table); the summary's counts; clear errors for a misnamed file or a doc without markers."""
import json
import os

import pytest

from experiments import aot_report
from jaxagent.aot import report

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _rec(program, status="ok", fraction=0.5, **kw):
    return {"program": program, "preset": "p", "topology": "v5p:2x2x1", "chips": 4,
            "memory_gib": {"argument": 1.0, "output": 0.0, "alias": 0.0, "temp": 2.0, "total": 4.0, "program": 3.0,
                           "resident": 1.0},
            "hbm_gib": 89.16, "hbm_fraction": fraction, "flops_per_chip": 1.5e12, "flops_ratio": 0.95,
            "collectives": {"all-gather": {"count": 12, "static_count": 2, "gib": 0.25}}, "status": status,
            "compile_s": 3.0, "shapes": "8 rows", **kw}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_docs_tables_are_the_records_rendered():
    with open(os.path.join(ROOT, "docs", "aot.md")) as f:
        doc = f.read()
    assert report.replace_section(doc, report.render(os.path.join(ROOT, "docs", "aot_records"))) == doc, \
        "docs/aot.md's tables differ from docs/aot_records: run python -m experiments.aot_report"


def test_parts_replace_programs_and_a_mesh_has_its_own_table(tmp_path):
    _write(tmp_path / "p.jsonl", [_rec("a"), _rec("b", fraction=0.7)])
    _write(tmp_path / "p.again.jsonl", [_rec("b", status="over_hbm", fraction=0.9), _rec("c")])
    _write(tmp_path / "p.mesh_1x2x2.jsonl", [_rec("a", fraction=0.2)])
    (tmp_path / "notes.txt").write_text("not records")
    ts = report.tables(str(tmp_path))
    assert [(t.preset, t.mesh, t.files) for t in ts] == [("p", "", ["p.jsonl", "p.again.jsonl"]),
                                                         ("p", "1x2x2", ["p.mesh_1x2x2.jsonl"])]
    assert [(r["program"], r["status"]) for r in ts[0].records] == [("a", "ok"), ("b", "over_hbm"), ("c", "ok")]
    text = report.render(str(tmp_path))
    assert "| p (v5p:2x2x1, 4 chips) | 2 / 3 | 0.90 (b) |" in text
    assert "| p (v5p:2x2x1, 4 chips, mesh 1 x 2 x 2 (`--mesh 1 2 2`)) | 1 / 1 | 0.20 (a) |" in text
    assert "| a | ok | 3.00 + 1.00 = 4.00 / 89.2 (0.50) | 1.5e+12 (x0.95) | all-gather 12 / 0.2 | 3.0 | 8 rows |" \
        in text


def test_a_program_recorded_twice_keeps_both_and_a_part_replaces_them_in_order(tmp_path):
    """Two records of one program in a file (e.g. two arms' train states) are both kept; a part's k-th record of that
    program replaces the k-th of the files before it."""
    _write(tmp_path / "p.jsonl", [_rec("s", shapes="arm x"), _rec("s", shapes="arm y"), _rec("g")])
    assert [r["shapes"] for r in report.tables(str(tmp_path))[0].records] == ["arm x", "arm y", "8 rows"]
    _write(tmp_path / "p.again.jsonl", [_rec("s", shapes="arm x2"), _rec("s", shapes="arm y2"), _rec("s", shapes="z")])
    assert [r["shapes"] for r in report.tables(str(tmp_path))[0].records] == ["arm x2", "arm y2", "8 rows", "z"]


def test_unchecked_flops_and_same_program_are_said(tmp_path):
    _write(tmp_path / "p.jsonl", [_rec("r", flops_ratio=2.5), _rec("s", flops_ratio=2.5, same_program_as="r"),
                                  _rec("e", status="compile_error", error="XlaRuntimeError: out of memory")])
    text = report.render(str(tmp_path))
    assert "| r | ok | 3.00 + 1.00 = 4.00 / 89.2 (0.50) | 1.5e+12 (x2.5: an upper bound, not checked) |" in text
    assert "| s (= r) | ok |" in text and "| e | compile_error: XlaRuntimeError: out of memory |" in text


def test_errors_are_clear(tmp_path):
    _write(tmp_path / "q.jsonl", [_rec("a")])
    with pytest.raises(ValueError, match="q.jsonl: a records file is named <preset>"):
        report.tables(str(tmp_path))
    with pytest.raises(ValueError, match="no .* markers"):
        report.replace_section("# a doc\n", "tables")


def test_cli_rewrites_and_checks(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    _write(records / "p.jsonl", [_rec("a")])
    doc = tmp_path / "aot.md"
    doc.write_text(f"# AOT\n\n{report.BEGIN}\nstale\n{report.END}\n\nafter\n")
    argv = ["--records", str(records), "--doc", str(doc)]
    assert aot_report.main(argv + ["--check"]) == 1
    assert aot_report.main(argv) == 0
    text = doc.read_text()
    assert text.startswith("# AOT\n\n" + report.BEGIN) and text.endswith(report.END + "\n\nafter\n")
    assert "stale" not in text and "| a | ok |" in text
    assert aot_report.main(argv + ["--check"]) == 0
