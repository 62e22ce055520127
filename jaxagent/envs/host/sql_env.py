"""InterCode-SQL-style environment on SQLite: explore with queries, then submit one answer query. `SQLEnv`.

Tasks: built in (23 hand-written questions over data/sql/*.sql, then data/sql_gen.py's 39 templates over 8 generated
databases; split by structure, `splits.structural_splits`), or Spider / InterCode-SQL from `data=DIR`
(`spider.load_spider`; what it left out and why in `self.report`). Every query (the model's, gold and schema
queries) runs read-only in a killable query process (`sql_query_pool.QueryRunner`, `sql_query.run_query`) with
size limits and a hard time limit (`time_limit_s` + `sql_query.DEFAULT_GRACE_S`; docs/sandbox.md).
Actions (stated in `system_prompt`): ```sql <query> ``` runs it (the observation is its result table or the error);
<answer> <query> </answer> submits, and the episode ends with the grader's score (`sql_grading.SQLGrader`: "exact",
"spider" or "intercode") as reward; Qwen3 tool calls `execute_sql` / `submit` also work. Solved: score 1.
valid=False: no query found; SQL errors, refused writes and time-outs are valid with `error` and `tool_error`.
`anchor`: hash of (task id, the last query's normalised result or error class, or "start" / "submitted" + score).
`upper_bound_turns` = 1 with the schema in the system prompt, 2 without it (`schema_in_prompt=False`).
In full: docs/host_study.md, "The envs" (SQL), "Data" and "Grading".

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import threading
import time
from pathlib import Path

from jaxagent.envs.host import splits as splits_lib
from jaxagent.envs.host.base import HostEnv, coerce_action, make_info, stable_hash
from jaxagent.envs.host.data import sql_gen
from jaxagent.envs.host.data.sql_tasks import SQL_TASKS
from jaxagent.envs.host.data.sql_worlds import HELDOUT_DBS
from jaxagent.envs.host.datasets import DatasetReport, cache_root
from jaxagent.envs.host.spider import LAYOUTS, detect_format, load_spider
from jaxagent.envs.host.sql_actions import format_table, parse_sql_action
from jaxagent.envs.host.sql_grading import SQLGrader, normalize_rows, results_match
from jaxagent.envs.host.sql_query import DEFAULT_HEAP_LIMIT_BYTES, DEFAULT_MAX_RESULT_BYTES, QueryError
from jaxagent.envs.host.sql_query_pool import QueryRunner
from jaxagent.envs.host.tasks import ORDER_BY_RE, SQLTask

_SCRIPT_DIR = Path(__file__).parent / "data" / "sql"
SCHEMA_QUERY = "SELECT name, sql FROM sqlite_master WHERE type = 'table'"  # how the no-schema reference reads it


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


class SQLEnv(HostEnv):
    """Multi-turn SQL question answering over read-only SQLite databases (module docstring)."""

    name = "sql"

    def __init__(self, cache_dir: str | os.PathLike | None = None, time_limit_s: float = 2.0,
                 max_obs_rows: int = 30, max_fetch_rows: int = 10_000, max_query_chars: int = 4000,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES, heap_limit_bytes: int = DEFAULT_HEAP_LIMIT_BYTES,
                 data=None, seed: int = sql_gen.SEED, grading: str | None = None, keep_distinct: bool = False,
                 schema_in_prompt: bool = True, lenient_text: bool | None = None, data_format: str | None = None,
                 **data_kwargs):
        """data: a local Spider / InterCode-SQL directory (`spider.load_spider`, which `data_format` and
        `data_kwargs` go to); None: the built-in tasks (module docstring), generated with `seed`. grading: "exact" |
        "spider" | "intercode" (`sql_grading`; None: "exact" built in, else the data's own benchmark's), with
        `keep_distinct` for spider. schema_in_prompt: False leaves the schema out of the system prompt (InterCode's
        prompt). lenient_text: decode non-UTF-8 text with errors="ignore" (None: on loaded data only)."""
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
        if data is None and (data_kwargs or data_format is not None):
            extra = sorted(data_kwargs) + (["data_format"] if data_format is not None else [])
            raise ValueError(f"SQLEnv: {extra} are options of a data directory (data=...)")
        self.data_format = detect_format(data, data_format) if data is not None else None
        self.grader = SQLGrader(grading or self.data_format or "exact", keep_distinct=keep_distinct)
        self.schema_in_prompt = bool(schema_in_prompt)
        self.lenient_text = data is not None if lenient_text is None else bool(lenient_text)
        self.queries = QueryRunner(heap_limit_bytes=heap_limit_bytes)  # every query runs here, the gold ones too
        try:
            if data is not None:
                loaded = load_spider(data, max_rows=max_fetch_rows, max_result_bytes=max_result_bytes,
                                     queries=self.queries, data_format=self.data_format, prepare=self.grader.prepare,
                                     lenient_text=self.lenient_text, **data_kwargs)
                self._splits, self._paths, self.report = loaded.splits, loaded.db_paths, loaded.report
                self._gold_cache.update(loaded.gold_rows)
                self.split_notes = {"test": f"{LAYOUTS[self.data_format]}'s held-out split: {self.report.split_rule}"}
            else:
                self._splits, self._paths, self.report = self._builtin(seed)
                self.split_notes = splits_lib.notes(self.report.split_rule)
        except BaseException:
            self.queries.close()
            raise

    @property
    def grading_note(self) -> str:
        """How submissions are scored, for reports (`sql_grading.SQLGrader.note`)."""
        return self.grader.note + ("" if self.schema_in_prompt else "; no schema in the prompt (InterCode's)")

    def _builtin(self, seed: int):
        """The hand-written tasks, then the generated ones whose gold result equals the answer computed in
        Python (the others left out and counted in the report); split by structure (module docstring)."""
        held_dbs = (*HELDOUT_DBS, "library")
        report = DatasetReport(
            source="built in", layout=f"jaxagent SQL (hand-written + generated, seed {seed})",
            split_rule=f"by structure: held-out templates {', '.join(sql_gen.HELDOUT_TEMPLATES)} and databases "
                       f"{', '.join(held_dbs)} in 'test'; every 4th other task in 'test_constants'")
        tasks = [SQLTask(id=t["id"], db=t["db"], question=t["question"], gold=t["gold"],
                         ordered=bool(t.get("ordered", ORDER_BY_RE.search(t["gold"]))), template=t["id"])
                 for t in SQL_TASKS]
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
            tasks.append(SQLTask(id=t["id"], db=t["db"], question=t["question"], gold=t["gold"], ordered=t["ordered"],
                                 template=t["template"]))
            if self.grader.prepare(t["gold"]) == t["gold"]:  # else `gold_rows` runs the grader's form
                self._gold_cache[t["id"]] = rows
        splits = splits_lib.structural_splits(tasks, sql_gen.HELDOUT_TEMPLATES, held_dbs, db_of=lambda t: t.db)
        for name in ("train", splits_lib.STRUCTURAL, splits_lib.CONSTANTS):
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
        """The rows of the task's gold query in the grader's form (`SQLGrader.prepare`)."""
        if task.id not in self._gold_cache:
            _, rows, truncated = self.queries.run(self._paths[task.db], self.grader.prepare(task.gold),
                                                  time_limit_s=10.0, max_rows=self.max_fetch_rows,
                                                  max_result_bytes=self.max_result_bytes,
                                                  lenient_text=self.lenient_text)
            if truncated:
                raise ValueError(f"gold query of {task.id} returns more than {self.max_fetch_rows} rows")
            self._gold_cache[task.id] = rows
        return self._gold_cache[task.id]

    def system_prompt(self, task: SQLTask) -> str:
        schema = (f"Database schema:\n{self.schema(task.db)}" if self.schema_in_prompt else
                  "The schema is not shown: explore the database with queries, e.g. "
                  "SELECT name, sql FROM sqlite_master WHERE type = 'table'.")
        return (
            "You answer questions about a SQLite database by writing SQL.\n"
            "To run a query and see its result, write it in a ```sql code block; you will see up to "
            f"{self.max_obs_rows} rows of the result, or the error. Run one query per message.\n"
            "When you are sure, submit your final query inside <answer></answer> tags, e.g. "
            "<answer>SELECT name FROM t</answer>. Submitting ends the episode: the answer is correct "
            "if its result has the same rows and columns as the correct query's (row order matters "
            "only if the question asks for an order).\n"
            "The database is read-only: only SELECT queries are allowed.\n\n" + schema
        )

    def upper_bound_turns(self, task: SQLTask) -> int:
        return 1 if self.schema_in_prompt else 2

    def ground_truth_actions(self, task: SQLTask) -> list[str]:
        """The reference solution as assistant messages: the gold query submitted at once (without the schema in
        the prompt, after one query that reads it)."""
        read = [] if self.schema_in_prompt else [f"```sql\n{SCHEMA_QUERY}\n```"]
        return read + [f"<answer>{task.gold}</answer>"]

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
            cols, rows, truncated = self.queries.run(
                self.db_path(task), self.grader.prepare(query) if kind == "submit" else query,
                time_limit_s=self.time_limit_s, max_rows=self.max_fetch_rows, max_result_bytes=self.max_result_bytes,
                lenient_text=self.lenient_text)
            qerr = None
        except QueryError as e:
            cols, rows, truncated, qerr = [], [], False, str(e)
        if kind == "submit":
            score = 0.0
            if qerr is None and not truncated:
                ordered = self.grader.ordered(self.grader.prepare(task.gold), task.ordered)
                score = self.grader.score(rows, self.gold_rows(task), ordered)
            success = score == 1.0
            nxt = dataclasses.replace(nxt, done=True, anchor=stable_hash([task.id, "submitted", score]))
            obs = ("Submitted. Correct." if success else f"Submitted. Your query failed: {qerr}" if qerr else
                   f"Submitted. Incorrect (reward {score:g})." if score else "Submitted. Incorrect.")
            return nxt, obs, score, True, make_info(
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
