"""DeepCoder-style and APPS coding problems from local JSON / JSONL files, for `CodeEnv(data=DIR)` (`load_deepcoder`).

Records (`FORMATS`: "deepcoder" | "apps", or None: each record's `tests`, else its `input_output`): the fields of
agentica-org/DeepCoder-Preview-Dataset (`problem`, `tests`, `solutions`, `starter_code`, `metadata`; its parquet
converted to JSON first, nothing is downloaded here) or of APPS (`question`, `input_output`, `solutions`).
`parse_tests` reads TACO / APPS's {"inputs", "outputs", "fn_name"?} and LiveCodeBench / PrimeIntellect / Codeforces'
[{"input", "output", "testtype" | "type"}, ...] as function-call or standard-input tests; at most `max_tests` are
kept (`MAX_TESTS` = 15, the longest inputs: the DeepCoder reward's choice). Split: a file named *test* is held out,
with none a problem is when stable_hash(its statement) % 4 == 3. Each problem's reference is the first of its
solutions that passes every kept test in the env's sandbox; a record left out is counted by a reason naming the
field (`DatasetReport`). Verdicts are cached ($JAXAGENT_CACHE/code-verify.json), so a second load runs nothing.
Record fields, test formats and what is left out: docs/host_study.md, "Data" (Real data, Coding records in detail).

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Optional

from jaxagent.envs.host.datasets import (DataError, DatasetReport, cache_root, data_path, held_out_by_hash,
                                         nesting_depth, read_records, record_files)
from jaxagent.envs.host.tasks import CodeTask

MAX_TESTS = 15
MAX_DEPTH = 32  # nesting levels of a test's arguments or expected value (the sandbox answers at most ~50 deep)
MAX_LITERAL_CHARS = 100_000  # a field that is not JSON is read as a Python literal up to this length (~0.3 s)
_CALL_TYPES = ("functional", "function_call", "call", "fn_call")
_STDIN_TYPES = ("stdin", "stdin_stdout", "standard_input", "stdio")


class _Skip(Exception):
    """A record left out, with the reason."""


def _decode(value, what: str):
    """A field that may be a JSON (or Python-literal, as PrimeIntellect's, up to MAX_LITERAL_CHARS) string or the
    value itself; `what` names the field in the reason a record is left out."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except RecursionError:
        raise _Skip(f"field {what}: nested too deeply") from None
    except ValueError:
        pass
    if len(value) > MAX_LITERAL_CHARS:  # ast.literal_eval of a 1e6-element list takes ~13 s
        raise _Skip(f"field {what}: not JSON, and over {MAX_LITERAL_CHARS} characters to read as a Python literal")
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _Skip(f"field {what}: unreadable") from None


def _text(x, what: str, field: str) -> str:
    if isinstance(x, list) and all(isinstance(s, str) for s in x):
        return "\n".join(x)
    if isinstance(x, str):
        return x
    raise _Skip(f"field {field}: {what} not text")


def _call_args(x, field: str) -> list:
    """A function-call test's arguments: a list as it is; a string of one JSON value per line (LiveCodeBench)."""
    if isinstance(x, list):
        return x
    if isinstance(x, str):
        try:
            return [json.loads(line) for line in x.split("\n") if line.strip()]
        except (ValueError, RecursionError):
            raise _Skip(f"field {field}: function-call inputs unreadable") from None
    return [x]


def _call_output(x, field: str):
    if isinstance(x, str):
        try:
            return json.loads(x)
        except ValueError:
            return x
        except RecursionError:
            raise _Skip(f"field {field}: an expected output nested too deeply") from None
    return x


def parse_tests(tests, metadata: dict, field: str = "tests") -> tuple[str, list, str, bool]:
    """(style "call" | "stdin", [(args, expected)], function name or "", lenient_list) of a record's tests, read
    from its field `field` (formats: docs/host_study.md, "Data"); `_Skip` says why they cannot be used, naming the
    field."""
    tests = _decode(tests, field)
    fn_meta = metadata.get("func_name") or metadata.get("fn_name") or ""
    if isinstance(tests, dict):
        inputs, outputs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise _Skip(f"field {field}: unreadable (no equally long lists 'inputs' and 'outputs')")
        fn = tests.get("fn_name") or fn_meta
        if fn:
            return ("call", [(_call_args(i, field), _call_output(o, field)) for i, o in zip(inputs, outputs)],
                    str(fn), True)
        return ("stdin", [([_text(i, "input", field)], _text(o, "output", field)) for i, o in zip(inputs, outputs)],
                "", False)
    if isinstance(tests, list):
        if not all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
            raise _Skip(f"field {field}: unreadable (a test without 'input' and 'output')")
        styles, fns = set(), set()
        for t in tests:
            kind = str(t.get("testtype") or t.get("type") or "").lower()
            styles.add("call" if kind in _CALL_TYPES else "stdin" if kind in _STDIN_TYPES or not kind else kind)
            meta = t.get("metadata")
            meta = _decode(meta, f"{field} (a test's metadata)") if meta is not None else {}
            fns.add((meta.get("func_name") if isinstance(meta, dict) else None) or t.get("fn_name") or fn_meta)
        if len(styles) != 1:
            raise _Skip(f"field {field}: tests of mixed or unknown types")
        style = styles.pop()
        if style == "call":
            fn = next((f for f in fns if f), "")
            taco_graded = all("testtype" not in t for t in tests)  # PrimeIntellect's: DeepCoder grades them as TACO
            return ("call", [(_call_args(t["input"], field), _call_output(t["output"], field)) for t in tests],
                    str(fn), taco_graded)
        if style != "stdin":
            raise _Skip(f"field {field}: tests of mixed or unknown types")
        return ("stdin", [([_text(t["input"], "input", field)], _text(t["output"], "output", field)) for t in tests],
                "", False)
    raise _Skip(f"field {field}: unreadable (neither a dict of inputs and outputs nor a list of tests)")


def _longest(tests: list, n: int) -> list:
    """The n tests with the longest inputs (ties: the earlier), in their original order."""
    if len(tests) <= n:
        return tests
    size = [len(json.dumps(a)) for a, _ in tests]
    keep = sorted(sorted(range(len(tests)), key=lambda i: (-size[i], i))[:n])
    return [tests[i] for i in keep]


def _solutions(rec: dict) -> list:
    sols = rec.get("solutions")
    if sols is None:
        return []
    if isinstance(sols, str):
        try:
            sols = json.loads(sols)
        except (ValueError, RecursionError):
            sols = [sols]
    return [s for s in sols if isinstance(s, str) and s.strip()] if isinstance(sols, list) else []


class _VerdictCache:
    """Verdicts of reference runs {key: bool}, read from and written back to one JSON file (atomically)."""

    def __init__(self, path: Optional[Path]):
        self.path, self.new, self._lock = path, {}, threading.Lock()
        self.old = {}
        if path is not None and path.is_file():
            try:
                self.old = json.loads(path.read_text())
            except (ValueError, OSError):
                self.old = {}

    def get(self, key: str) -> Optional[bool]:
        with self._lock:
            return self.new.get(key, self.old.get(key))

    def put(self, key: str, passed: bool) -> None:
        with self._lock:
            self.new[key] = bool(passed)

    def save(self) -> None:
        if self.path is None or not self.new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({**self.old, **self.new}))
        os.replace(tmp, self.path)


