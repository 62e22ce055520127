"""Read-only SQLite queries with limits, and the query process that runs them for `sql_query_pool`.

No dimension legend: host-side Python, no arrays.

`run_query(db_path, query, ...)` runs one query in this process: the database opened read-only (URI `mode=ro`,
`PRAGMA query_only`), an authorizer that allows only reading (SELECT, READ, RECURSIVE, and calls of the functions in
ALLOWED_FUNCTIONS: no ATTACH, PRAGMA, writes, schema changes, extension loading or functions such as fts3_tokenizer
that expose host internals), a time limit that covers running, fetching and converting the result (a progress
handler plus a clock check per fetched row and text value), and size limits: `max_value_len` bytes per value,
`max_columns` columns, `max_result_bytes` bytes converted in all (a larger result is an error, not a truncation)
and `max_rows` rows. In this process the time limit is checked between SQLite's VM steps only, and a single step
can run for many seconds: use it for trusted queries (gold answers, the schema). This file run as a program
(`python -I -S <this file> <heap limit>`, standard library only) is the query process (`serve`) of
`sql_query_pool.QueryRunner`, which makes these limits hard: docs/sandbox.md, "SQL queries".
"""
import json
import os
import sqlite3
import sys
import time
import urllib.parse

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
STARTED = b'{"started": true}'  # the query process's line when it starts a query (its time limit starts then)


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

    def __init__(self, max_bytes: int, deadline: float, time_limit_s: float, errors: str = "strict"):
        self.max_bytes, self.deadline, self.time_limit_s, self.errors = max_bytes, deadline, time_limit_s, errors
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
        return raw.decode("utf-8", self.errors)

    def row(self, row: tuple) -> tuple:
        self.charge(sum(len(v) if isinstance(v, bytes) else 0 if isinstance(v, str) else 8 for v in row))
        return row


def run_query(db_path, query: str, *, time_limit_s: float, max_rows: int,
              max_value_len: int = DEFAULT_MAX_VALUE_LEN, max_columns: int = DEFAULT_MAX_COLUMNS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              temp_in_memory: bool = False, lenient_text: bool = False) -> tuple[list[str], list[tuple], bool]:
    """Run one read-only query in this process; returns (column names, rows (at most max_rows),
    truncated). The time limit holds between VM steps only (module docstring).

    Rows are fetched one by one; text and blob bytes (8 per other value) count against
    max_result_bytes, so at most max_result_bytes + max_columns * max_value_len bytes are converted.
    `temp_in_memory` keeps temporary tables in memory (the query process, where the heap is capped).
    `lenient_text` decodes text that is not UTF-8 with errors="ignore" (Spider's official evaluation does; else
    such a value is a QueryError).
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
        fetcher = _Fetcher(max_result_bytes, deadline, time_limit_s, "ignore" if lenient_text else "strict")
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
# The query process (this file run as a program: `sql_query_pool.QueryRunner` starts it)
# ------------------------------------------------------------------------------------------------
def _encode(v):
    return {"b": v.hex()} if isinstance(v, bytes) else v


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
        out.write(STARTED + b"\n")
        out.flush()
        try:
            cols, rows, truncated = run_query(
                req["db"], req["query"], time_limit_s=req["time_limit_s"], max_rows=req["max_rows"],
                max_value_len=req["max_value_len"], max_columns=req["max_columns"],
                max_result_bytes=req["max_result_bytes"], temp_in_memory=True,
                lenient_text=req.get("lenient_text", False))
            answer = {"cols": cols, "rows": [[_encode(v) for v in r] for r in rows], "truncated": truncated}
        except QueryError as e:
            answer = {"error": str(e)}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
