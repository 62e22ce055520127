"""Coding environment: reference solutions pass, broken ones fail with useful feedback, the pass rate
is the step quality, malformed actions are error observations, and a failing sandbox is an
infrastructure error, never a score."""

import concurrent.futures
import copy
import json
import os
import threading
import time

import pytest

from jaxagent.envs.host import base as host, sandbox
from jaxagent.envs.host.data import code_gen
from jaxagent.envs.host.data.code_tasks import CODE_TASKS
from jaxagent.envs.host.code_env import CodeEnv, CodeState, extract_code, values_equal
from jaxagent.envs.host.sandbox import SandboxLimits, SandboxSetupError, SandboxUnavailable

PROBLEM = sandbox.strong_isolation_problem()
# The env's logic does not depend on the isolation; without strong isolation (not root) these tests
# use the explicit weak mode. The sandbox's own guarantees are tested in test_sandbox.py.
MODE = "namespaces" if PROBLEM is None else "unsafe-rlimits-only"


@pytest.fixture(scope="module")
def env():
    return CodeEnv(limits=SandboxLimits(wall_s=4.0, per_call_s=0.6, mode=MODE))


def _task(env, task_id):
    return next(t for t in env.tasks("all") if t.id == task_id)


def _block(code):
    return f"Here is my solution.\n```python\n{code}\n```"


def test_task_set(env):
    tasks = env.tasks("all")
    assert len(tasks) >= 15 and len({t.id for t in tasks}) == len(tasks)
    assert all(len(t.tests) >= 4 for t in tasks)
    assert all(len({repr(e) for _, e in t.tests}) >= 2 for t in tasks)  # a constant answer fails every task
    splits = [env.tasks(name) for name in ("train", "test", "test_constants")]
    assert sorted(t.id for s in splits for t in s) == sorted(t.id for t in tasks)  # disjoint, and all of them
    assert [t.id for t in tasks[:len(CODE_TASKS)]] == [t["id"] for t in CODE_TASKS]  # the hand-written ones first
    assert {t.template for t in env.tasks("test")} == (set(code_gen.HELDOUT_FAMILIES)
                                                       | {t["id"] for t in CODE_TASKS[3::4]})
    # test_constants holds train families only, and nearly every one of them: the every-4th rule counts over the
    # whole list, so a family whose few tasks all fall between the picks has none (topo-order's 6 tasks)
    train_families = {f.name for f in code_gen.FAMILIES} - set(code_gen.HELDOUT_FAMILIES)
    constants = {t.template for t in env.tasks("test_constants")}
    assert constants <= train_families and len(train_families - constants) <= 1, train_families - constants


def _solves_in_one_turn(env, task):
    state, obs = env.reset(0, task)
    assert task.entry_point in obs and "Example:" in obs
    state, obs, reward, done, info = env.step(state, _block(task.reference))
    assert (reward, done, info["success"], info["pass_rate"]) == (1.0, True, True, 1.0), (task.id, obs)
    assert obs == f"All {len(task.tests)} tests passed."
    assert env.upper_bound_turns(task) == 1


def test_reference_solutions_pass(env):
    """Every hand-written task and the first task of every generated family: the reference passes in the
    sandbox in one turn (the structural bound's 1)."""
    firsts = {}
    for task in env.tasks("all")[len(CODE_TASKS):]:
        firsts.setdefault(task.id.rsplit("-", 1)[0], task)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        tasks = env.tasks("all")[:len(CODE_TASKS)] + list(firsts.values())
        list(pool.map(lambda t: _solves_in_one_turn(env, t), tasks))


def test_every_generated_reference_passes(env):
    """Every generated task's reference gives the expected value on each of its tests, called as the sandbox's
    worker calls it (on a deep copy of the arguments, the value through JSON), in this process; every 16th task
    (and every family's first, `test_reference_solutions_pass`) also through the env in the sandbox."""
    generated = env.tasks("all")[len(CODE_TASKS):]
    for task in generated:
        namespace = {}
        exec(compile(task.reference, task.id, "exec"), namespace)
        for args, expected in task.tests:
            got = json.loads(json.dumps(namespace[task.entry_point](*copy.deepcopy(args))))
            assert values_equal(got, expected), (task.id, args, got, expected)
    with concurrent.futures.ThreadPoolExecutor(env.max_parallel) as pool:
        list(pool.map(lambda t: _solves_in_one_turn(env, t), generated[7::16]))


