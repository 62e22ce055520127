"""The noisy experts of the host study's toy bases (`jaxagent.study.host.experts`): each env's expert found by its
class (None for an env without one), the slips of a gold query and of a reference program (one generic mistake,
outside literals, strings and comments), BFCL's slip (a schema error that executes nothing, then the reference or
giving up), and the sorting of submissions by what is wrong with them."""
import pytest

from jaxagent.envs.host import sandbox
from jaxagent.envs.host.base import HostEnv, make
from jaxagent.envs.host.bfcl_env import BFCLEnv
from jaxagent.envs.host.code_env import CodeEnv, extract_code
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.study.host.experts import NoisyExpert, check_slip_fix, expert_for
from jaxagent.study.host.experts.bfcl import BFCL_MISTAKE_KINDS, BFCLExpert
from jaxagent.study.host.experts.code import (CODE_MISTAKE_KINDS, CODE_SLIP_KINDS, CodeExpert, program_mistake,
                                              program_slips, slip_program)
from jaxagent.study.host.experts.sql import (MISTAKE_KINDS, SLIP_KINDS, SQLExpert, query_slips, slip_query,
                                             submission_mistake)
from jaxagent.study.host.stages import CappedObservations
from tests.host_play import call, play

# The code env's logic does not depend on the isolation: without strong isolation (not root) the explicit weak mode
MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"


@pytest.fixture(scope="module")
def code_env():
    return CodeEnv(limits=SandboxLimits(wall_s=4.0, per_call_s=0.6, mode=MODE))


@pytest.fixture(scope="module")
def first():
    """BFCL cut to its first requests, the tools as signatures (the bfcl-toy preset's domain, bfcl-first)."""
    pytest.importorskip("bfcl_eval")
    return BFCLEnv(user_turns=1, tool_docs="signatures")


def _block(code):
    return f"Here is my solution.\n```python\n{code}\n```"


# ----------------------------------------------------------------------------- which expert
def test_each_env_has_its_expert_by_class_and_a_custom_env_none(code_env):
    sql = object.__new__(SQLEnv)  # no databases built: the class decides
    assert type(expert_for(sql)) is SQLExpert and expert_for(sql).env is sql
    assert type(expert_for(code_env)) is CodeExpert and expert_for(code_env).env is code_env
    for cut in (BFCLEnv(), BFCLEnv(user_turns=1, tool_docs="signatures"), make("bfcl", user_turns=2)):
        assert type(expert_for(cut)) is BFCLExpert and expert_for(cut).env is cut
    assert type(expert_for(type("MyBFCL", (BFCLEnv,), {})())) is BFCLExpert  # a subclass keeps its expert
    assert expert_for(object.__new__(type("Custom", (HostEnv,), {}))) is None
    capped = CappedObservations(CappedObservations(code_env, None, 8), None, 8)  # the study world's env: looked through
    assert type(expert_for(capped)) is CodeExpert and expert_for(capped).env is code_env
    assert expert_for(object()) is None
    assert MISTAKE_KINDS == CODE_MISTAKE_KINDS and BFCL_MISTAKE_KINDS[:2] == ("solved", "slip")
    assert [e.mistake_kinds for e in (SQLExpert, CodeExpert, BFCLExpert)] == [MISTAKE_KINDS, CODE_MISTAKE_KINDS,
                                                                            BFCL_MISTAKE_KINDS]


def test_what_an_expert_does_not_define_is_not_implemented():
    bare = NoisyExpert(object())
    assert bare.mistake_kinds == () and bare.env_class is None
    for attempt, match in ((lambda: bare.slipped_actions("t", 0), "no slipped reference"),
                           (lambda: bare.checked_actions("t", 0, True), "no checked reference"),
                           (lambda: bare.submission_mistake("t", [], False), "does not sort submissions"),
                           (lambda: CodeExpert(None).checked_actions("t", 0, True), "CodeExpert defines no checked")):
        with pytest.raises(NotImplementedError, match=match):
            attempt()
    assert check_slip_fix(1) == 1.0 and isinstance(check_slip_fix(1), float)
    for bad in (-0.1, 1.5, True, "half", None):
        with pytest.raises(ValueError, match="my fix must be a number in"):
            check_slip_fix(bad, "my fix")


