"""BFCL multi-turn environment: ground-truth replays solve tasks in every category, wrong calls do
not, scoring agrees with bfcl-eval's own checker, malformed tool calls never raise; plus the
error-prefix bookkeeping."""

import json
import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("bfcl_eval")

from jaxagent.envs.host import base as host  # noqa: E402
from jaxagent.envs.host.bfcl_calls import format_tool_call, function_docs, validate_call  # noqa: E402
from jaxagent.envs.host.bfcl_env import CATEGORIES, BFCLEnv  # noqa: E402
from jaxagent.envs.host.bfcl_state import deep_copy  # noqa: E402
from jaxagent.eval.error_prefix import collect_error_prefixes, correction_rate  # noqa: E402
from tests.host_play import call, play  # noqa: E402

PER_CATEGORY = 6


@pytest.fixture(scope="module")
def env():
    return BFCLEnv()


@pytest.fixture(scope="module")
def sample(env):
    rng = random.Random(0)
    return [t for c in CATEGORIES for t in rng.sample(env.tasks(c), PER_CATEGORY)]


def test_task_counts_and_splits(env):
    assert {c: len(env.tasks(c)) for c in CATEGORIES} == {"base": 199, "long_context": 199, "miss_func": 198,
                                                          "miss_param": 199}
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) + len(test) == len(env.tasks("all")) == 795
    assert {t.index for t in train}.isdisjoint({t.index for t in test})
    assert all(t.category == "miss_func" for t in env.tasks("miss_func:test"))
    with pytest.raises(ValueError):
        env.tasks("composite")


def test_known_unsolvable_tasks(env):
    """Five ground truths break their own schema or the miss_func holdout; they are left out."""
    full = BFCLEnv(exclude_unsolvable=False)
    bad = {t.id for t in full.tasks("all") if full.ground_truth_problems(t)}
    assert bad == {"multi_turn_base_173", "multi_turn_long_context_173", "multi_turn_miss_func_173",
                   "multi_turn_miss_param_173", "multi_turn_miss_func_49"}
    assert len(full.tasks("all")) == 800


def test_ground_truth_replay_solves_tasks(env, sample):
    for task in sample:
        actions = env.ground_truth_actions(task)
        assert len(actions) == env.upper_bound_turns(task)
        state, steps = play(env, task, actions)
        assert len(steps) == len(actions), task.id
        assert all(info["valid"] for _, _, _, info in steps), task.id
        obs, reward, done, info = steps[-1]
        assert (reward, done, info["success"], state.success) == (1.0, True, True, True), (task.id, info["failure"])
        assert sum(r for _, r, _, _ in steps) == 1.0


def test_skipping_a_turn_fails(env, sample):
    for task in sample:
        first = next(i for i, g in enumerate(task.ground_truth) if g)
        # Close the (empty) turns before the first non-empty one, then answer it with text only.
        state, steps = play(env, task, ["Done."] * first + ["I cannot do that."])
        obs, reward, done, info = steps[-1]
        assert (reward, done, info["success"]) == (0.0, True, False), task.id
        assert "empty_turn_model_response" in info["failure"]


def test_wrong_arguments_fail(env):
    task = env.task("multi_turn_base_0")  # cd, mkdir temp, mv final_report.pdf -> temp
    state, steps = play(env, task, [
        call("cd", folder="document") + call("mkdir", dir_name="tmp") + call("mv", source="final_report.pdf",
                                                                               destination="tmp"),
        "Done."])
    obs, reward, done, info = steps[-1]
    assert (reward, done) == (0.0, True) and "instance_state_mismatch" in info["failure"]
    # A missing read-only call fails the response check instead.
    task = env.task("multi_turn_base_1")  # turn 0: ls(a=True)
    state, steps = play(env, task, [call("pwd"), "Done."])
    assert steps[-1][1] == 0.0 and "execution_response_mismatch" in steps[-1][3]["failure"]


def _to_python(name, args):
    return f"{name}(" + ",".join(f"{k}={v!r}" for k, v in args.items()) + ")"


