"""Hostile datasets: a record that reaches outside the data directory, a gold query or a test field that never
finishes loading, and files the loader cannot read.

Classes "escape", "resource exhaustion" and "bad message" of the hostile-input suite (test_hostile_graders.py
has the suite's list). Expected: a record that cannot be used is left out and counted under a reason naming its
field; a file that cannot be used is one `DataError` line naming it (and, through `host_study --data`, one line
on stderr with exit code 2, before the run directory is made). The time checks measure this process's CPU time,
which other jobs on the machine cannot inflate.
"""
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from jaxagent.envs.host import sandbox
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.datasets import DataError, read_records
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.envs.host.spider import load_spider

MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _db(path, rows=((1, "a"), (2, "b"))):
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id int, name text)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", rows)
    conn.commit()
    conn.close()
    return path


def _record(db, query="SELECT count(*) FROM t", question="How many rows?"):
    return {"db_id": db, "query": query, "question": question}


def _self_cpu_s():
    t = os.times()
    return t.user + t.system


# --------------------------------------------------------------------------------------------------- escape
def test_a_spider_db_id_cannot_open_a_database_outside_the_data_directory(tmp_path):
    """An absolute db_id, a relative path, '..' and a database file that is a symlink out of the folder. Expected:
    each record is left out as 'field db_id: not a database inside the data directory', and no path outside the
    data directory is among the env's databases (the absolute db_id used to load /elsewhere/x.sqlite)."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    _db(data / "database" / "ok" / "ok.sqlite")
    secret = _db(elsewhere / "x.sqlite", rows=((7, "secret"),))
    _db(elsewhere / "y" / "y.sqlite")
    (data / "database" / "evil").mkdir()
    (data / "database" / "evil" / "evil.sqlite").symlink_to(secret)
    records = [_record("ok"), _record(str(elsewhere / "x")), _record("../../elsewhere/y"), _record(".."),
               _record("evil")]
    (data / "train_spider.json").write_text(json.dumps(records))
    loaded = load_spider(data)
    assert [t.db for t in loaded.splits["all"]] == ["ok"]
    assert all(p.resolve().is_relative_to(data.resolve()) for p in loaded.db_paths.values())
    reasons = {r: n for r, n in loaded.report.left_out.items()}
    assert sum(n for r, n in reasons.items() if r.startswith("field db_id: not a database inside the data")) == 4, \
        reasons


# ------------------------------------------------------------------------------------------ resource exhaustion
def test_a_gold_query_that_never_yields_is_killed_at_the_time_limit(tmp_path):
    """Gold query `printf('%.*c', 2e9, 'x')` (one SQLite step of ~20 CPU-s) with a 1 s limit. Expected: the record
    is left out ('field query: gold query fails (query interrupted ...)'), the other is kept, and this process
    spends under 3 CPU-s (the query ran here, in-process, and kept the loader busy for 56 s)."""
    _db(tmp_path / "database" / "ok" / "ok.sqlite")
    (tmp_path / "train_spider.json").write_text(json.dumps([
        _record("ok"), _record("ok", query="SELECT printf('%.*c', 2000000000, 'x')")]))
    cpu0, t0 = _self_cpu_s(), time.monotonic()
    loaded = load_spider(tmp_path, time_limit_s=1.0)
    cpu, wall = _self_cpu_s() - cpu0, time.monotonic() - t0
    assert [t.id for t in loaded.splits["all"]] == ["train_spider-0"]
    assert list(loaded.report.left_out) == ["field query: gold query fails (query interrupted)"], loaded.report.left_out
    assert cpu < 3.0 and wall < 60.0, (cpu, wall)


def _deepcoder_dir(tmp_path, bad_records):
    tmp_path.mkdir()
    good = {"problem": "Print 1.", "tests": {"inputs": [""], "outputs": ["1\n"]}}
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in [good, *bad_records]) + "\n")
    return tmp_path


def test_deepcoder_fields_that_would_never_finish_parsing_are_left_out_by_reason(tmp_path):
    """tests = '[' * 100000 (a RecursionError in json.loads, uncaught), a 1e6-element Python literal (13 s in
    ast.literal_eval), a JSON test nested 200 deep, metadata nested too deeply. Expected: each record left out
    under a reason naming its field, the good one kept, and under 3 CPU-s of this process for the whole load."""
    big_literal = "[" + ", ".join(["'a'"] * 1_000_000) + "]"
    deep = {"inputs": [[json.loads("[" * 200 + "]" * 200)]], "outputs": [1], "fn_name": "f"}
    bad = [{"problem": "Deep.", "tests": "[" * 100_000},
           {"problem": "Big.", "tests": big_literal},
           {"problem": "Nested.", "tests": json.dumps(deep)},
           {"problem": "Meta.", "tests": {"inputs": [""], "outputs": ["1"]}, "metadata": "[" * 100_000}]
    root = _deepcoder_dir(tmp_path / "data", bad)
    cpu0 = _self_cpu_s()
    env = CodeEnv(limits=SandboxLimits(mode=MODE), data=root, require_reference=False, cache_dir=tmp_path / "c")
    cpu = _self_cpu_s() - cpu0
    assert [t.id for t in env.tasks("all")] == ["train-0"]
    assert env.report.left_out == {
        "field tests: nested too deeply": 1,
        "field tests: not JSON, and over 100000 characters to read as a Python literal": 1,
        "field tests: a test nested deeper than 32 levels": 1,
        "field metadata: nested too deeply": 1}, env.report.left_out
    assert cpu < 3.0, cpu


# ------------------------------------------------------------------------------------------------ bad message
@pytest.mark.parametrize("content, problem", [
    (b'[{"db_id": "caf\xe9"}]', "not UTF-8 text (byte 15"),
    (b"[" * 100_000, "JSON nested too deeply to read"),
    (b'[{"a": 1}', "not JSON"),
])
def test_an_unreadable_data_file_is_one_line_naming_it(tmp_path, content, problem):
    """Expected: DataError (a ValueError) naming the file and the problem, on one line (a UnicodeDecodeError that
    named no file, or a RecursionError, used to escape)."""
    path = tmp_path / "dev.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        list(read_records(path))
    msg = str(e.value)
    assert msg.startswith(str(path)) and problem in msg and "\n" not in msg, msg
    (tmp_path / "train.jsonl").write_bytes(b'{"problem": "x"}\n' + content + b"\n")
    with pytest.raises(DataError, match=r"train.jsonl: (line 2|not UTF-8)"):
        list(read_records(tmp_path / "train.jsonl"))


@pytest.mark.parametrize("preset, name, content", [
    ("ci-sql", "dev.json", b'[{"db_id": "caf\xe9", "query": "SELECT 1", "question": "q"}]'),
    ("ci-code", "train.jsonl", b'{"problem": "p", "tests": ' + b"[" * 100_000 + b"}\n"),
])
def test_host_study_with_malformed_data_is_one_line_before_anything_is_written(tmp_path, preset, name, content):
    """`python -m experiments.host_study --preset ci-sql|ci-code --data <non-UTF-8 / deeply nested file>`. Expected:
    exit code 2, one line on stderr naming the file, and no run directory (a 33-38-line traceback with exit code 1
    came after config.json was written)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / name).write_bytes(content)
    root = tmp_path / "runs"
    env = {**os.environ, "JAXAGENT_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "experiments.host_study", "--preset", preset, "--data", str(data),
                           "--root", str(root)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and str(data / name) in err[0], proc.stderr[-3000:]
    assert not root.exists()