def _verdict_key(task: CodeTask, code: str, limits) -> str:
    blob = json.dumps([task.style, task.entry_point, task.lenient_list, task.tests, code, dataclasses.asdict(limits)],
                      sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


FORMATS = {"deepcoder": ("tests", "DeepCoder-style problems"), "apps": ("input_output", "APPS problems")}


def _check_limits(max_tests, max_solutions, max_tasks) -> None:
    """The size options, checked before any record is read so that a bad one fails at once."""
    for name, v in (("max_tests", max_tests), ("max_solutions", max_solutions)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"coding data: {name} must be an integer >= 1, got {v!r}")
    if max_tasks is not None and (isinstance(max_tasks, bool) or int(max_tasks) != max_tasks or max_tasks < 1):
        raise ValueError(f"coding data: max_tasks must be an integer >= 1 or None, got {max_tasks!r}")


def _parse_record(rec, fields: tuple) -> tuple[str, str, list, str, bool]:
    """(problem statement, style, tests, function name, lenient_list) of one record whose tests are in the first of
    `fields` it has; `_Skip` says why it cannot be used, naming the field (a value that is not JSON: the field
    being read when it turned up)."""
    field = fields[0]
    try:
        if not isinstance(rec, dict):
            raise _Skip("record: not a JSON object (no fields)")
        problem = rec.get("problem") or rec.get("question")
        if not isinstance(problem, str) or not problem.strip():
            raise _Skip("field problem (or question): no problem statement")
        meta = _decode(rec.get("metadata") or {}, "metadata")
        field = next((f for f in fields if rec.get(f) is not None), None)
        if field is None:
            raise _Skip(f"field {' (or '.join(fields)}{')' * (len(fields) - 1)}: missing")
        style, tests, fn, lenient = parse_tests(rec[field], meta if isinstance(meta, dict) else {}, field)
        if not tests:
            raise _Skip(f"field {field}: no tests")
        if style == "call" and not fn.isidentifier():
            raise _Skip(f"field {field}: function-call tests without a function name (fn_name / func_name)")
        if nesting_depth(tests, MAX_DEPTH + 2) > MAX_DEPTH + 2:  # + the list of tests and (args, expected)
            raise _Skip(f"field {field}: a test nested deeper than {MAX_DEPTH} levels")
        json.dumps(tests)  # the sandbox takes JSON arguments
    except (TypeError, ValueError):
        raise _Skip(f"field {field}: not JSON values") from None
    return problem, style, tests, fn, lenient


def _code_task(rid: str, rec: dict, problem: str, style: str, tests: list, fn: str, lenient: bool,
               max_tests: int) -> CodeTask:
    """The task of a usable record, its reference still to be found (`_verify`)."""
    starter = rec.get("starter_code") if isinstance(rec.get("starter_code"), str) else ""
    prompt = problem.strip()
    if starter.strip():
        prompt += f"\n\nStarter code:\n```python\n{starter.rstrip()}\n```"
    return CodeTask(id=rid, entry_point=fn, prompt=prompt, reference="", tests=tuple(_longest(tests, max_tests)),
                    style=style, lenient_list=lenient, starter_code=starter)


def _candidates(files: list, fields: tuple, by_name: bool, report: DatasetReport, max_tasks: Optional[int],
                max_tests: int, max_solutions: int) -> dict:
    """{"train" | "test": [(task without its reference, its solutions to try)]}: the usable records of each split
    up to `max_tasks`, counted before any reference runs (they are the expensive part); the others are left out
    in `report` with their reasons."""
    candidates: dict[str, list] = {"train": [], "test": []}
    for file in files:
        for pos, rec in read_records(file):
            report.records += 1
            rid = f"{file.stem}-{pos}"
            try:
                problem, style, tests, fn, lenient = _parse_record(rec, fields)
            except _Skip as e:
                report.leave_out(str(e), rid)
                continue
            split = ("test" if "test" in file.stem.lower() else "train") if by_name else (
                "test" if held_out_by_hash(problem.strip()) else "train")
            if max_tasks is not None and len(candidates[split]) >= max_tasks:
                continue
            task = _code_task(rid, rec, problem, style, tests, fn, lenient, max_tests)
            candidates[split].append((task, _solutions(rec)[:max_solutions]))
    return candidates


def _verify(item, *, env, cache: _VerdictCache, require_reference: bool) -> tuple[CodeTask, Optional[str]]:
    """(task with its reference, None), (task, "") kept unverified, or (task, the reason it is left out)."""
    task, sols = item
    if not sols:
        return (task, "") if not require_reference else (task, "field solutions: no reference solution")
    for code in sols:
        key = _verdict_key(task, code, env.limits)
        ok = cache.get(key)
        if ok is None:
            ok = all(env.evaluate(task, code)[0])  # a SandboxError (infrastructure) propagates
            cache.put(key, ok)
        if ok:
            return dataclasses.replace(task, reference=code.strip() + "\n"), None
    return task, "field solutions: no solution passes its tests"


def _verified_splits(candidates: dict, env, cache: _VerdictCache, report: DatasetReport,
                     require_reference: bool) -> dict:
    """{"train" | "test": [CodeTask]}: the candidates whose reference passes (or kept unverified), verified on
    env.max_parallel threads; the verdicts are saved even when a run fails, so a rerun does not repeat them."""
    verify = functools.partial(_verify, env=env, cache=cache, require_reference=require_reference)
    splits: dict[str, list] = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=env.max_parallel) as pool:
            for split in ("train", "test"):
                kept = []
                for task, reason in pool.map(verify, candidates[split]):
                    if reason:
                        report.leave_out(reason, task.id)
                        continue
                    kept.append(task)
                    if reason == "":
                        report.keep(f"{split} without a reference (unverified)")
                splits[split] = kept
                report.keep(split, len(kept))
    finally:
        cache.save()
    return splits