# ----------------------------------------------------------------------------- SQL
def test_slipped_queries_make_one_generic_mistake_outside_literals():
    q = "SELECT AVG(age) FROM animals WHERE species = 'MAX( WHERE x > 1'"
    kinds = {slip_query(q, seed)[0] for seed in range(40)}
    assert kinds == {"drop_condition", "swap_aggregate"}  # the literal's words are not the query's
    for seed in range(40):
        kind, slipped = slip_query(q, seed)
        if kind == "drop_condition":
            assert slipped == "SELECT AVG(age) FROM animals"
        else:
            assert slipped.endswith(" FROM animals WHERE species = 'MAX( WHERE x > 1'")
            assert slipped[7:10] in ("SUM", "MIN", "MAX")
    assert slip_query("SELECT name FROM t WHERE n >= 2 ORDER BY name", 3)[1] in (
        "SELECT name FROM t WHERE n <= 2 ORDER BY name", "SELECT name FROM t ORDER BY name")
    # a subquery keeps its WHERE (cutting it would leave a broken query); no slip applies to a bare count
    assert {slip_query("SELECT a FROM t WHERE b > (SELECT AVG(b) FROM t)", s)[0] for s in range(40)} == {
        "flip_comparison", "swap_aggregate"}
    assert slip_query("SELECT COUNT(*) FROM t", 0) is None
    assert set(SLIP_KINDS) == {"drop_condition", "swap_aggregate", "flip_comparison"}
    assert slip_query(q, 7) == slip_query(q, 7)  # the seed decides


def test_sql_submissions_are_sorted_by_what_is_wrong_with_them():
    gold = "SELECT AVG(age) FROM animals WHERE species = 'zebra' AND age > 3"
    assert {slip_query(gold, s)[1] for s in range(60)} == query_slips(gold)  # every slip the expert can make
    ans = lambda q: f"<answer>{q}</answer>"  # noqa: E731
    assert submission_mistake(gold, [ans(gold)], True) == "solved"
    assert submission_mistake(gold, [ans("SELECT AVG(age) FROM animals")], False) == "slip"
    assert submission_mistake(gold, [ans(gold.replace("> 3", "< 3"))], False) == "slip"
    assert submission_mistake(gold, [ans(gold.replace("AVG", "SUM").replace("zebra", "otter"))],
                              False) == "slip and value"
    assert submission_mistake(gold, [ans(gold.replace("> 3", "> 4"))], False) == "value"
    assert submission_mistake(gold, [ans(gold.replace("zebra", "ze'bra"))], False) == "other"
    assert submission_mistake(gold, [ans("SELECT name FROM keepers")], False) == "other"
    # the last submission counts; a query only run is not one
    assert submission_mistake(gold, [f"```sql\n{gold}\n```"], False) == "no submission"
    assert submission_mistake(gold, [ans("SELECT 1"), ans("SELECT AVG(age) FROM animals")], False) == "slip"


def test_the_sql_expert_slips_or_checks_on_the_gold_query():
    task = type("T", (), {"gold": "SELECT name FROM t WHERE n >= 2"})()
    expert = SQLExpert(None)
    for seed in range(10):
        assert expert.slipped_actions(task, seed) == [f"<answer>{slip_query(task.gold, seed)[1]}</answer>"]
        assert expert.checked_actions(task, seed, True) == [f"```sql\n{slip_query(task.gold, seed)[1]}\n```",
                                                            f"<answer>{task.gold}</answer>"]
    assert expert.checked_actions(task, 0, False) == [f"```sql\n{task.gold}\n```", f"<answer>{task.gold}</answer>"]
    bare = type("T", (), {"gold": "SELECT COUNT(*) FROM t"})()  # no slip applies: None, and the check runs the gold
    assert expert.slipped_actions(bare, 0) is None
    assert expert.checked_actions(bare, 0, True) == [f"```sql\n{bare.gold}\n```", f"<answer>{bare.gold}</answer>"]
    assert expert.submission_mistake(task, [expert.slipped_actions(task, 0)[0]], False) == "slip"
    with pytest.raises(ValueError, match="slip fix"):
        expert.slipped_actions(task, 0, fix=2)


