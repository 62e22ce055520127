"""How the coding environment compares what a program returned (or printed) with a test's expected value.

No dimension legend: host-side Python, no arrays.

The rule, for function-call results (`values_equal`) and printed output (`stdout_matches`) alike:
  - an integer expected value (a JSON int; in printed output a token of digits with an optional sign) is
    answered only by the same number, compared exactly: 1000000006 does not answer 1000000007, and neither
    does the float 1000000007.5 nor a float that rounds near it (a float equal to it in value, 7.0 for 7, does);
  - a float expected value (a JSON float; in printed output a token written with a decimal point or an exponent,
    e.g. "0.333333" or "3.000000") is answered by a number within REL_TOL relative (values: also ABS_TOL
    absolute; printed output: REL_TOL absolute below 1), as competitive-programming checkers accept
    floating-point answers, since the last digits depend on the order of the operations;
  - bools are not numbers; strings compare exactly; lists elementwise (tuples come back as lists), dicts by
    keys; printed output line by line after stripping each line and the whole text, a line matching when it is
    equal or when its whitespace-separated tokens match one by one (numbers by the rule above, other tokens
    exactly).
"""
from __future__ import annotations

import decimal
import math
import re

from jaxagent.envs.host.tasks import CodeTask

REL_TOL = 1e-6
ABS_TOL = 1e-9
_INT_TOKEN = re.compile(r"[+-]?\d+")
_NUMBER_TOKEN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def numbers_match(got, expected, rel: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Whether number `got` answers number `expected` (module docstring): exactly for an int `expected`,
    within the tolerance for a float one. Neither may be a bool."""
    if isinstance(expected, int):
        return got == expected  # Python compares int and float exactly, without rounding either
    return math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_tol)


def values_equal(got, expected, rel: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """JSON-value equality for test outcomes (module docstring): bools are not numbers, an int expected value
    needs the exact number, a float one a number within `rel` relative or `abs_tol` absolute, lists elementwise,
    dicts by keys."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return numbers_match(got, expected, rel, abs_tol)
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(values_equal(g, e, rel, abs_tol) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k], rel, abs_tol) for k in expected)
    return type(got) is type(expected) and got == expected


def _number(token: str):
    """(value as a Decimal, whether the token is an integer) of a number token, else None. Decimal, not int: it
    has no limit on the digits it reads, and compares with another Decimal exactly."""
    if not _NUMBER_TOKEN.fullmatch(token):
        return None
    return decimal.Decimal(token), bool(_INT_TOKEN.fullmatch(token))


def tokens_match(got: str, expected: str, tol: float = REL_TOL) -> bool:
    """Whether printed token `got` answers token `expected` (module docstring)."""
    if got == expected:
        return True
    a, b = _number(got), _number(expected)
    if a is None or b is None:
        return False
    if a[0] == b[0]:
        return True
    if b[1]:  # an integer: only its exact value answers it
        return False
    return abs(float(a[0]) - float(b[0])) <= tol * max(1.0, abs(float(b[0])))


def stdout_matches(got, expected: str, tol: float = REL_TOL) -> bool:
    """Whether a program's output `got` answers a test whose expected output is `expected` (module docstring):
    the same lines after stripping the whole text and each line (so trailing spaces and a final newline do not
    matter), a line matching when it is equal, or when its whitespace-separated tokens match one by one (integer
    tokens exactly by value, float tokens within `tol`, other tokens exactly)."""
    if not isinstance(got, str) or not isinstance(expected, str):
        return False
    lines_got = [x.strip() for x in got.strip().split("\n")]
    lines_exp = [x.strip() for x in expected.strip().split("\n")]
    if len(lines_got) != len(lines_exp):
        return False
    for g, e in zip(lines_got, lines_exp):
        if g == e:
            continue
        tg, te = g.split(), e.split()
        if len(tg) != len(te) or not all(tokens_match(x, y, tol) for x, y in zip(tg, te)):
            return False
    return True


def outcome_matches(task: CodeTask, got, expected) -> bool:
    """Whether one test's returned value (or printed output) answers it: `stdout_matches` for standard-input
    tasks, else `values_equal`; a TACO-style task (`lenient_list`) also accepts v for an expected [v]."""
    if task.style == "stdin":
        return stdout_matches(got, expected)
    if values_equal(got, expected):
        return True
    return task.lenient_list and isinstance(expected, list) and len(expected) == 1 and values_equal(got, expected[0])
