"""Multi-turn coding with unit tests (DeepCoder-MT style): submit code, read the failing test, fix it. `CodeEnv`.

Tasks: the built-in problems (data/code_tasks.py, data/code_gen.py, data/code_gen_long.py; split by structure,
`splits.structural_splits`), `tasks=` dicts, or DeepCoder-style / APPS problems from `data=DIR`
(`deepcoder.load_deepcoder`); task styles "function", "call" and "stdin" (`CodeTask.style`).
Action: a Python solution in a ```python block (the last one), run in the sandbox (`sandbox.run_calls`,
docs/sandbox.md) on every unit test; values are compared outside it (`graders`). Observation: "All N tests passed."
or the number passed and the first failing test. Reward 1 when every test passes (the episode ends), else 0.
`step_quality(state, action)` = the action's unit-test pass rate (docs/study.md finding 3). valid=False: no code
block. `anchor`: hash of (task id, the latest submission's pass/fail vector). `upper_bound_turns` = 1.
A program resubmitted on the same tests reuses its kept result (`cache_size`); at most `max_parallel` sandbox runs at
once; a sandbox that is unavailable or fails to set up raises `sandbox.SandboxError`, never scores the action 0.
Task styles, observations, result reuse and concurrency in full: docs/host_study.md, "The envs" (Coding).

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import re
import threading
from typing import Optional

from jaxagent.envs.host import splits as splits_lib
from jaxagent.envs.host.base import (HostEnv, coerce_action, host_cores, make_info, split_tasks, stable_hash,
                                     strip_think)
from jaxagent.envs.host.data import code_gen
from jaxagent.envs.host.data.code_tasks import CODE_TASKS
from jaxagent.envs.host.datasets import DatasetReport
from jaxagent.envs.host.deepcoder import load_deepcoder
from jaxagent.envs.host.graders import outcome_matches, stdout_matches, values_equal  # noqa: F401
from jaxagent.envs.host.sandbox import SandboxLimits, SandboxResult, run_calls
from jaxagent.envs.host.tasks import CodeTask

STYLES = ("function", "call", "stdin")
DRIVER_ENTRY = "_jaxagent_entry"  # the driver module's function the sandbox calls
# Imports the public function-call graders (LiveCodeBench, TACO) make before a solution runs: LeetCode-style
# starter code uses `List[int]` annotations and modules it does not import.
CALL_PRELUDE = ("from typing import *\nimport bisect, collections, copy, functools, heapq, itertools, math, "
                "operator, re, string\nfrom collections import Counter, defaultdict, deque\n"
                "from functools import lru_cache, reduce\nfrom heapq import heappop, heappush\n"
                "from itertools import accumulate, combinations, permutations, product\n")


@dataclasses.dataclass(frozen=True)
class CodeState:
    task: CodeTask
    turn: int = 0
    done: bool = False
    passed: tuple | None = None  # per-test pass flags of the latest submission


_BLOCK_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The last ```python (or bare ```) block of `text`, or None."""
    blocks = [m.group(2) for m in _BLOCK_RE.finditer(strip_think(text))]
    blocks = [b for b in blocks if b.strip()]
    return blocks[-1] if blocks else None


def _short(v, n: int = 200) -> str:
    try:
        s = repr(v)
    except RecursionError:
        return "<a value nested too deeply to show>"
    return s if len(s) <= n else s[: n - 3] + "..."


def call_text(task: CodeTask, args) -> str:
    s = f"{task.entry_point}({', '.join(repr(a) for a in args)})"
    return s if len(s) <= 300 else s[:297] + "..."


_CALL_DRIVER = """\
_jaxagent_ns = {"__name__": "solution", "__builtins__": __builtins__}
exec(compile(%(prelude)r, "<prelude>", "exec"), _jaxagent_ns)
exec(compile(%(code)r, "<solution>", "exec"), _jaxagent_ns)


def _jaxagent_target():
    cls = _jaxagent_ns.get("Solution")
    if isinstance(cls, type) and callable(getattr(cls, %(name)r, None)):
        return getattr(cls(), %(name)r)
    fn = _jaxagent_ns.get(%(name)r)
    if callable(fn):
        return fn
    raise NameError("function %(name)s is not defined (neither a function nor a method of class Solution)")


_jaxagent_target()


def _jaxagent_entry(*args):
    return _jaxagent_target()(*args)
"""