# ----------------------------------------------------------------------------- coding
def test_slipped_programs_make_one_generic_mistake_outside_strings(code_env):
    env, expert = code_env, CodeExpert(code_env)
    src = "def f(xs):\n    # max(1 < 2)\n    s = '<= 3 min('\n    return [max(x, 3) for x in xs if x < 7]\n"
    made = {slip_program(src, seed) for seed in range(40)}
    assert {k for k, _ in made} == set(CODE_SLIP_KINDS)
    assert made == {  # each kind at its first site; the comment and the string untouched
        ("flip_comparison", src.replace("x < 7", "x > 7")),
        ("off_by_one", src.replace("x, 3)", "x, 4)")),
        ("swap_builtin", src.replace("[max(", "[min("))}
    assert slip_program("def f(s):\n    return s.strip()\n", 0) is None  # nothing to slip
    assert slip_program("def f(:\n    return (", 0) is None  # does not tokenize: no slip, no error
    assert slip_program(src, 5) == slip_program(src, 5)  # the seed decides
    odd = 'def f(s):\n    t = "a\x0cb\u2028c"\n    return s < 3\n'  # line breaks only str.splitlines sees
    assert {slip_program(odd, seed)[1] for seed in range(20)} == {odd.replace("< 3", "> 3"), odd.replace("3", "4")}
    # the expert's episode: the slip (which fails a test here), then the reference after the feedback
    task = next(t for t in env.tasks("train") if slip_program(t.reference, 0) is not None)
    seed = next(s for s in range(40) if not all(env.evaluate(task, slip_program(task.reference, s)[1])[0]))
    slipped, fixed = expert.slipped_actions(task, seed)
    assert fixed == env.ground_truth_actions(task)[0] and extract_code(slipped) != task.reference
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, slipped)
    assert info["valid"] and not done and obs.startswith("Passed ")
    state, obs, reward, done, info = env.step(state, fixed)
    assert done and reward == 1.0
    # fix: with that probability the reference follows the feedback, else the slip once more (the episode fails)
    episodes = [expert.slipped_actions(task, s, fix=0.5) for s in range(60)]
    gave_up = [e for e in episodes if e[1] == e[0]]
    assert 15 < len(gave_up) < 45 and all(e[1] == fixed for e in episodes if e[1] != e[0])
    assert [e[0] for e in episodes] == [expert.slipped_actions(task, s)[0] for s in range(60)]  # the same slips
    assert all(expert.slipped_actions(task, s, fix=0.0)[1] == expert.slipped_actions(task, s)[0] for s in range(10))
    again = expert.slipped_actions(task, seed, fix=0.0)
    state, _ = env.reset(0, task)
    for a in again:
        state, obs, reward, done, info = env.step(state, a)
    assert reward == 0.0 and not state.done and state.turn == 2
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match="slip fix"):
            expert.slipped_actions(task, seed, fix=bad)
    bare = CodeEnv(tasks=[dict(id="t", entry_point="f", prompt="p", reference="def f(s):\n    return s\n",
                                tests=[[["a"], "a"]])], limits=env.limits)
    assert CodeExpert(bare).slipped_actions(bare.tasks("all")[0], 0) is None


