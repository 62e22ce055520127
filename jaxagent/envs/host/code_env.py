"""Multi-turn coding with unit tests (DeepCoder-MT style): submit code, read the failing test, fix it.

No dimension legend: host-side Python, no arrays.

Action: a Python solution in a ```python code block (the last block if there are several; a bare
``` block is accepted). The code runs in the sandbox (jaxagent.envs.host.sandbox: wall, CPU, memory,
process and file-size limits, no network, a root file system holding only the interpreter and its
standard library, so neither this package nor its task data (the expected values) can be read, a
throwaway work directory, an unprivileged uid; by default strong isolation or an error, never a
silent fallback; docs/sandbox.md) and the
task's entry-point function is called on every unit test's arguments; return values are compared
with the expected values here, outside the sandbox (floats to 1e-6 relative, bool distinct from
int, tuples as lists, sets as sorted lists).
Observation: "All N tests passed." or the number passed plus the first failing test (its call, the
expected value, and what came back: the wrong value, the exception, a timeout, or the load error).
Reward: 1 when every test passes (the episode then ends), else 0.
step_quality(state, action) = the action's unit-test pass rate (docs/study.md finding 3: step quality on
DeepCoder-MT is the unit-test pass rate); it does not advance the state.
valid=False means no code block was found; code that fails, crashes or times out is a valid action
with `error` set (`tool_error` when it crashed, raised or timed out rather than returning wrong
values).
Anchor (`anchor(state)`): hash of (task id, pass/fail vector of the latest submission, None before
the first); an invalid action keeps the previous vector (the env state did not change).
upper_bound_turns = 1 (the reference solution passes in one submission).
Infrastructure failures are not the model's: when the sandbox is unavailable or fails to set up,
`step` and `step_quality` raise `sandbox.SandboxError` (SandboxUnavailable / SandboxSetupError, with
`infrastructure_error = True`) instead of scoring the action 0, so the caller can stop or exclude
the episode.
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxagent.envs.host.data.code_tasks import CODE_TASKS
from jaxagent.envs.host.base import HostEnv, coerce_action, make_info, split_tasks, stable_hash, strip_think
from jaxagent.envs.host.sandbox import SandboxError, SandboxLimits, SandboxResult, run_calls  # noqa: F401


@dataclasses.dataclass(frozen=True)
class CodeTask:
    id: str
    entry_point: str
    prompt: str
    reference: str
    tests: tuple = dataclasses.field(hash=False)  # ((args list, expected JSON value), ...)


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


def values_equal(got, expected, rel: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """JSON-value equality for test outcomes: bools are not numbers, numbers compare with a relative
    tolerance when either is a float, lists elementwise, dicts by keys."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int) and isinstance(got, int):
            return got == expected
        return math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_tol)
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(values_equal(g, e, rel, abs_tol) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k], rel, abs_tol) for k in expected)
    return type(got) is type(expected) and got == expected


def _short(v, n: int = 200) -> str:
    try:
        s = repr(v)
    except RecursionError:
        return "<a value nested too deeply to show>"
    return s if len(s) <= n else s[: n - 3] + "..."


def call_text(task: CodeTask, args) -> str:
    s = f"{task.entry_point}({', '.join(repr(a) for a in args)})"
    return s if len(s) <= 300 else s[:297] + "..."


class CodeEnv(HostEnv):
    """Multi-turn coding against unit tests in a sandbox (module docstring)."""

    name = "code"

    def __init__(self, limits: SandboxLimits = SandboxLimits(), tasks: tuple | None = None):
        self.limits = limits
        raw = CODE_TASKS if tasks is None else tasks
        self._tasks = tuple(CodeTask(id=t["id"], entry_point=t["entry_point"], prompt=t["prompt"],
                                     reference=t["reference"].strip() + "\n",
                                     tests=tuple((list(a), e) for a, e in t["tests"])) for t in raw)

    def tasks(self, split: str = "train") -> list[CodeTask]:
        return split_tasks(list(self._tasks), split)

    def system_prompt(self, task: CodeTask) -> str:
        return (
            "You are an expert Python programmer. Solve the problem by writing the requested Python "
            "function. Reply with your complete solution in one ```python code block (if you write "
            "several blocks, only the last one is used). The function is called directly with the test "
            "inputs and must return the answer: do not read input or print. Only the standard library "
            "is available and there is no network.\n"
            "After each submission you are told how many unit tests passed and shown the first failing "
            "test; you may then submit a corrected solution. The episode ends when all tests pass."
        )

    def upper_bound_turns(self, task: CodeTask) -> int:
        return 1

    def reset(self, seed: int, task: CodeTask) -> tuple[CodeState, str]:
        if not isinstance(task, CodeTask):
            raise ValueError(f"CodeEnv.reset needs a CodeTask, got {type(task).__name__}")
        args, expected = task.tests[0]
        obs = f"{task.prompt}\n\nExample: {call_text(task, args)} should return {_short(expected)}."
        return CodeState(task=task), obs

    def anchor(self, state: CodeState) -> int:
        return stable_hash([state.task.id, list(state.passed) if state.passed is not None else None])

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, task: CodeTask, code: str) -> tuple[list[bool], SandboxResult]:
        """Run `code` on every test of `task`; per-test pass flags and the raw sandbox result.
        Raises `SandboxError` when the sandbox itself fails (never a score for the model)."""
        result = run_calls(code, task.entry_point, [a for a, _ in task.tests], self.limits)
        passed = [o.status == "ok" and values_equal(o.value, e) for o, (_, e) in zip(result.outcomes, task.tests)]
        return passed, result

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
            what = f"returned {_short(o.value)}"
        elif o.status == "timeout":
            what = f"timed out (limit {self.limits.per_call_s:g}s per test)"
        else:
            what = f"failed with {o.error}"
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
