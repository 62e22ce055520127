"""InterCode-SQL-style environment on SQLite: explore with queries, then submit one answer query.

No dimension legend: host-side Python, no arrays.

Databases are built from the project's own SQL scripts (jaxagent/envs/host/data/sql/*.sql) into a cache
directory (`cache_dir`, default $JAXAGENT_CACHE/sql or ~/.cache/jaxagent/sql; the file name carries a
hash of the script, the build is atomic) and opened per query read-only: URI `mode=ro`,
`PRAGMA query_only`, an authorizer that allows only reading (SELECT, READ, RECURSIVE, and calls of
the functions in ALLOWED_FUNCTIONS: no ATTACH, PRAGMA, writes, schema changes, extension loading or
functions such as fts3_tokenizer that expose host internals), a per-query time limit that covers
running, fetching and converting the result (progress handler plus a clock check per fetched row and
text value), and size limits: `max_value_len` bytes per value and `max_columns` columns (both enforced
by SQLite, so one row is at most their product), `max_result_bytes` bytes converted in all (a larger
result is an error, not a truncation) and rows (`max_fetch_rows` fetched, `max_obs_rows` shown).

Actions (documented in `system_prompt`):
  ```sql <query> ```              run the query; the observation is its result table or the error
                                  (several blocks: the last one runs)
  <answer> <query> </answer>      submit: the episode ends; reward 1 if the result equals the gold
                                  query's result, else 0
Also accepted: Qwen3 tool calls `execute_sql` / `submit` with {"query": ...}.
Result comparison: rows as tuples (floats rounded to 6 decimals); as a multiset, or as a list when the
gold query has a top-level ORDER BY. Column names are ignored; column order matters.
valid=False means no query could be found in the action (format error); SQL errors, refused writes and
timeouts are valid actions with `error` and `tool_error` set.
Anchor: hash of (task id, the normalised result of the last query run, or its error class; "start"
before any query; "submitted" and success after a submission). An invalid action changes nothing.
upper_bound_turns = 1 (the schema is in the system prompt, so submitting the reference query is a
one-turn solution).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
import sqlite3
import time
import urllib.parse
from pathlib import Path

from jaxagent.envs.host.data.sql_tasks import SQL_TASKS
from jaxagent.envs.host.base import (HostEnv, coerce_action, make_info, parse_tool_calls, split_tasks,
                                stable_hash, strip_think)

_SCRIPT_DIR = Path(__file__).parent / "data" / "sql"
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
_ORDER_BY_RE = re.compile(r"\border\s+by\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class SQLTask:
    id: str
    db: str
    question: str
    gold: str
    ordered: bool


@dataclasses.dataclass(frozen=True)
class SQLState:
    task: SQLTask
    turn: int = 0
    done: bool = False
    anchor: int = 0  # the GiGPO anchor of this state (module docstring)


def default_cache_dir() -> Path:
    root = os.environ.get("JAXAGENT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxagent")
    return Path(root) / "sql"


def build_database(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (once) the SQLite file of script `name` and return its path; the file is made read-only."""
    script_path = _SCRIPT_DIR / f"{name}.sql"
    if not script_path.is_file():
        raise ValueError(f"unknown database {name!r}; scripts: {sorted(p.stem for p in _SCRIPT_DIR.glob('*.sql'))}")
    script = script_path.read_text()
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}-{digest}.sqlite"
    if path.is_file():
        return path
    tmp = cache / f".{name}-{digest}-{os.getpid()}-{time.monotonic_ns()}.tmp"
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(script)
        conn.commit()
    finally:
        conn.close()
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)
    return path


class QueryError(Exception):
    pass


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


