"""Read-only SQLite queries with limits, and a pool of query processes that makes the time limit hard.

No dimension legend: host-side Python, no arrays.

`run_query(db_path, query, ...)` runs one query in this process: the database opened read-only (URI
`mode=ro`, `PRAGMA query_only`), an authorizer that allows only reading (SELECT, READ, RECURSIVE, and
calls of the functions in ALLOWED_FUNCTIONS: no ATTACH, PRAGMA, writes, schema changes, extension loading
or functions such as fts3_tokenizer that expose host internals), a time limit that covers running,
fetching and converting the result (progress handler plus a clock check per fetched row and text
value), and size limits: `max_value_len` bytes per value and `max_columns` columns (both enforced by
SQLite, so one row is at most their product), `max_result_bytes` bytes converted in all (a larger result
is an error, not a truncation) and `max_rows` rows. In this process the time limit is checked between
SQLite's VM steps only, and some single steps are long: `printf('%.*c', 2000000000, 'x')` is one
step of about 20 s. Use it for trusted queries (gold answers, the schema).

`QueryRunner.run(...)` runs the same function in a query process (this file run as a program,
`python -I -S <this file>`, standard library only) and makes the limits hard:
  - time: the process answers within `time_limit_s` through the same checks, or is killed (SIGKILL)
    `grace_s` later; the caller gets the time-limit error either way and no thread or process of the
    query is left running. A fresh process replaces a killed one at the next query.
  - temporary data (sorting, DISTINCT / UNION sets, materialised CTEs): in memory only
    (`PRAGMA temp_store = MEMORY`), and all of SQLite's memory in the process is capped by
    `sqlite3_hard_heap_limit64` (`heap_limit_bytes`, 64 MiB by default); a query that needs more gets
    an "out of memory" error. The process may not write files at all (RLIMIT_FSIZE = 0), so no temp
    file can grow on disk.
  - a query process that outlives its caller: it exits when its request pipe closes, and its CPU
    limit (RLIMIT_CPU, raised before each query to what it has used + the time limit + 2 s) ends a
    step that never returns.
Idle processes are reused (one query at a time each); several threads get several processes.
Values cross the pipe as JSON (blobs as hex), never pickled. A query process that cannot be started is
an infrastructure failure (`QueryProcessError`, `infrastructure_error = True`), not the model's.
"""

import json
import os
import select
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import weakref

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
# SQL functions a query may call (lower case): SQLite's core scalar, aggregate, window, date/time, math
# and JSON functions. Everything else (load_extension, fts3_tokenizer, sqlite_* introspection, FTS/R-tree
# helpers, functions of extensions) is refused by the authorizer.
ALLOWED_FUNCTIONS = frozenset('''
    abs char coalesce concat concat_ws format glob hex if ifnull iif instr length like likelihood likely
    lower ltrim max min nullif octet_length printf quote random randomblob replace round rtrim sign soundex
    substr substring trim typeof unhex unicode unlikely upper zeroblob sqlite_version
    avg count group_concat string_agg sum total median
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    date time datetime julianday unixepoch strftime timediff current_date current_time current_timestamp
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 mod pi
    pow power radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_error_position json_extract json_group_array json_group_object
    json_insert json_object json_patch json_pretty json_quote json_remove json_replace json_set json_type
    json_valid -> ->>
'''.split())
DEFAULT_MAX_VALUE_LEN = 32_768  # bytes per string/blob value (SQLITE_LIMIT_LENGTH)
DEFAULT_MAX_COLUMNS = 64  # result columns (SQLITE_LIMIT_COLUMN)
DEFAULT_MAX_RESULT_BYTES = 1_000_000  # bytes converted per query (text/blob lengths, 8 per other value)
DEFAULT_HEAP_LIMIT_BYTES = 64 * 2 ** 20  # all of SQLite's memory in a query process, temp data included
DEFAULT_GRACE_S = 0.15  # a query process still busy this long after its time limit is killed


