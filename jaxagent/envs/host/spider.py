"""Spider and InterCode-SQL questions from a local directory, for `SQLEnv(data=DIR)`: `load_spider`.

Layouts (`data_format` "spider" | "intercode", else recognised by the files in DIR; a directory with both is refused
unless the format is named; nothing is downloaded):
  Spider: `train_spider.json`, `train_others.json`, `dev.json` and/or `test.json` (records with `db_id`, `query`,
      `question`), databases at `database/<db_id>/<db_id>.sqlite` (`test_database/...`). Train = train_spider +
      train_others, held out = dev (Spider's own split; test.json only without dev.json).
  InterCode-SQL (e.g. `ic_spider_dev.json`: records with `db`, `gold`, `query`) over the same databases: split by
      file name ("train" train, "dev" / "test" held out), or with one kind of file by database (held out when
      stable_hash(db) % 4 == 3); a pool of the benchmark's own evaluation files gets a warning in the report.
Tasks in file order, ids "<file stem>-<position>". A record is left out, counted by a reason naming its field
(`DatasetReport`), when a field is missing, its database name is not one plain name inside the data directory,
the database is missing, or its gold query fails on it (run once here in `sql_query_pool.QueryRunner`'s killable
processes, in the grader's form; its rows seed the env's cache). docs/host_study.md, "Data" and "The envs" (SQL).

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from jaxagent.envs.host.datasets import (DataError, DatasetReport, data_path, held_out_by_hash, read_records,
                                         record_files)
from jaxagent.envs.host.sql_query import DEFAULT_MAX_RESULT_BYTES, QueryError
from jaxagent.envs.host.sql_query_pool import QueryRunner
from jaxagent.envs.host.tasks import ORDER_BY_RE, SQLTask

SPIDER_FILES = {"train_spider.json": "train", "train_others.json": "train", "dev.json": "test", "test.json": "test"}
_FIELDS = {"spider": ("db_id", "query", "question"), "intercode": ("db", "gold", "query")}  # (db, gold, question)
FORMATS = tuple(_FIELDS)
LAYOUTS = {"spider": "Spider", "intercode": "InterCode-SQL"}


@dataclasses.dataclass
class SQLData:
    splits: dict                  # "train" | "test" | "all" -> [SQLTask]
    db_paths: dict                # db id -> Path of its SQLite file
    gold_rows: dict               # task id -> the gold query's rows
    report: DatasetReport


def _intercode_files(root: Path) -> list[Path]:
    """The record files of a directory that are not Spider's own (its question files and *tables*.json)."""
    return [f for f in record_files(root) if f.name not in SPIDER_FILES and "tables" not in f.stem.lower()]


def detect_format(path, data_format: Optional[str] = None) -> str:
    """The format of a SQL data path: `data_format` when given (checked), else "spider" when it holds Spider's
    question files, "intercode" otherwise. DataError when both kinds of file are there and no format is named."""
    if data_format is not None and data_format not in FORMATS:
        raise DataError(f"SQL data: --data-format must be one of {FORMATS} for SQL, got {data_format!r}")
    root = data_path(path, "SQL data")
    spider = root.is_dir() and any((root / name).is_file() for name in SPIDER_FILES)
    if data_format is not None:
        return data_format
    if spider and _intercode_files(root):
        names = ", ".join(f.name for f in _intercode_files(root)[:3])
        raise DataError(f"SQL data {str(root)!r} is ambiguous: it holds Spider's question files and other record "
                        f"files ({names}); name the format with --data-format spider or --data-format intercode")
    return "spider" if spider else "intercode"


def _layout(root: Path, data_format: str) -> tuple[list[tuple[Path, str]], str]:
    """([(file, split or "pool")], split rule) of a data directory in `data_format`."""
    if data_format == "spider":
        if not (root.is_dir() and any((root / name).is_file() for name in SPIDER_FILES)):
            raise DataError(f"SQL data {str(root)!r}: no Spider question files ({', '.join(SPIDER_FILES)})")
        files = [(root / name, split) for name, split in SPIDER_FILES.items() if (root / name).is_file()]
        if (root / "dev.json").is_file():
            files = [(f, s) for f, s in files if f.name != "test.json"]
        return files, "Spider's own: train_spider.json + train_others.json train, dev.json held out"
    files = _intercode_files(root) if root.is_dir() else [root]
    if not files:
        raise DataError(f"SQL data {str(root)!r}: no InterCode-SQL *.json / *.jsonl files (and no Spider files: "
                        f"{', '.join(SPIDER_FILES)})")

    def kind(path: Path) -> str:
        name = path.stem.lower()
        return "train" if "train" in name else "test" if ("dev" in name or "test" in name) else "pool"

    kinds = [(f, kind(f)) for f in files]
    if {k for _, k in kinds} >= {"train", "test"}:
        return ([(f, k if k != "pool" else "train") for f, k in kinds],
                "by file name: *train* train, *dev* / *test* held out")
    return ([(f, "pool" if k != "test" else "pool-test") for f, k in kinds],
            "by database: a database held out when stable_hash(db) % 4 == 3 (held-out databases unseen in training)")