def load_deepcoder(path, env, *, max_tests: int = MAX_TESTS, require_reference: bool = True,
                   max_tasks: Optional[int] = None, max_solutions: int = 3, cache_dir=None,
                   data_format: Optional[str] = None) -> tuple[dict, DatasetReport]:
    """({"train" | "test" | "all": [CodeTask]}, report) of a DeepCoder-style or APPS directory or file
    (docs/host_study.md, "Data"); `env` is the CodeEnv whose sandbox (limits, parallelism) verifies the references.
    `data_format`: "deepcoder" (tests in `tests`), "apps" (in `input_output`), None (either, per record)."""
    if data_format is not None and data_format not in FORMATS:
        raise DataError(f"coding data: --data-format must be one of {tuple(FORMATS)} for coding, got {data_format!r}")
    root = data_path(path, "coding data")
    _check_limits(max_tests, max_solutions, max_tasks)
    files = record_files(root)
    if not files:
        raise DataError(f"coding data {str(root)!r}: no *.json / *.jsonl files")
    by_name = any("test" in f.stem.lower() for f in files)
    rule = ("by file name: *test* held out, the rest train" if by_name else
            "by problem: held out when stable_hash(statement) % 4 == 3")
    fields = (FORMATS[data_format][0],) if data_format else ("tests", "input_output")
    report = DatasetReport(source=str(root), layout=FORMATS[data_format][1] if data_format else
                           "DeepCoder-style or APPS problems", split_rule=rule)
    candidates = _candidates(files, fields, by_name, report, max_tasks, max_tests, max_solutions)
    cache = _VerdictCache(Path(cache_dir) / "code-verify.json" if cache_dir is not None
                          else cache_root() / "code-verify.json")
    splits = _verified_splits(candidates, env, cache, report, require_reference)
    if not splits["train"] and not splits["test"]:
        raise DataError(f"coding data {str(root)!r}: no usable problem ({report.summary()})")
    splits["all"] = splits["train"] + splits["test"]
    return splits, report