_OUT_OF_MEMORY = "out of memory: the query needs more memory than it may use (temporary tables, sorting)"


class QueryError(Exception):
    pass


class QueryProcessError(RuntimeError):
    """A query process could not be started or broke its protocol: the machine's failure, not the model's."""

    infrastructure_error = True


class _Refused(Exception):
    """Raised inside the fetch loop when the result outgrows its byte budget or the time limit."""


def _make_authorizer(refused: list):
    """An authorizer allowing reads and allow-listed function calls; it records what it refused."""
    def authorize(action, arg1, arg2, db_name, trigger):
        if action == sqlite3.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            if name in ALLOWED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            refused.append(f"function {arg2}() is not allowed")
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        refused.append("not authorized: the database is read-only and only SELECT queries are allowed")
        return sqlite3.SQLITE_DENY
    return authorize


class _Fetcher:
    """Byte and time accounting of one query's result conversion."""

    def __init__(self, max_bytes: int, deadline: float, time_limit_s: float):
        self.max_bytes, self.deadline, self.time_limit_s = max_bytes, deadline, time_limit_s
        self.used = 0

    def charge(self, n: int) -> None:
        self.used += n
        if self.used > self.max_bytes:
            raise _Refused(f"result too large: more than {self.max_bytes} bytes; select fewer rows or "
                           "columns, or shorten long values (LIMIT, substr, length)")
        if time.monotonic() > self.deadline:
            raise _Refused(f"query interrupted: time limit of {self.time_limit_s:g}s exceeded")

    def text(self, raw: bytes) -> str:  # the connection's text_factory: counts before decoding
        self.charge(len(raw))
        return raw.decode("utf-8")

    def row(self, row: tuple) -> tuple:
        self.charge(sum(len(v) if isinstance(v, bytes) else 0 if isinstance(v, str) else 8 for v in row))
        return row