def _database(root: Path, db: str) -> Optional[Path]:
    """The SQLite file of database `db` (module docstring); None when there is none. ValueError when `db` is not a
    plain name or its file resolves outside its database folder."""
    if db in (".", "..") or any(c in db for c in "/\\\0") or Path(db).name != db:
        raise ValueError("not a plain database name")
    base = root if root.is_dir() else root.parent
    for folder in (base / "database", base / "test_database", base):
        p = folder / db / f"{db}.sqlite"
        if p.is_file():
            if not p.resolve().is_relative_to(folder.resolve()):
                raise ValueError(f"its file resolves outside {folder}")
            return p
    return None


def load_spider(path, *, max_rows: int = 10_000, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                time_limit_s: float = 10.0, max_tasks: Optional[int] = None, queries: Optional[QueryRunner] = None,
                data_format: Optional[str] = None, prepare: Callable[[str], str] = lambda q: q,
                lenient_text: bool = True) -> SQLData:
    """The tasks, database paths and gold rows of a Spider or InterCode-SQL directory (module docstring). `queries`:
    the query processes that run the gold queries (default: a runner of its own, closed on return). `data_format`:
    "spider" | "intercode" | None (`detect_format`). `prepare`: the grader's form of a gold query, run to check it
    and to cache its rows. `lenient_text`: decode non-UTF-8 text with errors="ignore"."""
    if queries is None:
        runner = QueryRunner()
        try:
            return load_spider(path, max_rows=max_rows, max_result_bytes=max_result_bytes, time_limit_s=time_limit_s,
                               max_tasks=max_tasks, queries=runner, data_format=data_format, prepare=prepare,
                               lenient_text=lenient_text)
        finally:
            runner.close()
    data_format = detect_format(path, data_format)
    root = data_path(path, "SQL data")
    if max_tasks is not None and (isinstance(max_tasks, bool) or int(max_tasks) != max_tasks or max_tasks < 1):
        raise ValueError(f"SQL data: max_tasks must be an integer >= 1 or None, got {max_tasks!r}")
    files, rule = _layout(root, data_format)
    report = DatasetReport(source=str(root), layout=LAYOUTS[data_format], split_rule=rule)
    trained_on_test = 0
    splits: dict[str, list] = {"train": [], "test": []}
    paths: dict[str, Path] = {}
    gold: dict[str, list] = {}
    for file, split in files:
        for pos, rec in read_records(file):
            report.records += 1
            rid = f"{file.stem}-{pos}"
            fields = _FIELDS[data_format]
            missing = [k for k in fields if not (isinstance(rec, dict) and isinstance(rec.get(k), str)
                                                 and rec.get(k).strip())]
            if missing:
                report.leave_out(f"field {missing[0]}: missing or not text ({LAYOUTS[data_format]} records have "
                                 f"{', '.join(fields)})", rid)
                continue
            db, sql, question = (rec[k].strip() for k in fields)
            if db not in paths:
                try:
                    found = _database(root, db)
                except ValueError as e:
                    report.leave_out(f"field {fields[0]}: not a database inside the data directory ({e})", rid)
                    continue
                if found is None:
                    report.leave_out(f"field {fields[0]}: database file missing", rid)
                    continue
                paths[db] = found
            where = split if not split.startswith("pool") else ("test" if held_out_by_hash(db) else "train")
            if max_tasks is not None and len(splits[where]) >= max_tasks:
                continue
            try:
                _, rows, truncated = queries.run(paths[db], prepare(sql), time_limit_s=time_limit_s,
                                                 max_rows=max_rows, max_result_bytes=max_result_bytes,
                                                 lenient_text=lenient_text)
            except QueryError as e:
                report.leave_out(f"field {fields[1]}: gold query fails ({str(e).split(':')[0][:60]})", rid)
                continue
            if truncated:
                report.leave_out(f"field {fields[1]}: gold result over {max_rows} rows", rid)
                continue
            task = SQLTask(id=rid, db=db, question=question, gold=sql, ordered=bool(ORDER_BY_RE.search(sql)))
            splits[where].append(task)
            gold[rid] = rows
            trained_on_test += split == "pool-test" and where == "train"
    for name in ("train", "test"):
        report.keep(name, len(splits[name]))
    if trained_on_test:
        names = ", ".join(sorted({f.name for f, k in files if k == "pool-test"}))
        report.warnings.append(
            f"training on the benchmark's test questions: {trained_on_test} questions of the train split come from "
            f"{names}, {LAYOUTS[data_format]}'s evaluation set, so held-out scores are not comparable with its "
            "published ones (put a *train* file beside it to train on other questions)")
    if not splits["train"] and not splits["test"]:
        raise DataError(f"SQL data {str(root)!r}: no usable question ({report.summary()})")
    splits["all"] = splits["train"] + splits["test"]
    return SQLData(splits=splits, db_paths={db: p for db, p in paths.items()}, gold_rows=gold, report=report)
