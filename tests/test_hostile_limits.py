"""Resource exhaustion: a way around the CPU quota, a failure that depends on time and sticks, a query limit that
the machine's load eats into.

Class "resource exhaustion" of the hostile-input suite (test_hostile_graders.py has the suite's list). Each case
states its expected outcome and fails if the attack works. Time is checked in ways a loaded 2-core machine
cannot break: CPU time (which other jobs cannot inflate), or a process stopped by the test itself.
"""
import os
import signal
import sqlite3
import threading
import time

import pytest

from jaxagent.envs.host import code_env as code_env_lib, sandbox
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.sandbox import CallOutcome, SandboxLimits, SandboxResult, run_calls
from jaxagent.envs.host.sql_query import DEFAULT_GRACE_S, QueryError
from jaxagent.envs.host.sql_query_pool import QueryRunner

PROBLEM = sandbox.strong_isolation_problem()
MODE = "namespaces" if PROBLEM is None else "unsafe-rlimits-only"
strong_only = pytest.mark.skipif(PROBLEM is not None, reason=f"strong isolation unavailable here: {PROBLEM}")

# Children burn CPU and exit; the parent ignores SIGCHLD, so the kernel reaps them and their time never reaches
# any process's cutime (the process-tree account saw 0.18 s of >= 2.6 CPU-s).
_SIGCHLD_IGNORED = """\
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
def f():
    t, n = time.monotonic(), 0
    while time.monotonic() - t < 20:
        pid = os.fork()
        if pid == 0:
            x = 0
            for i in range(2_000_000):
                x += i
            os._exit(0)
        n += 1
        while True:  # no wait(): the child is gone when the kernel has reaped it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.005)
    return n
"""


@strong_only
def test_children_reaped_by_the_kernel_still_count_against_the_cpu_quota():
    """Expected: with a cgroup, the run stops at its 2 CPU-s quota (CPUQuota, cpu_s >= 2, long before the 20 s the
    program would run); it used to run to the end, measured at 0.18 s."""
    limits = SandboxLimits(wall_s=30.0, per_call_s=25.0, cpu_s=2)
    r = run_calls(_SIGCHLD_IGNORED, "f", [[]], limits)
    if not r.cpu_bound.startswith("cgroup"):
        pytest.skip(f"no cgroup for the run here ({r.cpu_bound}): the process-tree account is the weaker bound")
    assert r.cpu_exceeded and r.cpu_s >= 2.0 and r.outcomes[0].status == "not_run", r
    assert "CPUQuota" in r.outcomes[0].error


@strong_only
def test_without_a_cgroup_the_result_says_the_weaker_account_is_used():
    """Expected: cgroup=False reports cpu_bound 'process-tree' (docs/sandbox.md: it misses children reaped by the
    kernel); a run with a cgroup reports the cgroup."""
    ok = "def f(x):\n    return x\n"
    assert run_calls(ok, "f", [[1]], SandboxLimits(cgroup=False)).cpu_bound == "process-tree"
    assert run_calls(ok, "f", [[1]], SandboxLimits()).cpu_bound in ("cgroup-v2", "cgroup-v1", "process-tree")


# A module that loads at once in the run's first call and then takes 10 s to load (its work directory keeps the
# marker between calls): a load that runs out of time, in the first call's worker or a later one.
_SLOW_SECOND_LOAD = """\
import os, time
if os.path.exists("loaded-once"):
    time.sleep(10)
open("loaded-once", "w").close()
def f(x):
    return x
"""


def test_a_module_load_timeout_is_reported_as_time_dependent():
    """Expected: a load that runs out of time is `load_timed_out` (first call) or a 'timeout' outcome (a later
    call's worker), never an 'error' outcome or a plain load error, which the coding env would keep."""
    limits = SandboxLimits(wall_s=8.0, per_call_s=0.5, mode=MODE)
    r = run_calls("import time\ntime.sleep(10)\ndef f(x):\n    return x\n", "f", [[1]], limits)
    assert r.load_error.startswith("Timeout") and r.load_timed_out, r
    r = run_calls(_SLOW_SECOND_LOAD, "f", [[1], [2]], limits)
    assert [o.status for o in r.outcomes] == ["ok", "timeout"] and not r.load_timed_out, r
    r = run_calls("raise ValueError('no')\n", "f", [[1]], limits)
    assert r.load_error.startswith("ValueError") and not r.load_timed_out