_STDIN_DRIVER = """\
_jaxagent_code = compile(%(code)r, "<solution>", "exec")


def _jaxagent_entry(text):
    import io, os, sys
    with open("stdin.txt", "w", encoding="utf-8") as f:
        f.write(text)
    fd = os.open("stdin.txt", os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    out = io.BytesIO()
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", newline="\\n", write_through=True)
    ns = {"__name__": "__main__", "__builtins__": __builtins__, "exit": sys.exit, "quit": sys.exit}
    try:
        exec(_jaxagent_code, ns)
    except SystemExit:
        pass
    sys.stdout.flush()
    return out.getvalue().decode("utf-8", "replace")
"""


def driver(task: CodeTask, code: str) -> tuple[str, str]:
    """(module source, entry point) that the sandbox runs for `code` on `task` (docs/host_study.md, "The envs",
    Coding): the code itself for "function" tasks, a driver module holding it as a string for the loaded styles."""
    if task.style == "function":
        return code, task.entry_point
    if task.style == "call":
        return _CALL_DRIVER % {"prelude": CALL_PRELUDE, "code": code, "name": task.entry_point}, DRIVER_ENTRY
    if task.style == "stdin":
        return _STDIN_DRIVER % {"code": code}, DRIVER_ENTRY
    raise ValueError(f"task {task.id}: unknown style {task.style!r}; expected one of {STYLES}")