def test_generated_tasks_are_deterministic_and_check_their_parameters():
    a, b = code_gen.generate(), code_gen.generate()
    assert a == b and len(a) == 1053
    assert code_gen.generate(seed=1) != a and [t["id"] for t in code_gen.generate(seed=1)] == [t["id"] for t in a]
    by_id = {t["id"]: t for t in a}
    t = by_id["sum-multiples-00"]  # k = 2, any position
    assert "divisible by 2" in t["prompt"] and ([[2, -2, 0, 1]], 0) in t["tests"]
    t = by_id["shift-letters-01"]  # k = 1 backward
    assert "1 places backward" in t["prompt"] and (["Zz Aa!"], "Yy Zz!") in t["tests"]
    t = by_id["sequence-00"]  # a0 = 0, a1 = 1, a(n) = a(n-1) + a(n-2): Fibonacci
    assert ([2], 1) in t["tests"] and all(e == _fib(a[0]) for a, e in t["tests"])


def _fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def test_sandbox_runs_are_bounded_by_the_hosts_cores(monkeypatch):
    """At most max_parallel sandbox runs at once (default: the cores of os.sched_getaffinity), however many threads
    step the env."""
    assert CodeEnv().max_parallel == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="max_parallel"):
        CodeEnv(max_parallel=0)
    live, peak, lock = [0], [0], threading.Lock()

    def fake_run_calls(code, entry, args_list, limits):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return sandbox.SandboxResult(outcomes=tuple(sandbox.CallOutcome("ok", value=None) for _ in args_list),
                                     load_error=None, timed_out=False, isolation=MODE, exit_info="", wall_s=0.05)

    monkeypatch.setattr("jaxagent.envs.host.code_env.run_calls", fake_run_calls)
    env = CodeEnv(max_parallel=2)
    task = env.tasks("all")[0]
    threads = [threading.Thread(target=env.evaluate, args=(task, "pass")) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert peak[0] == 2


def test_resubmitted_programs_reuse_their_result_unless_a_limit_was_hit(monkeypatch):
    """The same program on the same tests runs once (`CodeEnv.cache_size` distinct programs kept, least recently
    used out first); a run that timed out, hit its CPU quota or left a test not run is not kept; 0 keeps none."""
    runs = []

    def fake_run_calls(code, entry, args_list, limits):
        runs.append(code)
        status = "timeout" if "slow" in code else "not_run" if "die" in code else "ok"
        return sandbox.SandboxResult(outcomes=tuple(sandbox.CallOutcome(status, value=1) for _ in args_list),
                                     load_error=None, timed_out=False, isolation=MODE, exit_info="", wall_s=0.01,
                                     cpu_exceeded="spin" in code)

    monkeypatch.setattr("jaxagent.envs.host.code_env.run_calls", fake_run_calls)
    env = CodeEnv(cache_size=2)
    task, other = env.tasks("all")[:2]
    first = env.evaluate(task, "def f(): pass")
    assert env.evaluate(task, "def f(): pass") == first and len(runs) == 1
    env.evaluate(other, "def f(): pass")  # other tests: another run
    env.evaluate(task, "def g(): pass")   # the cache holds 2: the least recently used goes
    assert len(runs) == 3 and (env.sandbox_runs, env.cache_hits) == (3, 1)
    env.evaluate(task, "def g(): pass")
    env.evaluate(task, "def f(): pass")   # evicted: runs again
    assert len(runs) == 4 and (env.sandbox_runs, env.cache_hits) == (4, 2)
    for limited in ("slow = 1", "spin = 1", "die = 1"):
        env.evaluate(task, limited)
        env.evaluate(task, limited)
    assert len(runs) == 10
    none = CodeEnv(cache_size=0)
    none.evaluate(task, "def f(): pass")
    none.evaluate(task, "def f(): pass")
    assert len(runs) == 12 and none.cache_hits == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="cache_size"):
            CodeEnv(cache_size=bad)