def test_scores_agree_with_bfcl_checker(env):
    """Perturbed replays (drop a call, alter an argument, or none) scored by this env and by
    bfcl-eval's multi_turn_checker give the same verdict."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    rng = random.Random(1)
    verdicts = []
    for task in rng.sample(env.tasks("all"), 24):
        docs = env.function_docs(task)
        gt = env.ground_truth_calls(task)
        turns = [list(t) for t in gt]
        i = rng.choice([k for k, t in enumerate(turns) if t])
        kind = rng.choice(["drop", "alter", "none"])
        if kind == "drop":
            turns[i].pop(rng.randrange(len(turns[i])))
        elif kind == "alter":
            j = rng.randrange(len(turns[i]))
            name, args = turns[i][j]
            keys = [k for k, v in args.items() if isinstance(v, str)]
            if keys:
                args = {**args, keys[0]: args[keys[0]] + "x"}
            turns[i][j] = (name, args)
        state, _ = env.reset(0, task)
        decoded = []
        for calls in turns:
            steps = []
            if calls and not state.done:
                env.step(state, "\n".join(format_tool_call(n, a) for n, a in calls))
                steps.append([_to_python(n, validate_call(docs[n][1], a)[0]) for n, a in calls])
            if not state.done:
                env.step(state, "Done.")
            decoded.append(steps)
        entry = {"id": task.id, "initial_config": dict(task.initial_config),
                 "involved_classes": list(task.involved_classes)}
        gt_text = [[_to_python(n, validate_call(docs[n][1], a)[0]) for n, a in t] for t in gt]
        ref = multi_turn_checker(decoded, gt_text, entry, task.category, "jaxagent_" + uuid.uuid4().hex)
        assert ref["valid"] == state.success, (task.id, kind, ref.get("error_type"), state.failure)
        verdicts.append(state.success)
    assert any(verdicts) and not all(verdicts)


def test_malformed_calls_are_error_observations(env):
    task = env.task("multi_turn_base_0")
    state, _ = env.reset(0, task)
    state, _, _, _, ok = env.step(state, call("pwd"))
    anchor = env.anchor(state)
    assert ok["next_anchor"] == anchor
    cases = {
        '<tool_call>\n{"name": "cd", "arguments": {"folder": }\n</tool_call>': "not valid JSON",
        call("teleport", where="home"): "unknown function 'teleport'",
        call("cd", folder=7): "must be of type string",
        call("cd"): "missing the required argument 'folder'",
        call("cd", folder="document", force=True): "unexpected argument 'force'",
        '<tool_call>\n{"arguments": {}}\n</tool_call>': "needs a string 'name'",
        '<tool_call>\n["cd"]\n</tool_call>': "must be a JSON object",
        '<tool_call>\n{"name": "cd", "arguments": {"folder": "x"}}': "unterminated",
        "x" * 40_000: "action too long",
        "": "empty action",
    }
    for action, message in cases.items():
        state, obs, reward, done, info = env.step(state, action)
        assert message in obs, (action[:60], obs)
        assert not info["valid"] and info["tool_error"] and not done and reward == 0.0
        assert info["anchor"] == info["next_anchor"] == anchor  # nothing was executed
    # arguments given as a JSON string are accepted; a tool-level error is valid but a tool error
    state, obs, _, _, info = env.step(state, '<tool_call>{"name": "cd", "arguments": "{\\"folder\\": \\"nope\\"}"}</tool_call>')
    assert info["valid"] and info["tool_error"] and "error" in obs
    state, obs, _, _, info = env.step(state, call("cd", folder="document"))
    assert info["valid"] and not info["tool_error"] and info["obs_role"] == "tool"
    assert info["anchor"] == anchor != info["next_anchor"] == env.anchor(state)


def test_anchor_ignores_history(env):
    task = env.task("multi_turn_base_0")
    s1, _ = env.reset(0, task)
    start = env.anchor(s1)
    env.step(s1, call("pwd"))
    s2, _ = env.reset(0, task)
    env.step(s2, call("cd", folder="document") + call("cd", folder=".."))
    assert env.anchor(s1) == env.anchor(s2) == start
    info = env.step(s2, call("mkdir", dir_name="new"))[4]
    assert info["anchor"] == start != info["next_anchor"] == env.anchor(s2)
    assert 0 <= start < 2**31


def test_miss_func_holds_functions_back(env):
    task = env.task("multi_turn_miss_func_0")
    assert task.missed_function == {3: ("sort",)}
    names = lambda turn: {t["function"]["name"] for t in env.tools(task, turn)}  # noqa: E731
    assert "sort" not in names(0) and "sort" in names(3)
    assert '"name": "sort"' not in env.system_prompt(task)
    state, _ = env.reset(0, task)
    _, obs, _, _, info = env.step(state, call("sort", file_name="final_report.pdf"))
    assert "unknown function 'sort'" in obs and not info["valid"]
    actions = env.ground_truth_actions(task)
    state, steps = play(env, task, actions)
    announce = [o for o, _, _, i in steps if i["obs_role"] == "user" and '"name": "sort"' in o]
    assert len(announce) == 1 and steps[-1][1] == 1.0


def test_force_quit_after_too_many_steps():
    env = BFCLEnv(categories=("base",), max_steps_per_turn=3)
    state, _ = env.reset(0, env.task("multi_turn_base_1"))
    for k in range(3):
        state, obs, reward, done, info = env.step(state, call("pwd"))
    assert done and reward == 0.0 and "force_terminated" in info["failure"]
    with pytest.raises(ValueError):
        env.step(state, "Done.")


_FRAGMENTS = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"cd"',
              '"folder"', '"ls"', '"a"', "true", "null", "1e309", "-0", '"\\u0000"', "\n", "<think>", "</think>",
              '"mv"', '"source"', "NaN", '"' + "z" * 50 + '"', "Done."]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.lists(st.sampled_from(_FRAGMENTS), max_size=25).map("".join),
                 st.text(max_size=200), st.binary(max_size=200),
                 st.builds(lambda n, a: format_tool_call(n, a),
                           st.sampled_from(["cd", "ls", "mv", "grep", "diff", "sort", "touch", "post_tweet", "x"]),
                           st.dictionaries(st.sampled_from(["folder", "a", "source", "destination", "file_name",
                                                            "pattern", "content", "bogus"]),
                                           st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                                     st.text(max_size=20), st.lists(st.integers(), max_size=3)),
                                           max_size=3))))
def test_fuzzed_tool_calls_never_raise(env, action):
    state, _ = env.reset(0, env.task("multi_turn_base_0"))
    for _ in range(2):
        state, obs, reward, done, info = env.step(state, action)
        assert isinstance(obs, str) and reward in (0.0, 1.0) and isinstance(info["valid"], bool)
        assert isinstance(info["anchor"], int)
        if done:
            break
    json.dumps({k: v for k, v in info.items()})  # infos stay plain data


def test_error_prefixes_and_correction_rate(env):
    task = env.task("multi_turn_base_1")  # turn 0: ls(a=True)
    gt = env.ground_truth_actions(task)
    bad = call("ls", a="yes")  # wrong type: a tool-call error
    trajectories = []
    for policy in ("rl", "base"):
        state, obs = env.reset(0, task)
        actions, infos, dones = [], [], []
        for a in [bad] + gt:
            state, obs, r, d, info = env.step(state, a)
            actions.append(a)
            infos.append(info)
            dones.append(d)
            if d:
                break
        trajectories.append({"task": task, "actions": actions, "infos": infos, "dones": dones, "policy": policy})
    assert trajectories[0]["infos"][-1]["success"]  # recovering from the error still solves it
    prefixes = collect_error_prefixes(trajectories, t_max=10)
    assert [(p.step, p.source, p.depth) for p in prefixes] == [(0, "rl", 0.1), (0, "base", 0.1)]
    assert prefixes[0].actions == (bad,)
    rates = correction_rate(env, prefixes, {"good": [gt[0], gt[0]], "bad": [bad, "I will stop here."]})
    assert rates["good"]["rate"] == 1.0 and rates["good"]["corrected"] == [True, True]
    assert rates["bad"]["rate"] == 0.0 and rates["bad"]["by_source"] == {"rl": 0.0, "base": 0.0}
    with pytest.raises(ValueError):
        correction_rate(env, prefixes, {"short": [gt[0]]})


def test_registry_builds_bfcl():
    env = host.make("bfcl", categories=("miss_param",))
    assert env.jittable is False and {t.category for t in env.tasks("all")} == {"miss_param"}


@pytest.mark.slow
def test_every_solvable_task_replays_to_reward_one(env):
    failures = []
    for task in env.tasks("all"):
        _, steps = play(env, task, env.ground_truth_actions(task))
        if steps[-1][1] != 1.0:
            failures.append(task.id)
    assert not failures


# ------------------------------------------------------------------------------------------------
# Hostile actions: numbers out of range, deep nesting, deep directory trees
# ------------------------------------------------------------------------------------------------
_BIG_INT = "1" + "0" * 400  # an integer literal beyond the float range


def _raw_call(name, args_json):
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, args_json)


def test_numbers_out_of_range_are_refused():
    docs = {d["name"]: d for d in function_docs("MathAPI")}
    assert validate_call(docs["add"], {"a": 2, "b": 0.5}) == ({"a": 2.0, "b": 0.5}, None)
    for bad, message in [(10**400, "too large for a float"), (float("inf"), "finite number, got inf"),
                         (float("-inf"), "finite number, got -inf"), (float("nan"), "finite number, got nan")]:
        args, err = validate_call(docs["add"], {"a": bad, "b": 1.0})
        assert args is None and message in err, (bad, err)
    args, err = validate_call(docs["mean"], {"numbers": [1.0, float("nan")]})
    assert args is None and "mean()[1] must be a finite number, got nan" in err
    args, err = validate_call(docs["round_number"], {"number": 1.5, "decimal_places": 2**63})
    assert args is None and "64-bit integer" in err
    assert validate_call(docs["round_number"], {"number": 1.5, "decimal_places": 2**63 - 1})[1] is None


HOSTILE_ACTIONS = [
    # huge numbers, NaN and infinities (JSON extensions Python's parser accepts)
    (_raw_call("add", '{"a": %s, "b": 1}' % _BIG_INT), "too large for a float"),
    (_raw_call("add", '{"a": 1e400, "b": 1}'), "finite number"),
    (_raw_call("add", '{"a": NaN, "b": 1}'), "finite number"),
    (_raw_call("subtract", '{"a": Infinity, "b": -Infinity}'), "finite number"),
    (_raw_call("mean", '{"numbers": [1.5, -1e999]}'), "finite number"),
    (_raw_call("round_number", '{"number": 1.5, "decimal_places": %s}' % _BIG_INT), "64-bit integer"),
    (_raw_call("add", '{"a": %s, "b": 1}' % ("9" * 5000)), "not valid JSON"),  # beyond int-parsing limit
    # deep nesting of brackets, braces and parentheses
    ("<tool_call>" + "[" * 20_000 + "</tool_call>", "not valid JSON"),
    (_raw_call("cd", '{"folder": %s}' % ("[" * 3000 + "]" * 3000)), "not valid JSON"),
    (_raw_call("cd", '{"folder": %s}' % ("[" * 400 + "]" * 400)), "must be of type string"),
    (_raw_call("ls", '{"a": %s}' % ('{"x": ' * 400 + "1" + "}" * 400)), "must be of type boolean"),
    ("<tool_call>cd" + "(" * 10_000 + ")" * 10_000 + "</tool_call>", "not valid JSON"),
    ("<tool_call>" + "{" * 15_000, "unterminated"),
    # unicode and very long strings
    (format_tool_call("cd", {"folder": "\ud800\u202e\U0001F600\u0000"}), "No such file or directory"),
    (format_tool_call("c\u0064\u200b", {"folder": "x"}), "unknown function"),
    (format_tool_call("\U0001F4A3" * 100, {}), "unknown function"),
    (format_tool_call("cd", {"folder": "a" * 30_000}), '{"error": "cd: \'aaa'),
    (format_tool_call("x" * 32_000, {}), "unknown function"),
    ("\n".join([format_tool_call("pwd", {})] * 65), "too many tool calls"),
]


@pytest.mark.parametrize("action,message", HOSTILE_ACTIONS, ids=[str(i) for i in range(len(HOSTILE_ACTIONS))])
def test_hostile_actions_are_error_observations(env, action, message):
    task = env.task("multi_turn_base_15")  # GorillaFileSystem + MathAPI
    assert set(task.involved_classes) == {"GorillaFileSystem", "MathAPI"}
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, action)
    assert message in obs, obs[:300]
    assert info["tool_error"] and info["error"] and info["obs_role"] == "tool" and not done and reward == 0.0
    json.dumps(info)  # infos stay plain data
    state, obs, _, _, info = env.step(state, call("pwd"))  # the episode goes on
    assert info["valid"] and not info["tool_error"]


def _deep_tree_actions(levels_per_step=32, steps=19):
    step = "\n".join([call("mkdir", dir_name="d"), call("cd", folder="d")] * levels_per_step)
    return [step] * steps


def test_clone_and_correction_rate_with_a_608_deep_directory_tree(env):
    task = env.task("multi_turn_base_0")
    actions = _deep_tree_actions()
    state, _ = env.reset(0, task)
    for a in actions:
        state, _, _, done, info = env.step(state, a)
        assert info["valid"] and not done
    assert env.step(env.clone(state), call("pwd"))[1].count("/d") == 608
    copy = env.clone(state)  # 20 steps per turn: each state has one step left
    assert "only_in_the_copy" in env.step(copy, call("mkdir", dir_name="only_in_the_copy") + call("ls"))[1]
    assert "only_in_the_copy" not in env.step(state, call("ls"))[1]
    # the correction rate clones the replayed prefix: the last step of the prefix has a tool error
    prefix = actions[:-1] + [actions[-1] + "\n" + call("cd", folder=7)]
    trajectory = {"task": task, "actions": prefix, "infos": [], "policy": "deep"}
    s, _ = env.reset(0, task)
    for a in prefix:
        s, _, _, _, info = env.step(s, a)
        trajectory["infos"].append(info)
    prefixes = collect_error_prefixes([trajectory])
    assert [p.step for p in prefixes] == [18]
    rates = correction_rate(env, prefixes, {"fix": [call("cd", folder="..")], "bad": [call("cd", folder=7)]})
    assert rates["fix"]["corrected"] == [True] and rates["bad"]["corrected"] == [False]


def test_deep_copy_is_depth_safe_and_matches_deepcopy(env):
    task = env.task("multi_turn_base_0")
    state, _ = env.reset(0, task)
    fs = state.instances["GorillaFileSystem"]
    node = fs.root
    for _ in range(5000):  # far beyond the recursion limit
        node._add_directory("d")
        node = node.contents["d"]
    fs._current_dir = node
    copied = env.clone(state)
    c_fs = copied.instances["GorillaFileSystem"]
    depth, d = 0, c_fs._current_dir
    while d.parent is not None:
        assert d.parent.contents[d.name] is d  # parent links point into the copy
        d, depth = d.parent, depth + 1
    assert d is c_fs.root and c_fs.root is not fs.root and depth == 5000
    c_fs._current_dir._add_directory("new")
    assert "new" not in fs._current_dir.contents and fs._current_dir.contents == {}
    assert copied.task is state.task and copied.instances is not state.instances
    shared = {"k": [1, 2]}
    obj = {"a": shared, "b": shared, "t": (1, [2]), "s": {3}, "self": None}
    obj["self"] = obj
    out = deep_copy(obj)
    assert out == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "t": (1, [2]), "s": {3}, "self": out}
    assert out["a"] is out["b"] is not shared and out["self"] is out and out["t"][1] is not obj["t"][1]


@pytest.mark.parametrize("action", [
    _raw_call("add", '{"a\\ud800": 1, "b": 2}'),  # a key with a lone surrogate, echoed in the error
    _raw_call("cd", '{"folder": "x\\udfff"}'),  # a value, echoed in the file system's answer
    _raw_call("\\ud83d", "{}"),  # a function name
])
def test_lone_surrogates_are_escaped_and_the_episode_goes_on(env, tok, action):
    from jaxagent.models import chat
    from jaxagent.rollout import episode

    task = env.task("multi_turn_base_15")
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, action)
    assert info["tool_error"] and not done, obs
    assert "\\ud8" in obs or "\\udf" in obs, obs  # the escape is shown, as text
    obs.encode("utf-8")
    info["error"].encode("utf-8")
    chunk = episode.host_next_chunk(tok, chat.turn_pieces(tok), obs, info["obs_role"], None, True)  # the rollout's path
    assert tok.decode(chunk).count("<tool_response>") == 1
    state, obs, _, done, info = env.step(state, call("pwd"))  # the episode continues normally
    assert info["valid"] and not info["tool_error"] and not done


# ----------------------------------------------------------------------------- the toy variant (bfcl-first)
@pytest.fixture(scope="module")
def first():
    return BFCLEnv(user_turns=1, tool_docs="signatures")


def test_signatures_name_every_available_function_without_descriptions(env, first):
    from jaxagent.envs.host.bfcl_env import signature
    doc = {"name": "f", "description": "long words", "parameters": {
        "type": "dict", "required": ["a"], "properties": {"a": {"type": "float"}, "b": {"type": "dict"},
                                                          "c": {"type": "boolean", "default": False}}}}
    assert signature(doc) == "f(a: number, b: object = null, c: boolean = false)"
    task = first.task("multi_turn_miss_func_0")
    prompt = first.system_prompt(task)
    lines = prompt.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    names = {t["function"]["name"] for t in env.tools(env.task("multi_turn_miss_func_0"), 0)}
    assert {line.split("(")[0] for line in lines} == names and "sort" not in names  # announced at a cut turn
    state, _ = first.reset(0, task)
    assert "unknown function 'sort'" in first.step(state, call("sort", file_name="final_report.pdf"))[1]
    assert "description" not in prompt and len(prompt) < len(env.system_prompt(env.task("multi_turn_miss_func_0"))) / 4
    for bad in (dict(user_turns=0), dict(user_turns=True), dict(user_turns=1.0), dict(tool_docs="yaml")):
        with pytest.raises(ValueError, match="user_turns|tool_docs"):
            BFCLEnv(**bad)


def test_first_requests_are_cut_tasks_and_tasks_without_calls_are_counted(env, first):
    full = {t.id: t for t in env.tasks("all")}
    kept = first.tasks("train")
    assert (len(kept), first.no_call_tasks) == (470, 130)
    assert (len(first.tasks("test")), first.no_call_tasks) == (155, 45)
    for t in kept + first.tasks("test"):
        whole = full.get(t.id) or BFCLEnv(exclude_unsolvable=False).task(t.id)
        assert t.turns == whole.turns[:1] and t.ground_truth == whole.ground_truth[:1] and t.ground_truth[0]
        assert t.missed_function == whole.missed_function  # announced after the cut: held out throughout
    # a task whose first request has no call (a miss_param request missing its value) is left out, not solved free
    no_call = [t for t in env.tasks("train") if not t.ground_truth[0]]
    assert len(no_call) > 100 and not {t.id for t in no_call} & {t.id for t in kept}


def test_first_request_reference_solves_in_two_steps(first):
    rng = random.Random(1)
    for task in rng.sample(first.tasks("all"), 24):
        actions = first.ground_truth_actions(task)
        assert len(actions) == first.upper_bound_turns(task) == 2
        state, steps = play(first, task, actions)
        assert [r for _, r, _, _ in steps] == [0.0, 1.0] and state.success, task.id
        state, steps = play(first, task, actions[1:])  # closing at once: the request's calls were never made
        assert steps[-1][2] and not state.success and "empty_turn" in state.failure
