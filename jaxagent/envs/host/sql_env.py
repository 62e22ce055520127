"""InterCode-SQL-style environment on SQLite: explore with queries, then submit one answer query.

No dimension legend: host-side Python, no arrays.

Tasks. Built in (`data=None`): the 23 hand-written questions over the project's own databases
(data/sql/*.sql: shop, school, library) followed by the generated ones (data/sql_gen.py: template questions
over 8 generated databases, each gold query kept only when SQLite's result equals the answer computed in
Python; 892 tasks); every 4th task of that list is held out (`base.split_tasks`: 687 train, 228
held-out). The built-in databases are built from their scripts into a cache directory (`cache_dir`,
default $JAXAGENT_CACHE/sql or ~/.cache/jaxagent/sql; the file name carries a hash of the script, the
build is atomic). With `data=DIR`: Spider or InterCode-SQL questions and Spider's SQLite databases read
from a local directory (`spider.load_spider`; its splits and the questions it leaves out, e.g. a gold
query that fails, are in `self.report`). The model's queries run in query processes
(`sql_query_pool.QueryRunner`), each opening the database read-only per query (`sql_query.run_query`: URI
`mode=ro`, `PRAGMA query_only`, an authorizer that allows only reading and the functions in
ALLOWED_FUNCTIONS) with size limits (`max_value_len` bytes per value, `max_columns` columns,
`max_result_bytes` bytes converted in all, a larger result being an error, not a truncation; rows:
`max_fetch_rows` fetched, `max_obs_rows` shown). The time limit is hard: a query answers within
`time_limit_s` of starting it or its process is killed `sql_query.DEFAULT_GRACE_S` later, so the query runs at
most time_limit_s + 0.15 s and leaves nothing running (docs/sandbox.md has the step's bound); temporary data stays
in the query process's memory, capped at `heap_limit_bytes` (64 MiB; no temp files). The gold and schema queries
run in the same query processes (a dataset's gold query is not trusted to end).

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
import random
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

from jaxagent.envs.host.base import (HostEnv, check_slip_fix, coerce_action, make_info, parse_tool_calls,
                                     split_tasks, stable_hash, strip_think)
from jaxagent.envs.host.data import sql_gen
from jaxagent.envs.host.data.sql_tasks import SQL_TASKS
from jaxagent.envs.host.datasets import DatasetReport, cache_root
from jaxagent.envs.host.spider import load_spider
from jaxagent.envs.host.sql_query import DEFAULT_HEAP_LIMIT_BYTES, DEFAULT_MAX_RESULT_BYTES, QueryError
from jaxagent.envs.host.sql_query_pool import QueryRunner
from jaxagent.envs.host.tasks import ORDER_BY_RE, SQLTask

_SCRIPT_DIR = Path(__file__).parent / "data" / "sql"
@dataclasses.dataclass(frozen=True)
class SQLState:
    task: SQLTask
    turn: int = 0
    done: bool = False
    anchor: int = 0  # the GiGPO anchor of this state (module docstring)


def default_cache_dir() -> Path:
    return cache_root() / "sql"


def build_database(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (once) the SQLite file of script `name` (data/sql/<name>.sql) and return its path; the file is
    made read-only."""
    script_path = _SCRIPT_DIR / f"{name}.sql"
    if not script_path.is_file():
        raise ValueError(f"unknown database {name!r}; scripts: {sorted(p.stem for p in _SCRIPT_DIR.glob('*.sql'))}")
    return build_script(name, script_path.read_text(), cache_dir)


def build_script(name: str, script: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (once) the SQLite file of an SQL script and return its path; the file is made read-only."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}-{digest}.sqlite"
    if path.is_file():
        return path
    tmp = cache / f".{name}-{digest}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}.tmp"
    conn = sqlite3.connect(tmp)
    try:
        # a private file renamed into place once complete: no journal or sync needed while it is written
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.executescript(script)
        conn.commit()
    finally:
        conn.close()
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)
    return path


def _norm_value(v):
    if isinstance(v, float):
        return round(v, 6) + 0.0
    if isinstance(v, memoryview):
        return bytes(v)
    return v


_LITERAL_RE = re.compile(r"'(?:[^']|'')*'")
_AGGREGATES = ("AVG", "SUM", "MIN", "MAX")
_AGGREGATE_RE = re.compile(r"\b(AVG|SUM|MIN|MAX)\(")
_COMPARISON_RE = re.compile(r" (<=|>=|<|>) ")
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
_CONDITION_RE = re.compile(r" WHERE .*?(?= GROUP BY | ORDER BY |$)")
SLIP_KINDS = ("drop_condition", "swap_aggregate", "flip_comparison")