def test_a_kept_result_equals_a_fresh_run(env):
    task = env.tasks("train")[0]
    fresh = CodeEnv(limits=env.limits, cache_size=0)
    kept = CodeEnv(limits=env.limits)
    for code in (task.reference, "def nope(:"):
        a, b = kept.evaluate(task, code), kept.evaluate(task, code)
        c = fresh.evaluate(task, code)
        assert a is not None and b[1] is a[1] and a[0] == c[0] and a[1].outcomes == c[1].outcomes
        assert a[1].load_error == c[1].load_error
    assert (kept.sandbox_runs, kept.cache_hits) == (2, 2)


BROKEN = {
    "pair-sum": ("seen[target - x], j]", "seen[target - x], j + 1]"),
    "palindrome": ("c.lower()", "c"),
    "roman": ("total -= v", "total += v"),
    "merge-intervals": ("s <= out[-1][1]", "s < out[-1][1]"),
    "nth-prime": ("return primes[n - 1]", "return primes[n]"),
    "coin-change": ("return -1 if", "return 0 if"),
}


@pytest.mark.parametrize("task_id", sorted(BROKEN))
def test_broken_solutions_fail_with_feedback(env, task_id):
    task = _task(env, task_id)
    old, new = BROKEN[task_id]
    assert old in task.reference
    broken = task.reference.replace(old, new)
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, _block(broken))
    assert reward == 0.0 and not done and info["valid"] and not info["success"]
    assert 0.0 <= info["pass_rate"] < 1.0
    assert obs.startswith(f"Passed {info['n_passed']}/{len(task.tests)} tests. First failing test: {task.entry_point}(")
    assert "should return" in obs
    assert env.step_quality(state, _block(broken)) == pytest.approx(info["pass_rate"])
    assert env.step_quality(state, _block(task.reference)) == 1.0
    # ...and fixing it on the next turn solves the task.
    state, obs, reward, done, info = env.step(state, _block(task.reference))
    assert (reward, done, state.turn) == (1.0, True, 2)


def test_feedback_names_the_failure(env):
    task = _task(env, "fizzbuzz")
    state, _ = env.reset(0, task)
    _, obs, _, _, info = env.step(state, _block("def fizzbuzz(n):\n    return [str(i) for i in range(1, n + 1)]"))
    assert "First failing test: fizzbuzz(5) should return ['1', '2', 'Fizz', '4', 'Buzz'] but returned" in obs
    assert not info["tool_error"] and info["pass_rate"] == pytest.approx(0.5)
    _, obs, _, _, info = env.step(state, _block("def fizzbuzz(n):\n    raise KeyError('boom')"))
    assert "failed with KeyError: 'boom'" in obs and info["tool_error"] and info["pass_rate"] == 0.0
    _, obs, _, _, info = env.step(state, _block("def fizzbuzz(n)\n    return []"))
    assert "Your code failed to run: SyntaxError" in obs and info["valid"]
    _, obs, _, _, info = env.step(state, _block("def fizzbuzz(n):\n    while True:\n        pass"))
    assert "timed out" in obs and info["tool_error"]
    _, obs, _, _, info = env.step(state, _block("def fizz(n):\n    return []"))
    assert "function 'fizzbuzz' is not defined" in obs


def test_anchor_is_the_test_result_vector(env):
    task = _task(env, "palindrome")
    state, _ = env.reset(0, task)
    a = env.step(state, _block("def is_palindrome(s):\n    return True"))
    b = env.step(state, _block("def is_palindrome(s):\n    return len(s) >= 0"))
    c = env.step(state, _block("def is_palindrome(s):\n    return False"))
    assert env.anchor(a[0]) == env.anchor(b[0]) != env.anchor(c[0]) != env.anchor(state)
    assert a[4]["anchor"] == env.anchor(state) and a[4]["next_anchor"] == env.anchor(a[0])
    # An invalid action leaves the state (and its anchor) as it was.
    d = env.step(a[0], "I give up")
    assert not d[4]["valid"] and d[4]["anchor"] == d[4]["next_anchor"] == env.anchor(a[0])


@pytest.mark.parametrize("action", ["", "just prose", "x" * 100_000, b"\x80\x81\xfe", None, "```python\n```",
                                    "<think>```python\ndef f(): pass\n```</think>"])
