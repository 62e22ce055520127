"""A pool of killable query processes that makes the time limit of a read-only SQLite query hard.

No dimension legend: host-side Python, no arrays.

`QueryRunner.run(...)` runs `sql_query.run_query` in a query process (`python -I -S sql_query.py`), with hard limits:
  - time: the process says when it starts a query, then answers within `time_limit_s` or is killed (SIGKILL)
    `grace_s` later; the caller gets the time-limit error either way, nothing of the query keeps running, and a
    fresh process replaces a killed one at once. The limit counts from the process's start of work (the step waits
    up to START_S for it; a process that never starts the query is a QueryProcessError);
  - temporary data: in memory only, all of SQLite's memory capped by `sqlite3_hard_heap_limit64`
    (`heap_limit_bytes`, 64 MiB by default), no file writes (RLIMIT_FSIZE = 0);
  - a process that outlives its caller exits when its request pipe closes, or at its RLIMIT_CPU.
Idle processes are reused (one query at a time each). Values cross the pipe as JSON (blobs as hex), never pickled.
A process that cannot be started is an infrastructure failure (`QueryProcessError`, `infrastructure_error = True`),
not the model's. The guarantees and their tests: docs/sandbox.md, "SQL queries: what the limit guarantees".
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref

from jaxagent.envs.host import sql_query
from jaxagent.envs.host.sql_query import (DEFAULT_GRACE_S, DEFAULT_HEAP_LIMIT_BYTES, DEFAULT_MAX_COLUMNS,
                                          DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_VALUE_LEN, STARTED, QueryError,
                                          QueryProcessError)

START_S = 30.0  # the longest wait for a query process to start (its "ready" line) or to start a query


def _decode(v):
    if isinstance(v, dict):
        return bytes.fromhex(v["b"])
    return v


def _read_line(fd: int, deadline: float, cap: int, pending: bytearray | None = None) -> bytes | None:
    """One line from `fd` (after the bytes `pending` holds), without its newline; the bytes read past it stay in
    `pending`. None at the deadline; b"" at EOF; raises QueryError when more than `cap` bytes are waiting."""
    buf = bytearray() if pending is None else pending
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        buf += chunk
        if len(buf) > cap:
            raise QueryError("result too large for the query process's answer")
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


def _stop_all(procs: set) -> None:
    for proc in list(procs):
        _stop(proc)
    procs.clear()


class QueryRunner:
    """Runs queries in killable query processes (module docstring). Thread-safe."""

    def __init__(self, heap_limit_bytes: int = DEFAULT_HEAP_LIMIT_BYTES, grace_s: float = DEFAULT_GRACE_S,
                 max_idle: int = 16):
        if heap_limit_bytes < 2 ** 20 or grace_s <= 0 or max_idle < 1:
            raise ValueError(f"QueryRunner needs heap_limit_bytes >= 1 MiB, grace_s > 0 and max_idle >= 1, "
                             f"got {heap_limit_bytes}, {grace_s}, {max_idle}")
        self.heap_limit_bytes, self.grace_s, self.max_idle = int(heap_limit_bytes), float(grace_s), int(max_idle)
        self._lock = threading.Lock()
        self._idle: list[subprocess.Popen] = []
        self._procs: set[subprocess.Popen] = set()  # every live query process (idle or busy)
        self._starting: set[subprocess.Popen] = set()  # started, "ready" line not read yet
        self._finalizer = weakref.finalize(self, _stop_all, self._procs)

    def pids(self) -> list[int]:
        """Process ids of the live query processes."""
        with self._lock:
            return sorted(p.pid for p in self._procs)

    def close(self) -> None:
        """Stop every query process (a later query starts a new one)."""
        with self._lock:
            self._idle.clear()
            self._starting.clear()
            _stop_all(self._procs)

    def _launch(self) -> subprocess.Popen:
        """A new query process, not waited for (`_acquire` reads its "ready" line)."""
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(sql_query.__file__),
                                     str(self.heap_limit_bytes)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    bufsize=0, close_fds=True, cwd="/", env={"LANG": "C.UTF-8"})
        except OSError as e:
            raise QueryProcessError(f"could not start a SQL query process: {e}") from e
        with self._lock:
            self._procs.add(proc)
            self._starting.add(proc)
        return proc

    def _acquire(self) -> subprocess.Popen:
        """An idle query process that has said it is ready (a new one when none is idle)."""
        with self._lock:
            proc = self._idle.pop() if self._idle else None
        if proc is None:
            proc = self._launch()
        with self._lock:
            starting = proc in self._starting
            self._starting.discard(proc)
        if starting:
            line = _read_line(proc.stdout.fileno(), time.monotonic() + START_S, 1024)
            try:
                msg = json.loads(line) if line else {}
            except ValueError:
                msg = {}
            if "ready" not in msg:
                self._discard(proc)
                raise QueryProcessError(f"a SQL query process did not start (exit code {proc.returncode}): "
                                        f"{msg.get('failed', 'no answer')}")
        elif proc.poll() is not None:  # died while idle
            self._discard(proc)
            return self._acquire()
        return proc

    def _discard(self, proc: subprocess.Popen, replace: bool = False) -> None:
        """Stop `proc`; with `replace`, start its successor now, so that the next query does not wait
        for a process to start."""
        _stop(proc)
        with self._lock:
            self._procs.discard(proc)
            self._starting.discard(proc)
        if replace:
            try:
                successor = self._launch()
            except QueryProcessError:
                return  # the next query tries again, and reports it
            with self._lock:
                self._idle.append(successor)

    def run(self, db_path, query: str, *, time_limit_s: float, max_rows: int,
            max_value_len: int = DEFAULT_MAX_VALUE_LEN, max_columns: int = DEFAULT_MAX_COLUMNS,
            max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
            lenient_text: bool = False) -> tuple[list[str], list[tuple], bool]:
        """`run_query` in a query process, answered or killed by `time_limit_s + grace_s` after the process said
        it started the query (module docstring). Raises QueryError as run_query does, QueryProcessError when no
        query process can be started or one does not start a query within START_S. `lenient_text`: run_query's."""
        proc = self._acquire()
        req = {"db": str(db_path), "query": query, "time_limit_s": float(time_limit_s), "max_rows": int(max_rows),
               "max_value_len": int(max_value_len), "max_columns": int(max_columns),
               "max_result_bytes": int(max_result_bytes), "lenient_text": bool(lenient_text)}
        cap = 16 * (max_result_bytes + max_columns * max_value_len) + (1 << 16)  # JSON of the largest answer
        pending = bytearray()
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            started = _read_line(proc.stdout.fileno(), time.monotonic() + START_S, cap, pending)
            if started == STARTED:  # the query's time starts now, whatever the wait for the process was
                line = _read_line(proc.stdout.fileno(), time.monotonic() + time_limit_s + self.grace_s, cap, pending)
        except (OSError, QueryError) as e:
            self._discard(proc)
            if isinstance(e, QueryError):
                raise
            raise QueryError(f"the query process failed ({type(e).__name__})") from None
        if started != STARTED:
            self._discard(proc, replace=started is None)
            raise QueryProcessError(f"a SQL query process did not start a query within {START_S:g} s" if started is None
                                    else "a SQL query process ended or broke its protocol before starting a query")
        if line is None:
            self._discard(proc, replace=True)
            raise QueryError(f"query interrupted: time limit of {time_limit_s:g}s exceeded")
        if not line:
            self._discard(proc)
            raise QueryError("the query process died (out of memory or CPU time)")
        try:
            answer = json.loads(line)
            result = None if "error" in answer else (
                [str(c) for c in answer["cols"]], [tuple(_decode(v) for v in r) for r in answer["rows"]],
                bool(answer["truncated"]))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            self._discard(proc)
            raise QueryProcessError("a SQL query process sent an answer that cannot be read") from None
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(proc)
                proc = None
        if proc is not None:
            self._discard(proc)
        if result is None:
            raise QueryError(str(answer["error"]))
        return result