def test_programs_are_sorted_by_what_is_wrong_with_them(code_env):
    ref = "def f(xs):\n    return [x for x in xs if x < 3]\n"
    assert {slip_program(ref, s)[1] for s in range(30)} == program_slips(ref)  # every slip the expert can make
    slip = ref.replace("< 3", "> 3")
    assert program_mistake(ref, [_block(ref)], True) == "solved"
    assert program_mistake(ref, [_block(slip + "\n\n")], False) == "slip"  # surrounding whitespace aside
    assert program_mistake(ref, [_block(slip), "no code here"], False) == "slip"  # the last submission counts
    assert program_mistake(ref, [_block(slip), _block(ref.replace("3", "5"))], False) == "value"  # the last one
    assert program_mistake(ref, [_block(slip.replace("3", "5") + "# a comment\n")], False) == "slip and value"
    assert program_mistake(ref, [_block(ref.replace("x < 3", "x + 1 < 3"))], False) == "other"
    assert program_mistake(ref, [_block("def f(:\n    return (")], False) == "other"
    assert program_mistake(ref, ["I think the answer is 3", ""], False) == "no submission"
    task, expert = code_env.tasks("train")[0], CodeExpert(code_env)
    assert expert.submission_mistake(task, [_block(task.reference)], True) == "solved"
    assert expert.mistake_kinds == CODE_MISTAKE_KINDS == ("solved", "slip", "slip and value", "value", "other",
                                                          "no submission")


# ----------------------------------------------------------------------------- BFCL (bfcl-first)
def test_the_slip_gets_a_schema_error_executes_nothing_and_the_reference_then_solves(first):
    expert = BFCLExpert(first)
    slipped = 0
    for task in first.tasks("train")[::7]:
        actions = expert.slipped_actions(task, seed=3)
        if actions is None:  # no call of the request takes a required argument
            docs = first.function_docs(task)
            assert not any(set(docs[n][1]["parameters"].get("required", ())) & set(kw)
                           for n, kw in first.ground_truth_calls(task)[0])
            continue
        slipped += 1
        assert actions == expert.slipped_actions(task, seed=3) and actions[1:] == first.ground_truth_actions(task)
        state, obs = first.reset(0, task)
        before = first.anchor(state)
        state, obs, reward, done, info = first.step(state, actions[0])
        assert not info["valid"] and info["tool_error"] and "missing" in obs.lower() and not done
        assert first.anchor(state) == before and state.all_results == [] and state.turn_calls == 0
        for a in actions[1:]:
            state, obs, reward, done, info = first.step(state, a)
        assert (reward, done, state.success) == (1.0, True, True), task.id
    assert slipped > 50
    # fix: the expert fixes its slip with that probability, else it closes the turn after the error and fails
    episodes = [expert.slipped_actions(t, seed=i, fix=0.5) for i, t in enumerate(first.tasks("train")[:80])]
    gave_up = [e for e in episodes if e is not None and e[1:] == ["Done."]]
    fixed = [e for e in episodes if e is not None and e[1:] != ["Done."]]
    assert len(gave_up) > 15 and len(fixed) > 15
    task = next(t for t in first.tasks("train") if expert.slipped_actions(t, 0) is not None)
    state, steps = play(first, task, expert.slipped_actions(task, 0, fix=0.0))
    assert len(steps) == 2 and not state.success and "empty_turn" in state.failure
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match="slip fix"):
            expert.slipped_actions(task, 0, fix=bad)


def test_episodes_are_sorted_by_mistake_on_replay(first):
    expert = BFCLExpert(first)
    task = first.task("multi_turn_base_0")
    ref = first.ground_truth_actions(task)
    slip = expert.slipped_actions(task, seed=3)
    assert expert.is_slip(task, slip[0]) and not expert.is_slip(task, ref[0]) and not expert.is_slip(task, "Done.")
    assert not expert.is_slip(task, call("cd") + "\n" + call("cd"))  # two calls: not the slip's form
    assert not expert.is_slip(task, call("nope"))
    (name, kwargs), *rest = first.ground_truth_calls(task)[0]
    wrong = "\n".join([call(name, **{k: "elsewhere" for k in kwargs})] + [call(n, **a) for n, a in rest])
    cases = {"solved": (ref, True), "slip": (slip[:2], False), "wrong calls": ([wrong, "Done."], False),
             "no call": (["Done."], False), "out of budget": (ref[:1], False)}
    for kind, (actions, solved) in cases.items():
        assert expert.submission_mistake(task, actions, solved) == kind
        if kind != "solved":  # the replay agrees with the episode: unsolved
            state, steps = play(first, task, actions)
            assert not state.success
    assert set(cases) < set(BFCL_MISTAKE_KINDS) == set(expert.mistake_kinds)