def _slip_options(query: str) -> tuple[list, Callable[[str], str]]:
    """([(kind, [candidate text, ...]), ...] in SLIP_KINDS order for the slips that apply to `query`, with its
    string literals hidden; and the function that puts them back)."""
    literals: list[str] = []

    def hide(m):
        literals.append(m.group(0))
        return f"\x00{len(literals) - 1}\x00"

    text = _LITERAL_RE.sub(hide, query)
    options = []
    if "(SELECT" not in text.upper() and _CONDITION_RE.search(text):
        options.append(("drop_condition", [_CONDITION_RE.sub("", text, count=1)]))
    m = _AGGREGATE_RE.search(text)
    if m:
        options.append(("swap_aggregate", [text[:m.start(1)] + a + text[m.end(1):]
                                           for a in _AGGREGATES if a != m.group(1)]))
    if _COMPARISON_RE.search(text):
        options.append(("flip_comparison",
                        [_COMPARISON_RE.sub(lambda c: f" {_FLIPPED[c.group(1)]} ", text, count=1)]))
    return options, lambda t: re.sub(r"\x00(\d+)\x00", lambda g: literals[int(g.group(1))], t)


def slip_query(query: str, seed: int) -> tuple[str, str] | None:
    """(kind, query'): the query with one generic mistake a noisy expert makes, chosen by `seed` among those
    that apply (SLIP_KINDS): drop_condition cuts the top-level WHERE clause (not in a query with a subquery),
    swap_aggregate replaces the first AVG/SUM/MIN/MAX with another of them, flip_comparison turns the first
    comparison around (< and >, <= and >=). String literals are left as they are. None where no slip applies.
    The toy host base imitates these slips at a rate (`study.host.sft.HostSFTSettings.noise`), as the FrozenLake
    toy base imitates an epsilon-noisy expert: a mistake that is the same on every task, which RL can unlearn."""
    options, restore = _slip_options(query)
    if not options:
        return None
    rng = random.Random(seed)
    kind, candidates = options[rng.randrange(len(options))]
    return kind, restore(rng.choice(candidates) if len(candidates) > 1 else candidates[0])


def query_slips(query: str) -> set[str]:
    """Every query `slip_query` can make of `query` (each kind, each other aggregate), literals left as they are."""
    options, restore = _slip_options(query)
    return {restore(c) for _, candidates in options for c in candidates}


MISTAKE_KINDS = ("solved", "slip", "slip and value", "value", "other", "no submission")