def run_query(db_path: Path, query: str, *, time_limit_s: float, max_rows: int,
              max_value_len: int = DEFAULT_MAX_VALUE_LEN, max_columns: int = DEFAULT_MAX_COLUMNS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> tuple[list[str], list[tuple], bool]:
    """Run one read-only query; returns (column names, rows (at most max_rows), truncated).

    Rows are fetched one by one; text and blob bytes (8 per other value) count against
    max_result_bytes, so at most max_result_bytes + max_columns * max_value_len bytes are converted.
    Raises QueryError with a readable message for any SQL problem (syntax, refused write or function,
    timeout, result too large).
    """
    uri = "file:" + urllib.parse.quote(str(db_path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
    refused: list[str] = []
    try:
        conn.execute("PRAGMA query_only = ON")
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
            raise QueryError(msg) from None
        except UnicodeDecodeError:
            raise QueryError("a text value is not valid UTF-8") from None
        except (OverflowError, MemoryError, ValueError) as e:
            raise QueryError(f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()
    truncated = len(rows) > max_rows
    return cols, rows[:max_rows], truncated


def _norm_value(v):
    if isinstance(v, float):
        return round(v, 6) + 0.0
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def normalize_rows(rows: list[tuple]) -> list[tuple]:
    return [tuple(_norm_value(v) for v in r) for r in rows]


def results_match(got: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """Execution-result match: same rows (floats to 6 decimals), as lists if ordered else multisets."""
    a, b = normalize_rows(got), normalize_rows(gold)
    if ordered:
        return a == b
    return collections.Counter(a) == collections.Counter(b)


def format_table(cols: list[str], rows: list[tuple], truncated: bool, max_cell: int = 80) -> str:
    def cell(v):
        s = "NULL" if v is None else (repr(v) if isinstance(v, (bytes, float)) else str(v))
        s = " ".join(s.split()) if isinstance(v, str) else s
        return s if len(s) <= max_cell else s[: max_cell - 3] + "..."

    if not cols:
        return "(query returned no columns)"
    lines = [" | ".join(cell(c) for c in cols)]
    lines.append("-" * min(len(lines[0]), 120))
    lines.extend(" | ".join(cell(v) for v in r) for r in rows)
    n = f"{len(rows)}+ rows, only the first {len(rows)} shown" if truncated else f"{len(rows)} row" + (
        "" if len(rows) == 1 else "s")
    lines.append(f"({n})")
    return "\n".join(lines)


_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_SQL_BLOCK_RE = re.compile(r"```(?:sql|sqlite)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


def _strip_fences(q: str) -> str:
    m = _SQL_BLOCK_RE.search(q)
    return (m.group(1) if m else q).strip()


def parse_sql_action(text: str) -> tuple[str | None, str | None, str | None]:
    """(kind, query, error) with kind 'execute' | 'submit'; error says why no query was found."""
    text = strip_think(text)
    calls = parse_tool_calls(text)
    if calls:
        if len(calls) != 1:
            return None, None, "make exactly one call per message"
        c = calls[0]
        if c.error:
            return None, None, c.error
        kind = {"execute_sql": "execute", "execute": "execute", "query": "execute",
                "submit": "submit", "submit_answer": "submit"}.get(c.name)
        if kind is None:
            return None, None, f"unknown function {c.name!r}; use execute_sql or submit"
        q = c.arguments.get("query", c.arguments.get("sql"))
        if not isinstance(q, str) or not q.strip():
            return None, None, f"{c.name} needs a non-empty string argument 'query'"
        return kind, q.strip(), None
    answers = _ANSWER_RE.findall(text)
    if answers:
        q = _strip_fences(answers[-1])
        if not q:
            return None, None, "empty <answer>"
        return "submit", q, None
    blocks = [b.strip() for b in _SQL_BLOCK_RE.findall(text)]
    blocks = [b for b in blocks if b]
    if blocks:
        return "execute", blocks[-1], None
    return None, None, ("no SQL found: put a query in a ```sql code block to run it, or inside "
                        "<answer></answer> to submit it")


class SQLEnv(HostEnv):
    """Multi-turn SQL question answering over read-only SQLite databases (module docstring)."""

    name = "sql"

    def __init__(self, cache_dir: str | os.PathLike | None = None, time_limit_s: float = 2.0,
                 max_obs_rows: int = 30, max_fetch_rows: int = 10_000, max_query_chars: int = 4000,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES):
        if time_limit_s <= 0 or max_obs_rows <= 0 or max_fetch_rows < max_obs_rows:
            raise ValueError("SQLEnv needs time_limit_s > 0 and 0 < max_obs_rows <= max_fetch_rows")
        if max_result_bytes <= 0:
            raise ValueError(f"SQLEnv needs max_result_bytes > 0, got {max_result_bytes}")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.time_limit_s = float(time_limit_s)
        self.max_obs_rows = int(max_obs_rows)
        self.max_fetch_rows = int(max_fetch_rows)
        self.max_query_chars = int(max_query_chars)
        self.max_result_bytes = int(max_result_bytes)
        self._tasks = tuple(SQLTask(id=t["id"], db=t["db"], question=t["question"], gold=t["gold"],
                                    ordered=bool(t.get("ordered", _ORDER_BY_RE.search(t["gold"]))))
                            for t in SQL_TASKS)
        self._paths = {db: build_database(db, self.cache_dir) for db in sorted({t.db for t in self._tasks})}
        self._gold_cache: dict[str, list[tuple]] = {}
        self._schema_cache: dict[str, str] = {}

    # -- data ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[SQLTask]:
        return split_tasks(list(self._tasks), split)

    def db_path(self, task: SQLTask) -> Path:
        return self._paths[task.db]

    def schema(self, db: str) -> str:
        if db not in self._schema_cache:
            _, rows, _ = run_query(self._paths[db], "SELECT sql FROM sqlite_master WHERE type = 'table' "
                                   "ORDER BY rowid", time_limit_s=5.0, max_rows=1000)
            self._schema_cache[db] = "\n".join(r[0].strip() + ";" for r in rows)
        return self._schema_cache[db]

    def gold_rows(self, task: SQLTask) -> list[tuple]:
        if task.id not in self._gold_cache:
            _, rows, truncated = run_query(self._paths[task.db], task.gold, time_limit_s=10.0,
                                           max_rows=self.max_fetch_rows, max_result_bytes=self.max_result_bytes)
            if truncated:
                raise ValueError(f"gold query of {task.id} returns more than {self.max_fetch_rows} rows")
            self._gold_cache[task.id] = rows
        return self._gold_cache[task.id]

    def system_prompt(self, task: SQLTask) -> str:
        return (
            "You answer questions about a SQLite database by writing SQL.\n"
            "To run a query and see its result, write it in a ```sql code block; you will see up to "
            f"{self.max_obs_rows} rows of the result, or the error. Run one query per message.\n"
            "When you are sure, submit your final query inside <answer></answer> tags, e.g. "
            "<answer>SELECT name FROM t</answer>. Submitting ends the episode: the answer is correct "
            "if its result has the same rows and columns as the correct query's (row order matters "
            "only if the question asks for an order).\n"
            "The database is read-only: only SELECT queries are allowed.\n\n"
            f"Database schema:\n{self.schema(task.db)}"
        )

    def upper_bound_turns(self, task: SQLTask) -> int:
        return 1

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int, task: SQLTask) -> tuple[SQLState, str]:
        if not isinstance(task, SQLTask):
            raise ValueError(f"SQLEnv.reset needs an SQLTask, got {type(task).__name__}")
        return SQLState(task=task, anchor=stable_hash([task.id, "start"])), task.question

    def anchor(self, state: SQLState) -> int:
        return state.anchor

    def step(self, state: SQLState, action_text: str):
        if not isinstance(state, SQLState):
            raise ValueError(f"SQLEnv.step needs an SQLState, got {type(state).__name__}")
        if state.done:
            raise ValueError("SQLEnv.step called on a finished episode")
        task = state.task
        nxt = dataclasses.replace(state, turn=state.turn + 1)
        text, err = coerce_action(action_text)
        kind = query = None
        if err is None:
            kind, query, err = parse_sql_action(text)
        if err is None and len(query) > self.max_query_chars:
            err = f"query too long ({len(query)} characters, limit {self.max_query_chars})"
        if err is not None:
            return nxt, f"Error: {err}", 0.0, False, make_info(
                valid=False, success=False, anchor=state.anchor, next_anchor=nxt.anchor, error=err,
                tool_error=True, kind=None)
        try:
            cols, rows, truncated = run_query(self.db_path(task), query, time_limit_s=self.time_limit_s,
                                              max_rows=self.max_fetch_rows, max_result_bytes=self.max_result_bytes)
            qerr = None
        except QueryError as e:
            cols, rows, truncated, qerr = [], [], False, str(e)
        if kind == "submit":
            success = qerr is None and not truncated and results_match(rows, self.gold_rows(task), task.ordered)
            nxt = dataclasses.replace(nxt, done=True, anchor=stable_hash([task.id, "submitted", success]))
            obs = ("Submitted. Correct." if success else
                   f"Submitted. Your query failed: {qerr}" if qerr else "Submitted. Incorrect.")
            return nxt, obs, float(success), True, make_info(
                valid=True, success=success, anchor=state.anchor, next_anchor=nxt.anchor, error=qerr,
                tool_error=qerr is not None, kind="submit")
        if qerr is not None:
            obs = f"Error: {qerr}"
            key = [task.id, "error", qerr.split(":")[0]]
        else:
            shown = rows[: self.max_obs_rows]
            obs = format_table(cols, shown, truncated or len(rows) > self.max_obs_rows)
            key = [task.id, "result", len(cols), sorted(map(repr, normalize_rows(rows)))]
        nxt = dataclasses.replace(nxt, anchor=stable_hash(key))
        return nxt, obs, 0.0, False, make_info(
            valid=True, success=False, anchor=state.anchor, next_anchor=nxt.anchor, error=qerr,
            tool_error=qerr is not None, kind="execute")