def test_a_load_that_ran_out_of_time_is_not_kept_for_the_next_submission(monkeypatch):
    """A correct program whose module loaded slowly on a loaded machine. Expected: its resubmission runs again and
    passes (the time-out used to be kept as its load error for every later submission); a plain load error is
    still kept."""
    env = CodeEnv(limits=SandboxLimits(mode=MODE))
    task = env.tasks("all")[0]
    n = len(task.tests)
    slow = SandboxResult(outcomes=(CallOutcome("not_run", error="Timeout: executing the module"),) * n,
                         load_error="Timeout: executing the module took longer than 2.0s", timed_out=False,
                         isolation=MODE, exit_info="", wall_s=2.0, load_timed_out=True)
    runs = []

    def fake_run_calls(code, entry, args_list, limits):
        runs.append(code)
        return slow if len(runs) == 1 else sandbox.run_calls(code, entry, args_list, limits)

    monkeypatch.setattr(code_env_lib, "run_calls", fake_run_calls)
    state, _ = env.reset(0, task)
    _, _, reward, _, _ = env.step(state, f"```python\n{task.reference}```")
    assert reward == 0.0
    _, obs, reward, _, _ = env.step(state, f"```python\n{task.reference}```")
    assert reward == 1.0 and len(runs) == 2 and env.cache_hits == 0, obs
    broken = "def nope(:\n"
    env.step(state, f"```python\n{broken}```")
    env.step(state, f"```python\n{broken}```")
    assert len(runs) == 3 and env.cache_hits == 1  # a syntax error does not depend on time: kept


# ------------------------------------------------------------------------------------------------ SQL
@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "x.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a int)")
    conn.commit()
    conn.close()
    return path


def test_a_query_gets_its_whole_time_limit_however_late_its_process_starts(db):
    """The idle query process is stopped (SIGSTOP) for 2 s when a query is sent, as a busy machine may keep it
    off the CPU. Expected: `SELECT 42` with a 1 s limit answers 42 (the limit used to be counted from sending, so
    the stopped process was killed at 1.15 s and a one-step query got the time-limit error)."""
    runner = QueryRunner()
    try:
        runner.run(db, "SELECT 1", time_limit_s=1.0, max_rows=10)
        (pid,) = runner.pids()
        os.kill(pid, signal.SIGSTOP)
        wake = threading.Timer(2.0, os.kill, (pid, signal.SIGCONT))
        wake.start()
        t0 = time.monotonic()
        _, rows, _ = runner.run(db, "SELECT 42", time_limit_s=1.0, max_rows=10)
        assert rows == [(42,)] and time.monotonic() - t0 >= 2.0
        wake.join()
    finally:
        runner.close()


def test_a_query_that_never_yields_uses_at_most_its_limit_and_grace_of_cpu(db):
    """`printf('%.*c', 2e9, 'x')` is one SQLite step of ~20 CPU-s. Expected: the time-limit error, and the killed
    query process (reaped, so counted in this process's children's CPU time) used at most the limit + grace from
    its start of work, + 0.6 s for its interpreter's start and the killer's wake-up on a busy machine."""
    runner = QueryRunner()
    try:
        runner.run(db, "SELECT 1", time_limit_s=1.0, max_rows=10)  # started: its start-up CPU is before cpu0
        cpu0 = os.times().children_user + os.times().children_system
        with pytest.raises(QueryError, match="time limit of 1s exceeded"):
            runner.run(db, "SELECT printf('%.*c', 2000000000, 'x')", time_limit_s=1.0, max_rows=10)
        used = os.times().children_user + os.times().children_system - cpu0
        assert used <= 1.0 + DEFAULT_GRACE_S + 0.6, used
    finally:
        runner.close()