def submission_mistake(gold: str, actions: list[str], solved: bool) -> str:
    """What is wrong with an episode's submission (MISTAKE_KINDS): 'solved'; 'no submission' (no <answer> or submit
    call in its replies); 'slip' (the gold query with one of `query_slips`' mistakes); 'slip and value' (that,
    with other string or number literals); 'value' (the gold query's form with other literals: a value copied
    wrong); 'other'. Whitespace is compared as written: the toy model writes the reference's spacing."""
    if solved:
        return "solved"
    submitted = None
    for text in actions:
        kind, query, _ = parse_sql_action(text)
        if kind == "submit":
            submitted = query
    if submitted is None:
        return "no submission"
    slips = query_slips(gold)
    if submitted in slips:
        return "slip"

    def form(q):
        return _LITERAL_RE.sub("?", re.sub(r"\b\d+(\.\d+)?\b", "?", q))

    if form(submitted) in {form(q) for q in slips}:
        return "slip and value"
    return "value" if form(submitted) == form(gold) else "other"


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
    mistake_kinds = MISTAKE_KINDS

    def __init__(self, cache_dir: str | os.PathLike | None = None, time_limit_s: float = 2.0,
                 max_obs_rows: int = 30, max_fetch_rows: int = 10_000, max_query_chars: int = 4000,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES, heap_limit_bytes: int = DEFAULT_HEAP_LIMIT_BYTES,
                 data=None, seed: int = sql_gen.SEED, **data_kwargs):
        """data: a local Spider / InterCode-SQL directory (`spider.load_spider`, which `data_kwargs` go to);
        None: the built-in tasks (module docstring), generated with `seed`."""
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
        self._gold_cache: dict[str, list[tuple]] = {}
        self._schema_cache: dict[str, str] = {}
        if data is None and data_kwargs:
            raise ValueError(f"SQLEnv: {sorted(data_kwargs)} are options of a data directory (data=...)")
        self.queries = QueryRunner(heap_limit_bytes=heap_limit_bytes)  # every query runs here, the gold ones too
        try:
            if data is not None:
                loaded = load_spider(data, max_rows=max_fetch_rows, max_result_bytes=max_result_bytes,
                                     queries=self.queries, **data_kwargs)
                self._splits, self._paths, self.report = loaded.splits, loaded.db_paths, loaded.report
                self._gold_cache.update(loaded.gold_rows)
            else:
                self._splits, self._paths, self.report = self._builtin(seed)
        except BaseException:
            self.queries.close()
            raise

    def _builtin(self, seed: int):
        """The hand-written tasks, then the generated ones whose gold result equals the answer computed in
        Python (the others left out and counted in the report); every 4th held out."""
        report = DatasetReport(source="built in", layout="jaxagent SQL (hand-written + generated, seed "
                               f"{seed})", split_rule="every 4th task of the list held out")
        tasks = [SQLTask(id=t["id"], db=t["db"], question=t["question"], gold=t["gold"],
                         ordered=bool(t.get("ordered", ORDER_BY_RE.search(t["gold"])))) for t in SQL_TASKS]
        paths = {db: build_database(db, self.cache_dir) for db in sorted({t.db for t in tasks})}
        scripts, generated = sql_gen.generate(seed)
        paths.update({db: build_script(db, script, self.cache_dir) for db, script in scripts.items()})
        report.records = len(tasks) + len(generated)
        for t in generated:
            try:
                _, rows, truncated = self.queries.run(paths[t["db"]], t["gold"], time_limit_s=10.0,
                                                      max_rows=self.max_fetch_rows,
                                                      max_result_bytes=self.max_result_bytes)
            except QueryError as e:
                report.leave_out(f"gold query failed ({str(e).split(':')[0]})", t["id"])
                continue
            if truncated or not results_match(rows, t["expected"], t["ordered"]):
                report.leave_out("gold result differs from the computed answer", t["id"])
                continue
            tasks.append(SQLTask(id=t["id"], db=t["db"], question=t["question"], gold=t["gold"], ordered=t["ordered"]))
            self._gold_cache[t["id"]] = rows
        splits = {name: split_tasks(tasks, name) for name in ("train", "test", "all")}
        for name in ("train", "test"):
            report.keep(name, len(splits[name]))
        return splits, paths, report

    # -- data ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[SQLTask]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(self._splits)}")
        return list(self._splits[split])

    def close(self) -> None:
        """Stop the query processes (they also stop when the env is garbage-collected; a later step
        starts new ones)."""
        self.queries.close()

    def db_path(self, task: SQLTask) -> Path:
        return self._paths[task.db]

    def schema(self, db: str) -> str:
        if db not in self._schema_cache:
            _, rows, _ = self.queries.run(self._paths[db], "SELECT sql FROM sqlite_master WHERE type = 'table' "
                                          "ORDER BY rowid", time_limit_s=5.0, max_rows=1000)
            self._schema_cache[db] = "\n".join(r[0].strip() + ";" for r in rows if r[0])
        return self._schema_cache[db]

    def gold_rows(self, task: SQLTask) -> list[tuple]:
        if task.id not in self._gold_cache:
            _, rows, truncated = self.queries.run(self._paths[task.db], task.gold, time_limit_s=10.0,
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

    def ground_truth_actions(self, task: SQLTask) -> list[str]:
        """The reference solution as assistant messages: the gold query submitted at once."""
        return [f"<answer>{task.gold}</answer>"]

    def slipped_actions(self, task: SQLTask, seed: int, fix: float = 1.0) -> list[str] | None:
        """A noisy expert's slip on the reference (`slip_query` of the gold query, submitted at once), or None
        where no slip applies to it. `fix` plays no part: the submission ends the episode."""
        check_slip_fix(fix)
        slipped = slip_query(task.gold, seed)
        return None if slipped is None else [f"<answer>{slipped[1]}</answer>"]

    def checked_actions(self, task: SQLTask, seed: int, slip: bool) -> list[str]:
        """A two-turn reference: run a query first (the gold one, or with `slip` its `slip_query` where one
        applies), then submit the gold query."""
        slipped = slip_query(task.gold, seed) if slip else None
        first = task.gold if slipped is None else slipped[1]
        return [f"```sql\n{first}\n```", f"<answer>{task.gold}</answer>"]

    def submission_mistake(self, task: SQLTask, actions: list, solved: bool) -> str:
        """`submission_mistake` of the task's gold query (module function)."""
        return submission_mistake(task.gold, actions, solved)

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
            cols, rows, truncated = self.queries.run(self.db_path(task), query, time_limit_s=self.time_limit_s,
                                                     max_rows=self.max_fetch_rows,
                                                     max_result_bytes=self.max_result_bytes)
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