def test_malformed_actions_are_invalid(env, action):
    state, _ = env.reset(0, _task(env, "flatten"))
    state, obs, reward, done, info = env.step(state, action)
    assert obs.startswith("Error:") and not info["valid"] and reward == 0.0 and not done
    assert env.step_quality(state, action) == 0.0


def test_extract_code_and_values_equal():
    assert extract_code("```python\na = 1\n```\ntext\n```\nb = 2\n```") == "b = 2\n"
    assert extract_code("```py\nx\n```") == "x\n"
    assert extract_code("no code") is None
    assert values_equal(1.0000000001, 1.0) and values_equal([1, [2.0]], [1, [2]])
    assert not values_equal(1.0000000001, 1) and not values_equal(1000000006, 1000000007)  # integers: exact
    assert not values_equal(True, 1) and not values_equal(1, True) and not values_equal([1], [1, 2])
    assert not values_equal("1", 1) and values_equal({"a": [1]}, {"a": [1]})


def test_registry_and_errors():
    env = host.make("code")
    assert isinstance(env, CodeEnv) and env.jittable is False
    with pytest.raises(ValueError):
        env.reset(0, "not a task")
    state, _ = env.reset(0, env.tasks("all")[0])
    done_state = CodeState(task=state.task, done=True)
    with pytest.raises(ValueError):
        env.step(done_state, "```python\npass\n```")


def test_unavailable_sandbox_raises_instead_of_scoring(monkeypatch):
    env = CodeEnv(limits=SandboxLimits(wall_s=4.0, per_call_s=0.6))  # the default mode
    task = env.tasks("all")[0]
    state, _ = env.reset(0, task)
    monkeypatch.setattr(sandbox, "strong_isolation_problem", lambda: "the process is not root (euid 1000)")
    with pytest.raises(SandboxUnavailable, match="not root"):
        env.step(state, _block(task.reference))
    with pytest.raises(SandboxUnavailable):
        env.step_quality(state, _block(task.reference))
    assert state.turn == 0 and not state.done


@pytest.mark.skipif(PROBLEM is not None, reason=f"strong isolation unavailable here: {PROBLEM}")
def test_setup_failure_is_not_the_models_failure(monkeypatch):
    env = CodeEnv(limits=SandboxLimits(wall_s=4.0, per_call_s=0.6))
    task = env.tasks("all")[0]
    state, _ = env.reset(0, task)
    monkeypatch.setattr(sandbox, "pick_uid", lambda: 2 ** 32 - 1)  # the privilege drop fails (EINVAL)
    with pytest.raises(SandboxSetupError, match="dropping privileges"):
        env.step(state, _block(task.reference))  # a reference solution is never scored 0 for it
    monkeypatch.undo()
    state, obs, reward, done, info = env.step(state, _block(task.reference))
    assert (reward, done, info["isolation"]) == (1.0, True, "namespaces")


def test_hostile_output_is_an_error_observation(env):
    # Forged and deeply nested lines on every descriptor, then a deeply nested return value: each
    # is an observation for the model, never an exception out of step.
    task = _task(env, "fizzbuzz")
    code = ("import os\nDEEP = ('@@jaxagent-sbx ' + '[' * 200000 + ']' * 200000 + '\\n').encode()\n"
            "FAKE = b'@@jaxagent-sbx {\"i\": 0, \"status\": \"ok\", \"value\": []}\\n'\n"
            "for fd in range(256):\n    for data in (DEEP, FAKE):\n        try:\n"
            "            os.write(fd, data)\n        except OSError:\n            pass\n"
            "def fizzbuzz(n):\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n")
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, _block(code))
    assert reward == 0.0 and not done and info["valid"] and info["pass_rate"] == 0.0
    assert obs.startswith("Passed 0/") and "failed" in obs
    assert info["isolation"] == MODE


def test_observations_with_lone_surrogates_are_valid_text(env):
    # The model's own exception message, echoed as feedback, holds a lone surrogate.
    task = _task(env, "pair-sum")
    state, obs = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, _block("def pair_sum(nums, target):\n    raise ValueError('\\ud800!')\n"))
    assert reward == 0.0 and "ValueError: \\ud800!" in obs, obs
    obs.encode("utf-8")
    info["error"].encode("utf-8")
