"""Data loss and bad messages from a planted run directory: links, directories and pipes where the study writes.

Classes "data loss" and "bad message" of the hostile-input suite (test_hostile_graders.py has the suite's list).
A careless user (or a hostile checkout) leaves `.lock`, a log or a DONE marker as something other than a regular
file. Expected, in every case: one `RunError` line naming the path, nothing written through the link (its
target keeps its bytes), and no hang.
"""
import json
import os

import pytest

from jaxagent.study import run_dir
from jaxagent.study.run_dir import InvalidMarker, InvalidRunDir, RunDir

PRECIOUS = "the user's notes, which no run may overwrite\n"


@pytest.fixture()
def precious(tmp_path):
    """A file outside the run directory that a link inside it points at."""
    p = tmp_path / "notes.txt"
    p.write_text(PRECIOUS)
    return p


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_a_lock_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path, precious):
    """Expected: InvalidRunDir naming .lock; the linked file keeps its bytes (the lock used to be opened with
    open(a+) and truncated, destroying it)."""
    d = tmp_path / "run"
    d.mkdir()
    (d / ".lock").symlink_to(precious)
    with pytest.raises(InvalidRunDir) as e:
        RunDir(str(d))
    assert ".lock is a symbolic link" in _one_line(e)
    assert precious.read_text() == PRECIOUS
    with pytest.raises(InvalidRunDir):
        run_dir.is_locked(str(d))
    (d / ".lock").unlink()
    (d / ".lock").symlink_to(tmp_path / "does-not-exist")  # a dangling link is not created through either
    with pytest.raises(InvalidRunDir):
        RunDir(str(d))
    assert not (tmp_path / "does-not-exist").exists()


def test_a_lock_with_another_hard_link_is_refused(tmp_path, precious):
    d = tmp_path / "run"
    d.mkdir()
    os.link(precious, d / ".lock")
    with pytest.raises(InvalidRunDir) as e:
        RunDir(str(d))
    assert "2 hard links" in _one_line(e) and precious.read_text() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_that_is_a_pipe_or_a_directory_is_refused_without_waiting(tmp_path, kind):
    """Expected: InvalidRunDir at once (a FIFO opened read-only would wait for a writer forever)."""
    d = tmp_path / "run"
    d.mkdir()
    (os.mkfifo if kind == "fifo" else os.mkdir)(d / ".lock")
    with pytest.raises(InvalidRunDir) as e:
        RunDir(str(d))
    assert ("named pipe" if kind == "fifo" else "a directory") in _one_line(e)
    with pytest.raises(InvalidRunDir):
        run_dir.is_locked(str(d))


def test_logs_and_json_files_are_not_written_through_links(tmp_path, precious):
    """Expected: append_jsonl, cut_jsonl and write_json refuse a symlinked target; the target keeps its bytes."""
    log = tmp_path / "metrics.jsonl"
    log.symlink_to(precious)
    with pytest.raises(InvalidRunDir, match="metrics.jsonl is a symbolic link"):
        run_dir.append_jsonl(str(log), {"step": 1})
    with pytest.raises(InvalidRunDir, match="metrics.jsonl is a symbolic link"):
        run_dir.cut_jsonl(str(log), lambda rec: False)
    cfg = tmp_path / "config.json"
    cfg.symlink_to(precious)
    with pytest.raises(InvalidRunDir, match="config.json is a symbolic link"):
        run_dir.write_json(str(cfg), {"a": 1})
    assert precious.read_text() == PRECIOUS and os.path.islink(cfg)
    plain = tmp_path / "ok.jsonl"
    run_dir.append_jsonl(str(plain), {"step": 1})
    run_dir.append_jsonl(str(plain), {"step": 2})
    assert [json.loads(x)["step"] for x in plain.read_text().splitlines()] == [1, 2]


def test_a_done_path_that_is_a_directory_is_one_line(tmp_path):
    """Expected: done() raises InvalidMarker naming the path (it used to say False, and mark_done then raised
    IsADirectoryError as a traceback); mark_done raises InvalidRunDir; the directory is left as it was."""
    stage = tmp_path / "base"
    (stage / "DONE").mkdir(parents=True)
    (stage / "DONE" / "keep").write_text("x")
    with pytest.raises(InvalidMarker) as e:
        run_dir.done(str(stage))
    assert "DONE is a directory, not a regular file" in _one_line(e)
    with pytest.raises(InvalidRunDir) as e:
        run_dir.mark_done(str(stage))
    assert "DONE is a directory" in _one_line(e) and (stage / "DONE" / "keep").read_text() == "x"


def test_a_done_marker_that_is_a_symlink_is_not_a_finished_stage(tmp_path):
    """Expected: a DONE link to a JSON object elsewhere is InvalidMarker, not a finished stage."""
    other = tmp_path / "other.json"
    other.write_text('{"finished": "2020-01-01"}')
    stage = tmp_path / "base"
    stage.mkdir()
    (stage / "DONE").symlink_to(other)
    with pytest.raises(InvalidMarker, match="symbolic link"):
        run_dir.done(str(stage))
    run_dir.mark_done(str(tmp_path))  # a plain marker still works
    assert run_dir.done(str(tmp_path))