class CodeEnv(HostEnv):
    """Multi-turn coding against unit tests in a sandbox (module docstring)."""

    name = "code"

    def __init__(self, limits: SandboxLimits = SandboxLimits(), tasks: tuple | None = None, data=None,
                 max_parallel: Optional[int] = None, seed: int = code_gen.SEED, cache_size: int = 16384,
                 **data_kwargs):
        """limits: the sandbox's limits per submission. tasks: task dicts replacing the built-in set (the
        hand-written and generated problems, split by structure), every 4th held out. data: a local directory (or
        file) of DeepCoder-style or APPS problems (`deepcoder.load_deepcoder`, which `data_kwargs` go to:
        data_format, require_reference, ...). max_parallel:
        sandbox runs at once (default `host_cores()`). seed: the generated families' seed. cache_size: distinct
        programs whose results are kept for resubmissions (docs/host_study.md, "The envs", Coding; 0: every
        submission runs)."""
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"CodeEnv: cache_size must be an integer >= 0, got {cache_size!r}")
        self.cache_size = cache_size
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cache_lock = threading.Lock()
        self.sandbox_runs = self.cache_hits = 0
        self.limits = limits
        if max_parallel is None:
            max_parallel = host_cores()
        if isinstance(max_parallel, bool) or int(max_parallel) != max_parallel or max_parallel < 1:
            raise ValueError(f"CodeEnv: max_parallel must be an integer >= 1, got {max_parallel!r}")
        self.max_parallel = int(max_parallel)
        self._slots = threading.BoundedSemaphore(self.max_parallel)
        self.report = None
        self.split_notes = dict(splits_lib.SPLIT_NOTES)
        if data is not None:
            if tasks is not None:
                raise ValueError("CodeEnv: give tasks or data, not both")
            self._splits, self.report = load_deepcoder(data, self, **data_kwargs)
            self.split_notes = {"test": f"{self.report.layout}'s held-out split: {self.report.split_rule}"}
            return
        if data_kwargs:
            raise ValueError(f"CodeEnv: {sorted(data_kwargs)} are options of a data directory (data=...)")
        held = (*code_gen.HELDOUT_FAMILIES, *(t["id"] for t in CODE_TASKS[3::4]))
        if tasks is None:
            generated = code_gen.generate(seed)
            self.report = DatasetReport(
                source="built in", layout=f"jaxagent coding (hand-written + generated, seed {seed})",
                split_rule=f"by structure: held-out families {', '.join(held)} in 'test'; every 4th other task in "
                           "'test_constants'")
            kept = {t["id"] for t in generated}
            ids = [f"{f.name}-{v:02d}" for f in code_gen.FAMILIES for v in range(len(f.grid))]
            self.report.records = len(CODE_TASKS) + len(ids)
            for i in ids:
                if i not in kept:
                    self.report.leave_out("tests too weak (fewer than 2 distinct answers or 4 tests)", i)
        raw = (tuple(CODE_TASKS) + tuple(generated)) if tasks is None else tasks
        built = [CodeTask(id=t["id"], entry_point=t["entry_point"], prompt=t["prompt"],
                          reference=t["reference"].strip() + "\n", tests=tuple((list(a), e) for a, e in t["tests"]),
                          template=t.get("template", t["id"])) for t in raw]
        if tasks is not None:
            self._splits = {name: split_tasks(built, name) for name in ("train", "test", "all")}
            self.split_notes = {"test": "every 4th of the given tasks"}
            return
        self._splits = splits_lib.structural_splits(built, held)
        self.split_notes = splits_lib.notes(self.report.split_rule)
        for name in ("train", splits_lib.STRUCTURAL, splits_lib.CONSTANTS):
            self.report.keep(name, len(self._splits[name]))

    grading_note = ("every unit test must pass: returned values and printed output compared by `graders` (integers "
                    "exactly, floats within 1e-6 relative; on TACO, PrimeIntellect and APPS function tests an expected "
                    "[v] also accepts v, as TACO's grader)")

    def tasks(self, split: str = "train") -> list[CodeTask]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(self._splits)}")
        return list(self._splits[split])

    def system_prompt(self, task: CodeTask) -> str:
        feedback = ("After each submission you are told how many unit tests passed and shown the first failing "
                    "test; you may then submit a corrected solution. The episode ends when all tests pass.")
        if task.style == "stdin":
            return ("You are an expert Python programmer. Solve the problem with a complete Python program that "
                    "reads the input from standard input and prints the answer to standard output. Reply with "
                    "your program in one ```python code block (if you write several blocks, only the last one is "
                    "used). Only the standard library is available and there is no network.\n" + feedback)
        how = ("The function is called directly with the test inputs and must return the answer: do not read "
               "input or print." if task.style == "function" else
               "If starter code is given, complete it: a method of class Solution is called on a fresh "
               "Solution() with the test inputs, otherwise the function of that name; it must return the "
               "answer, not print it.")
        return ("You are an expert Python programmer. Solve the problem by writing the requested Python "
                "function. Reply with your complete solution in one ```python code block (if you write "
                f"several blocks, only the last one is used). {how} Only the standard library is available and "
                "there is no network.\n" + feedback)

    def upper_bound_turns(self, task: CodeTask) -> int:
        return 1

    def ground_truth_actions(self, task: CodeTask) -> list[str]:
        """The reference solution as assistant messages: the reference program in one python block."""
        return [f"```python\n{task.reference.rstrip()}\n```"]

    def reset(self, seed: int, task: CodeTask) -> tuple[CodeState, str]:
        if not isinstance(task, CodeTask):
            raise ValueError(f"CodeEnv.reset needs a CodeTask, got {type(task).__name__}")
        if task.style != "function":  # loaded problems state their own examples
            return CodeState(task=task), task.prompt
        args, expected = task.tests[0]
        obs = f"{task.prompt}\n\nExample: {call_text(task, args)} should return {_short(expected)}."
        return CodeState(task=task), obs

    def anchor(self, state: CodeState) -> int:
        return stable_hash([state.task.id, list(state.passed) if state.passed is not None else None])

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, task: CodeTask, code: str) -> tuple[list[bool], SandboxResult]:
        """Run `code` on every test of `task` (at most `max_parallel` runs at once); per-test pass flags and
        the raw sandbox result. Raises `SandboxError` when the sandbox itself fails (never a score for the
        model)."""
        program, entry = driver(task, code)
        args = [a for a, _ in task.tests]
        key = hashlib.sha256(json.dumps([program, entry, args]).encode()).hexdigest() if self.cache_size else None
        result = self._cached(key)
        if result is None:
            with self._slots:
                result = self._cached(key)  # a run of the same program may have finished while this one waited
                if result is None:
                    result = run_calls(program, entry, args, self.limits)
                    self._keep(key, result)
        passed = [o.status == "ok" and outcome_matches(task, o.value, e)
                  for o, (_, e) in zip(result.outcomes, task.tests)]
        return passed, result

    def _cached(self, key):
        """The kept result of `key`'s program, or None (docs/host_study.md, "The envs", Coding)."""
        if key is None:
            return None
        with self._cache_lock:
            result = self._cache.get(key)
            if result is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
            return result

    def _keep(self, key, result: SandboxResult) -> None:
        with self._cache_lock:
            self.sandbox_runs += 1
            died = result.load_error is None and any(o.status == "not_run" for o in result.outcomes)
            limited = (died or result.timed_out or result.cpu_exceeded or result.load_timed_out
                       or any(o.status == "timeout" for o in result.outcomes))
            if key is None or limited:
                return
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def feedback(self, task: CodeTask, passed: list[bool], result: SandboxResult) -> str:
        n, k = len(passed), sum(passed)
        if k == n:
            return f"All {n} tests passed."
        if result.load_error is not None:
            return f"Passed 0/{n} tests. Your code failed to run: {result.load_error}"
        i = passed.index(False)
        args, expected = task.tests[i]
        o = result.outcomes[i]
        if o.status == "ok":
            what = f"printed {_short(o.value)}" if task.style == "stdin" else f"returned {_short(o.value)}"
        elif o.status == "timeout":
            what = f"timed out (limit {self.limits.per_call_s:g}s per test)"
        else:
            what = f"failed with {o.error}"
        if task.style == "stdin":
            return (f"Passed {k}/{n} tests. First failing test: on the input {_short(args[0])} the expected "
                    f"output is {_short(expected)} but your program {what}.")
        return (f"Passed {k}/{n} tests. First failing test: {call_text(task, args)} should return "
                f"{_short(expected)} but {what}.")

    def step_quality(self, state: CodeState, action_text: str) -> float:
        """Unit-test pass rate of the action's code (0 when there is no code block)."""
        text, err = coerce_action(action_text)
        code = extract_code(text) if err is None else None
        if code is None:
            return 0.0
        passed, _ = self.evaluate(state.task, code)
        return sum(passed) / len(passed)

    def step(self, state: CodeState, action_text: str):
        if not isinstance(state, CodeState):
            raise ValueError(f"CodeEnv.step needs a CodeState, got {type(state).__name__}")
        if state.done:
            raise ValueError("CodeEnv.step called on a finished episode")
        task = state.task
        text, err = coerce_action(action_text)
        code = None
        if err is None:
            code = extract_code(text)
            if code is None:
                err = "no code found: reply with your solution in a ```python code block"
        if err is not None:
            nxt = dataclasses.replace(state, turn=state.turn + 1)
            return nxt, f"Error: {err}", 0.0, False, make_info(
                valid=False, success=False, anchor=self.anchor(state), next_anchor=self.anchor(nxt), error=err,
                tool_error=True, pass_rate=0.0, n_passed=0, n_tests=len(task.tests))
        passed, result = self.evaluate(task, code)
        success = all(passed)
        crashed = result.load_error is not None or any(o.status != "ok" for o in result.outcomes)
        obs = self.feedback(task, passed, result)
        nxt = dataclasses.replace(state, turn=state.turn + 1, done=success, passed=tuple(passed))
        return nxt, obs, float(success), success, make_info(
            valid=True, success=success, anchor=self.anchor(state), next_anchor=self.anchor(nxt),
            error=None if success else obs, tool_error=crashed,
            pass_rate=sum(passed) / len(passed), n_passed=sum(passed), n_tests=len(passed),
            isolation=result.isolation)
