"""Reward without a solution: wrong answers that a grader's number tolerance would accept.

The hostile-input suite, by class (each case states its expected outcome and fails if the attack works):
  reward without a solution  this file; test_hostile_sandbox.py (reading the task file)
  escape                     test_hostile_sandbox.py (the package, sockets, namespaces; from a venv under /tmp);
                             test_hostile_loaders.py (a Spider db_id outside the data directory)
  data loss                  test_hostile_run_dir.py (writes through links)
  resource exhaustion        test_hostile_limits.py (the CPU quota under an ignored SIGCHLD, a load time-out kept,
                             a query process kept off the CPU); test_hostile_loaders.py (a gold query that never
                             yields, fields that never finish parsing); test_hostile_sandbox.py (the CPU quota)
  bad message                test_hostile_run_dir.py (a DONE directory), test_hostile_loaders.py (unreadable
                             files, host_study --data), test_hostile_cli.py (--coordinator-address, connecting)
The comparison rules are `jaxagent.envs.host.graders`' module docstring (docs/sandbox.md, "How answers are
compared").
"""
import decimal
import math

import pytest
from hypothesis import given, settings, strategies as st

from jaxagent.envs.host import sandbox
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.graders import REL_TOL, outcome_matches, stdout_matches, tokens_match, values_equal
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.envs.host.tasks import CodeTask

MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"
MOD = 10 ** 9 + 7
ints = st.one_of(st.integers(-10 ** 6, 10 ** 6), st.integers(-10 ** 30, 10 ** 30), st.integers(-10 ** 300, 10 ** 300))
finite = st.floats(allow_nan=False, allow_infinity=False)


# ----------------------------------------------------------------------------------------------- the rule itself
@settings(max_examples=400, deadline=None)
@given(e=ints, d=st.integers(-1000, 1000), as_float=st.booleans())
def test_an_integer_is_answered_only_by_its_exact_value(e, d, as_float):
    """Expected: a nearby integer (or a float near it) passes exactly when it equals the expected value, both as
    a returned value and as printed output."""
    g = e + d
    got = float(g) if as_float else g
    exact = got == e  # a float that rounds to exactly e is e (Python compares int and float exactly)
    assert values_equal(got, e) is exact and values_equal([got], [e]) is exact and values_equal({"k": got}, {"k": e}) is exact
    text = repr(got) if as_float else str(got)
    assert stdout_matches(text, str(e)) is (decimal.Decimal(text) == e)


@settings(max_examples=300, deadline=None)
@given(e=ints, got=st.one_of(ints, finite))
def test_any_number_answers_an_integer_only_when_equal(e, got):
    assert values_equal(got, e) is (got == e)


@settings(max_examples=400, deadline=None)
@given(e=finite.filter(lambda x: not x.is_integer()), r=st.floats(-0.9, 0.9))
def test_a_non_integral_float_is_answered_within_the_tolerance(e, r):
    """Expected: a float within 0.9 * REL_TOL relative passes; one 3 * REL_TOL away (and past the absolute floor)
    fails; the same for printed tokens (relative above 1, absolute below)."""
    near = e * (1 + r * REL_TOL)
    assert values_equal(near, e) and stdout_matches(repr(near), repr(e))
    far = e + math.copysign(3 * REL_TOL * max(abs(e), 1.0), r or 1.0)
    assert not values_equal(far, e) and not stdout_matches(repr(far), repr(e))


def test_the_attacks_of_the_report():
    """Expected: every one of these wrong answers fails."""
    assert not stdout_matches("1000000006", "1000000007")  # modulo 1e9+7, off by one
    assert not stdout_matches("1000000006\n999999999", "1000000007\n1000000000")  # every answer off by one
    assert not stdout_matches("1000000007.4", "1000000007") and not stdout_matches("1e9", "1000000007")
    assert not values_equal(float(10 ** 11 + 1), 10 ** 11)  # float(expected + 1)
    assert not values_equal(10 ** 11 + 1.0, 10 ** 11) and not values_equal([MOD - 1], [MOD])
    assert not tokens_match("1_000", "1000") and not tokens_match("0x10", "16")  # not number tokens: text
    assert not stdout_matches("9" * 5000 + "8", "9" * 5001)  # a long integer is compared digit for digit


def test_what_still_passes():
    """Expected: right answers in another form pass: equal values, float answers to float questions."""
    assert stdout_matches("7.0", "7") and stdout_matches("+7", "7") and stdout_matches("1e3", "1000")
    assert values_equal(7.0, 7) and values_equal(2 ** 60, 2 ** 60) and stdout_matches("9" * 5001, "9" * 5001)
    assert stdout_matches("0.3333333", "0.333333333") and stdout_matches("2.9999999", "3.000000")
    assert values_equal(0.1 + 0.2, 0.3) and values_equal(2.9999999999999996, 3.0) and values_equal(3, 3.0)
    assert not values_equal(True, 1) and not values_equal(1, True) and not values_equal("7", 7)
    lenient = CodeTask(id="x", entry_point="f", prompt="", reference="", tests=(), style="call", lenient_list=True)
    assert outcome_matches(lenient, MOD, [MOD]) and not outcome_matches(lenient, MOD - 1, [MOD])


# ------------------------------------------------------------------------------- through the environment
@pytest.fixture(scope="module")
def env():
    return CodeEnv(limits=SandboxLimits(wall_s=6.0, per_call_s=2.0, mode=MODE), cache_size=0)


def test_a_program_off_by_one_on_every_answer_earns_nothing(env):
    """A stdin task whose answers are taken modulo 1e9+7, and a function task with answers near 1e11. Expected:
    the reference earns 1, the program off by one on every test earns 0 (pass rate 0), and so does one that
    returns the answer as a float plus one."""
    tests = tuple(([f"{n}\n"], f"{pow(2, n, MOD)}\n") for n in (40, 50, 60, 70))
    stdin = CodeTask(id="pow2", entry_point="", prompt="", reference="", tests=tests, style="stdin")
    right = "n = int(input())\nprint(pow(2, n, 10**9 + 7))\n"
    wrong = "n = int(input())\nprint((pow(2, n, 10**9 + 7) + 1) % (10**9 + 7))\n"
    assert all(env.evaluate(stdin, right)[0]) and not any(env.evaluate(stdin, wrong)[0])
    call = CodeTask(id="big", entry_point="f", prompt="", reference="", style="function",
                    tests=tuple(([n], n * 10 ** 11) for n in (1, 2, 3, 4)))
    assert all(env.evaluate(call, "def f(n):\n    return n * 10**11\n")[0])
    assert not any(env.evaluate(call, "def f(n):\n    return float(n * 10**11 + 1)\n")[0])
    assert not any(env.evaluate(call, "def f(n):\n    return n * 10**11 - 1\n")[0])