def run_query(db_path, query: str, *, time_limit_s: float, max_rows: int,
              max_value_len: int = DEFAULT_MAX_VALUE_LEN, max_columns: int = DEFAULT_MAX_COLUMNS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              temp_in_memory: bool = False) -> tuple[list[str], list[tuple], bool]:
    """Run one read-only query in this process; returns (column names, rows (at most max_rows),
    truncated). The time limit holds between VM steps only (module docstring).

    Rows are fetched one by one; text and blob bytes (8 per other value) count against
    max_result_bytes, so at most max_result_bytes + max_columns * max_value_len bytes are converted.
    `temp_in_memory` keeps temporary tables in memory (the query process, where the heap is capped).
    Raises QueryError with a readable message for any SQL problem (syntax, refused write or function,
    timeout, result too large, out of memory).
    """
    uri = "file:" + urllib.parse.quote(str(db_path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
    refused: list[str] = []
    try:
        conn.execute("PRAGMA query_only = ON")
        if temp_in_memory:
            conn.execute("PRAGMA temp_store = MEMORY")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_len)
        conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, max_columns)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_make_authorizer(refused))
        deadline = time.monotonic() + time_limit_s
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
        fetcher = _Fetcher(max_result_bytes, deadline, time_limit_s)
        conn.text_factory = fetcher.text
        try:
            cur = conn.execute(query)
            cols = [d[0] for d in cur.description] if cur.description else []
            rows = []
            while len(rows) <= max_rows:
                row = cur.fetchone()
                if row is None:
                    break
                rows.append(fetcher.row(row))
        except _Refused as e:
            raise QueryError(str(e)) from None
        except sqlite3.Warning as e:  # e.g. several statements in one query
            raise QueryError(f"{e}") from None
        except sqlite3.Error as e:
            msg = str(e)
            if "interrupted" in msg:
                msg = f"query interrupted: time limit of {time_limit_s:g}s exceeded"
            elif "not authorized" in msg:
                msg = refused[0] if refused else "not authorized"
            elif "too many columns" in msg:
                msg = f"{msg} (at most {max_columns} columns)"
            elif "too big" in msg:
                msg = f"{msg} (values are limited to {max_value_len} bytes)"
            elif "out of memory" in msg:
                msg = _OUT_OF_MEMORY
            raise QueryError(msg) from None
        except UnicodeDecodeError:
            raise QueryError("a text value is not valid UTF-8") from None
        except MemoryError:  # SQLITE_NOMEM, e.g. at the heap limit of a query process
            raise QueryError(_OUT_OF_MEMORY) from None
        except (OverflowError, ValueError) as e:
            raise QueryError(f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()
    truncated = len(rows) > max_rows
    return cols, rows[:max_rows], truncated


# ------------------------------------------------------------------------------------------------
# The query process (this file run as a program) and the pool that runs queries in it
# ------------------------------------------------------------------------------------------------
def _encode(v):
    return {"b": v.hex()} if isinstance(v, bytes) else v


def _decode(v):
    if isinstance(v, dict):
        return bytes.fromhex(v["b"])
    return v


def serve(heap_limit_bytes: int) -> None:
    """The query process: one JSON request per line on stdin, one JSON answer per line on stdout; exits
    when stdin closes."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG) instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    conn = sqlite3.connect(":memory:")
    got = conn.execute(f"PRAGMA hard_heap_limit = {int(heap_limit_bytes)}").fetchone()  # process-wide
    conn.close()
    out = sys.stdout.buffer
    if got is None or got[0] != int(heap_limit_bytes):  # an SQLite before 3.31 ignores the pragma
        out.write(json.dumps({"failed": f"SQLite {sqlite3.sqlite_version} cannot cap its heap "
                                        "(PRAGMA hard_heap_limit needs 3.31 or later)"}).encode() + b"\n")
        out.flush()
        sys.exit(2)
    out.write(json.dumps({"ready": os.getpid()}).encode() + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + req["time_limit_s"]) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        try:
            cols, rows, truncated = run_query(
                req["db"], req["query"], time_limit_s=req["time_limit_s"], max_rows=req["max_rows"],
                max_value_len=req["max_value_len"], max_columns=req["max_columns"],
                max_result_bytes=req["max_result_bytes"], temp_in_memory=True)
            answer = {"cols": cols, "rows": [[_encode(v) for v in r] for r in rows], "truncated": truncated}
        except QueryError as e:
            answer = {"error": str(e)}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


def _read_line(fd: int, deadline: float | None, cap: int) -> bytes | None:
    """One line from `fd`, without its newline; None at the deadline; b"" at EOF; raises QueryError
    for a line longer than `cap`."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
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
    return buf[:-1]


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
            proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__),
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
            line = _read_line(proc.stdout.fileno(), time.monotonic() + 30.0, 1024)
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
            max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> tuple[list[str], list[tuple], bool]:
        """`run_query` in a query process, answered or killed by `time_limit_s + grace_s` after the
        request was sent. Raises QueryError as run_query does, QueryProcessError when no query
        process can be started."""
        proc = self._acquire()
        req = {"db": str(db_path), "query": query, "time_limit_s": float(time_limit_s), "max_rows": int(max_rows),
               "max_value_len": int(max_value_len), "max_columns": int(max_columns),
               "max_result_bytes": int(max_result_bytes)}
        cap = 16 * (max_result_bytes + max_columns * max_value_len) + (1 << 16)  # JSON of the largest answer
        deadline = time.monotonic() + time_limit_s + self.grace_s
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            line = _read_line(proc.stdout.fileno(), deadline, cap)
        except (OSError, QueryError) as e:
            self._discard(proc)
            if isinstance(e, QueryError):
                raise
            raise QueryError(f"the query process failed ({type(e).__name__})") from None
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


if __name__ == "__main__":
    serve(int(sys.argv[1]))
