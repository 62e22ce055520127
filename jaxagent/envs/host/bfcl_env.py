"""BFCL v4 multi-turn function calling (base, long_context, miss_func, miss_param) as a host env: `BFCLEnv`.

The tools and one call's validation / execution are in `bfcl_calls`, tool state copying and comparison in
`bfcl_state`, the study's error-prefix bookkeeping in `jaxagent.eval.error_prefix`. Data and tool classes come from
the installed `bfcl-eval` package (`pip install --no-deps bfcl-eval`; third_party/README.md); nothing is copied.
One step = one assistant message of Qwen3 tool calls, each validated against its function's schema and executed on
the episode's tool instances (obs_role "tool"); a message without a tool call ends the user turn. Scoring is BFCL's
multi-turn checker: at the end of every user turn its state and response checks; the episode fails at the first
failed turn and succeeds (reward 1) when the last passes; at most `max_steps_per_turn` (20) steps per turn.
valid=False: a malformed call, or an empty / too long message. `anchor`: hash of (user-turn index, every tool
instance's public state). `upper_bound_turns`: the reference, one message per user turn with ground-truth calls +
one closing message. Options: `user_turns=N` (tasks cut to their first N requests), `tool_docs="signatures"`.
Protocol, scoring, where it departs from BFCL on purpose and the options: docs/host_study.md, "The envs"; the
toy base's noisy expert on it: `study.host.experts.bfcl`.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Mapping, Sequence

from jaxagent.envs.host.base import HostEnv, ToolCall, coerce_action, make_info, parse_tool_calls, strip_think
from jaxagent.envs.host.bfcl_calls import (MAX_CALLS_PER_MESSAGE, STATELESS, bfcl_data_dir, docs_for, execute_call,
                                           format_tool_call, is_error_result, parse_call_string, read_jsonl,
                                           tool_class, validate_call)
from jaxagent.envs.host.bfcl_state import deep_copy, results_contained, state_anchor, states_equal

CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
TOOL_DOCS = ("json", "signatures")
_MAX_OBS_RESULT_CHARS = 8000


@dataclasses.dataclass(frozen=True)
class BFCLTask:
    id: str
    category: str
    index: int
    turns: tuple  # per user turn: the user message text ("" for a miss_func announcement turn)
    initial_config: Mapping = dataclasses.field(hash=False)
    involved_classes: tuple = ()
    ground_truth: tuple = ()  # per user turn: tuple of call strings, e.g. "cd(folder='document')"
    missed_function: Mapping = dataclasses.field(default_factory=dict, hash=False)  # turn -> held-out names


@dataclasses.dataclass
class BFCLState:
    task: BFCLTask
    instances: dict  # class name -> the model's tool instance
    gt_instances: dict  # class name -> ground-truth tool instance (advanced turn by turn)
    turn: int = 0  # current user turn
    steps_in_turn: int = 0
    turn_calls: int = 0  # calls executed in the current user turn
    all_results: list = dataclasses.field(default_factory=list)  # every executed call's result string
    done: bool = False
    success: bool = False
    failure: str | None = None


# ------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------
def signature(doc: Mapping) -> str:
    """One function as `name(arg: type, opt: type = default)` (`tool_docs="signatures"`): its parameters in the
    doc's order, required ones bare, optional ones with their JSON default (null where the doc gives none)."""
    params = doc.get("parameters", {}) or {}
    required = set(params.get("required", ()))
    args = []
    for name, schema in (params.get("properties", {}) or {}).items():
        kind = _json_schema({"type": schema.get("type", "any")}).get("type", "any")
        arg = f"{name}: {kind}"
        if name not in required:
            arg += " = " + json.dumps(schema.get("default"), ensure_ascii=False)
        args.append(arg)
    return f"{doc['name']}({', '.join(args)})"


def _json_schema(schema: Any) -> Any:
    """BFCL parameter schema -> JSON Schema names (dict->object, float->number, tuple->array)."""
    if isinstance(schema, Mapping):
        out = {}
        for k, v in schema.items():
            if k == "type" and isinstance(v, str):
                v = {"dict": "object", "float": "number", "tuple": "array"}.get(v, v)
                if v == "any":
                    continue
            out[k] = _json_schema(v) if k != "enum" else v
        return out
    if isinstance(schema, list):
        return [_json_schema(v) for v in schema]
    return schema


class BFCLEnv(HostEnv):
    """BFCL v4 multi-turn categories as a host environment (module docstring)."""

    name = "bfcl"

    def __init__(self, categories: Sequence[str] = CATEGORIES, max_steps_per_turn: int = 20,
                 test_every: int = 4, exclude_unsolvable: bool = True, user_turns: int | None = None,
                 tool_docs: str = "json"):
        bad = [c for c in categories if c not in CATEGORIES]
        if bad:
            raise ValueError(f"unknown BFCL categories {bad}; expected a subset of {CATEGORIES}")
        if max_steps_per_turn < 1:
            raise ValueError("max_steps_per_turn must be >= 1")
        if user_turns is not None and (isinstance(user_turns, bool) or not isinstance(user_turns, int)
                                       or user_turns < 1):
            raise ValueError(f"user_turns must be an integer >= 1 or None, got {user_turns!r}")
        if tool_docs not in TOOL_DOCS:
            raise ValueError(f"tool_docs must be one of {TOOL_DOCS}, got {tool_docs!r}")
        self.user_turns = user_turns
        self.tool_docs = tool_docs
        self.no_call_tasks = 0  # tasks of the last `tasks()` list left out for having no ground-truth call
        self.categories = tuple(categories)
        self.max_steps_per_turn = int(max_steps_per_turn)
        self.test_every = int(test_every)
        self.exclude_unsolvable = bool(exclude_unsolvable)
        self._tasks: dict[str, list[BFCLTask]] = {}
        self._gt_calls: dict[str, tuple] = {}

    @property
    def cut_note(self) -> str:
        """Which cut of BFCL v4 multi-turn this env runs, for reports."""
        docs = "tools as one-line signatures" if self.tool_docs == "signatures" else "tools as BFCL's JSON documents"
        if self.user_turns is None:
            return f"every user request of each task (BFCL's multi-turn tasks whole); {docs}"
        if self.user_turns == 1:
            return (f"the first user request of each task only: single-request tool calling, not BFCL's multi-turn "
                    f"state; {docs}")
        return (f"the first {self.user_turns} user requests of each task (multi-turn: the state one request leaves is "
                f"what the next works on); {docs}")

    grading_note = "BFCL's multi-turn checks: at the end of every user turn the state and the responses must match"

    # -- data ------------------------------------------------------------------------------------
    def _load(self, category: str) -> list[BFCLTask]:
        if category not in self._tasks:
            root = bfcl_data_dir()
            entries = read_jsonl(root / f"BFCL_v4_multi_turn_{category}.json")
            answers = {a["id"]: a["ground_truth"] for a in read_jsonl(
                root / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}
            tasks = []
            n = self.user_turns
            for e in entries:
                turns = tuple(" ".join(m["content"] for m in t if m.get("role") == "user") for t in e["question"])
                truth = tuple(tuple(g) for g in answers[e["id"]])
                missed = {int(k): tuple(v) for k, v in e.get("missed_function", {}).items()}
                if n is not None:  # a function announced at a cut turn stays held out (never announced)
                    turns, truth = turns[:n], truth[:n]
                tasks.append(BFCLTask(
                    id=e["id"], category=category, index=int(e["id"].rsplit("_", 1)[1]), turns=turns,
                    initial_config=e.get("initial_config", {}), involved_classes=tuple(e["involved_classes"]),
                    ground_truth=truth, missed_function=missed))
            self._tasks[category] = tasks
        return self._tasks[category]

    def tasks(self, split: str = "train") -> list[BFCLTask]:
        """Splits: "all" | "train" | "test" over this env's categories, a category name, or
        "<category>:train" / "<category>:test". Test = scenario index % test_every == test_every-1
        (the same scenario is in the same split in every category)."""
        cat, _, part = split.partition(":") if ":" in split else (None, None, split)
        if split in CATEGORIES:
            cat, part = split, "all"
        cats = [cat] if cat else list(self.categories)
        if any(c not in CATEGORIES for c in cats) or part not in ("all", "train", "test"):
            raise ValueError(f"unknown split {split!r}; use all/train/test, a category {CATEGORIES}, "
                             "or '<category>:train|test'")
        out = [t for c in cats for t in self._load(c)]
        if self.exclude_unsolvable:
            out = [t for t in out if not self.ground_truth_problems(t)]
        k = self.test_every
        if part == "train":
            out = [t for t in out if t.index % k != k - 1]
        elif part == "test":
            out = [t for t in out if t.index % k == k - 1]
        if self.user_turns is not None:
            n = len(out)
            out = [t for t in out if any(t.ground_truth)]
            self.no_call_tasks = n - len(out)
        return out

    def task(self, task_id: str) -> BFCLTask:
        category = task_id.removeprefix("multi_turn_").rsplit("_", 1)[0]
        for t in self._load(category):
            if t.id == task_id:
                return t
        raise ValueError(f"no BFCL task {task_id!r}")

    def function_docs(self, task: BFCLTask) -> dict[str, tuple[str, dict]]:
        """function name -> (class name, BFCL function doc) for every function of the task's classes (miss_func's
        held-out functions included)."""
        return docs_for(tuple(task.involved_classes))

    def _held_out(self, task: BFCLTask, turn: int) -> set[str]:
        """Functions not yet callable at user turn `turn` (miss_func)."""
        return {f for t, names in task.missed_function.items() if t > turn for f in names}

    def tools(self, task: BFCLTask, turn: int = 0) -> list[dict]:
        """OpenAI-style tool list available at `turn` (for chat templates that take `tools=`)."""
        held = self._held_out(task, turn)
        return [self._tool_entry(d) for _, (_, d) in self.function_docs(task).items() if d["name"] not in held]

    @staticmethod
    def _tool_entry(doc: Mapping) -> dict:
        return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                                 "parameters": _json_schema(doc.get("parameters", {}))}}

    def _tool_text(self, docs: Sequence[Mapping]) -> str:
        if self.tool_docs == "signatures":
            return "\n".join(signature(d) for d in docs)
        return "\n".join(json.dumps(self._tool_entry(d), ensure_ascii=False) for d in docs)

    def system_prompt(self, task: BFCLTask) -> str:
        held = self._held_out(task, 0)
        tools = self._tool_text([d for _, (_, d) in self.function_docs(task).items() if d["name"] not in held])
        if self.tool_docs == "signatures":
            return (
                "You are an assistant that carries out the user's requests by calling functions. For each "
                "request, call the functions needed to complete it; you may make several calls in one "
                "message and you will see their results. When the request is done, or cannot be done, reply with "
                "a short plain message without any function call: that ends your turn.\n\n"
                f"# Tools\n<tools>\n{tools}\n</tools>\n\n"
                "To call a function, write one block per call:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>")
        return (
            "You are an assistant that carries out the user's requests by calling functions. For each "
            "request, call the functions needed to complete it; you may make several calls in one "
            "message and you will see their results. When the request is done, or cannot be done "
            "because a needed function or a required parameter value is missing, reply with a short "
            "plain message without any function call: that ends your turn, and the user may send a "
            "new request.\n\n"
            "# Tools\n\nThe functions you can call are described in JSON inside <tools></tools>:\n"
            f"<tools>\n{tools}\n</tools>\n\n"
            "To call a function, write one block per call, with the function name and a JSON object of "
            "arguments:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
        )

    def ground_truth_calls(self, task: BFCLTask) -> tuple:
        """Per user turn, the ground-truth calls as (name, kwargs) pairs."""
        if task.id not in self._gt_calls:
            self._gt_calls[task.id] = tuple(tuple(parse_call_string(s, task.involved_classes) for s in turn)
                                            for turn in task.ground_truth)
        return self._gt_calls[task.id]

    def ground_truth_problems(self, task: BFCLTask) -> list[str]:
        """Why the replayed ground truth cannot pass in this env (empty for all but a few tasks):
        a ground-truth call that breaks its function's schema (e.g. the scenario-173 tasks give the
        integer `ticket_id` as a string and expect the resulting error), or that uses a miss_func
        function before the turn that makes it available. Such tasks are left out of `tasks()` unless
        exclude_unsolvable=False."""
        docs = self.function_docs(task)
        problems = []
        for turn, calls in enumerate(self.ground_truth_calls(task)):
            held = self._held_out(task, turn)
            for name, kwargs in calls:
                if name in held:
                    problems.append(f"turn {turn}: {name} is held out until a later turn")
                    continue
                _, err = validate_call(docs[name][1], kwargs)
                if err:
                    problems.append(f"turn {turn}: {err}")
        return problems

    def ground_truth_actions(self, task: BFCLTask) -> list[str]:
        """The reference solution as assistant messages: per user turn, one message with all its
        ground-truth calls (if any), then a closing text message."""
        actions = []
        for calls in self.ground_truth_calls(task):
            if calls:
                actions.append("\n".join(format_tool_call(n, a) for n, a in calls))
            actions.append("Done.")
        return actions

    def upper_bound_turns(self, task: BFCLTask) -> int:
        return sum(1 + (len(g) > 0) for g in task.ground_truth)

    # -- episode ---------------------------------------------------------------------------------
    def _instances(self, task: BFCLTask) -> dict:
        long_context = task.category == "long_context"
        out = {}
        for c in task.involved_classes:
            inst = tool_class(c)()
            if c not in STATELESS:
                inst._load_scenario(copy.deepcopy(dict(task.initial_config).get(c, {})), long_context=long_context)
            out[c] = inst
        return out

    def _user_message(self, task: BFCLTask, turn: int) -> str:
        if turn in task.missed_function:
            docs = self.function_docs(task)
            added = self._tool_text([docs[f][1] for f in task.missed_function[turn] if f in docs])
            text = task.turns[turn].strip()
            return (f"These functions are now available as well:\n<tools>\n{added}\n</tools>\n"
                    + (text if text else "Please continue with my earlier request."))
        return task.turns[turn]

    def reset(self, seed: int, task: BFCLTask) -> tuple[BFCLState, str]:
        if not isinstance(task, BFCLTask):
            raise ValueError(f"BFCLEnv.reset needs a BFCLTask, got {type(task).__name__}")
        state = BFCLState(task=task, instances=self._instances(task), gt_instances=self._instances(task))
        return state, self._user_message(task, 0)

    def clone(self, state: BFCLState) -> BFCLState:
        """Independent copy of the tool instances and bookkeeping (the task is shared, not copied);
        depth-safe (`deep_copy`), so a deep directory tree built by the model can be cloned."""
        return deep_copy(state, memo={id(state.task): state.task})

    def anchor(self, state: BFCLState) -> int:
        return state_anchor(state.turn, state.instances)

    def _end_turn(self, state: BFCLState) -> tuple[str, str | None]:
        """Advance the ground truth by the current turn and run BFCL's checks; (obs, failure)."""
        task = state.task
        gt_calls = self.ground_truth_calls(task)[state.turn]
        docs = self.function_docs(task)
        gt_results = []
        for name, kwargs in gt_calls:
            cls, doc = docs[name]
            args, err = validate_call(doc, kwargs)
            gt_results.append(execute_call(state.gt_instances[cls], name, args if err is None else kwargs))
        failure = None
        if gt_calls:
            if state.turn_calls == 0:
                failure = f"multi_turn:empty_turn_model_response (turn {state.turn})"
            elif not all(states_equal(state.instances[c], state.gt_instances[c]) for c in task.involved_classes):
                failure = f"multi_turn:instance_state_mismatch (turn {state.turn})"
            elif not results_contained(gt_results, state.all_results):
                failure = f"multi_turn:execution_response_mismatch (turn {state.turn})"
        if failure is not None:
            state.done, state.success, state.failure = True, False, failure
            return "The task has ended.", failure
        state.turn += 1
        state.steps_in_turn = 0
        state.turn_calls = 0
        if state.turn >= len(task.turns):
            state.done, state.success = True, True
            return "All requests are complete.", None
        return self._user_message(task, state.turn), None

    def step(self, state: BFCLState, action_text: str):
        if not isinstance(state, BFCLState):
            raise ValueError(f"BFCLEnv.step needs a BFCLState, got {type(state).__name__}")
        if state.done:
            raise ValueError("BFCLEnv.step called on a finished episode")
        before = self.anchor(state)
        text, err = coerce_action(action_text)
        calls = parse_tool_calls(strip_think(text), MAX_CALLS_PER_MESSAGE) if err is None else []
        if err is None and not calls:
            # A plain message ends the user turn.
            obs, failure = self._end_turn(state)
            reward = 1.0 if state.done and state.success else 0.0
            return state, obs, reward, state.done, make_info(
                valid=True, success=state.success, anchor=before, next_anchor=self.anchor(state), error=None,
                tool_error=False,
                obs_role="user", n_calls=0, failure=failure, user_turn=state.turn)
        state.steps_in_turn += 1
        if err is not None:
            results, valid, tool_error = [f"Error: {err}"], False, True
        else:
            results, valid, tool_error = self._run_calls(state, calls)
        obs = "\n".join(f"<tool_response>\n{_clip(r)}\n</tool_response>" for r in results)
        failure = None
        if state.steps_in_turn >= self.max_steps_per_turn:
            failure = f"multi_turn:force_terminated ({self.max_steps_per_turn} tool-call steps in turn {state.turn})"
            state.done, state.success, state.failure = True, False, failure
        errors = [r for r in results if r.startswith("Error") or is_error_result(r)]
        return state, obs, 0.0, state.done, make_info(
            valid=valid, success=False, anchor=before, next_anchor=self.anchor(state),
            error="; ".join(errors)[:1000] or None,
            tool_error=tool_error, obs_role="tool", n_calls=len(calls), failure=failure, user_turn=state.turn)

    def _run_calls(self, state: BFCLState, calls: list[ToolCall]) -> tuple[list[str], bool, bool]:
        docs = self.function_docs(state.task)
        held = self._held_out(state.task, state.turn)
        results, valid, tool_error = [], True, False
        for c in calls:
            if c.error is not None:
                results.append(f"Error: {c.error}")
                valid, tool_error = False, True
                continue
            if c.name not in docs or c.name in held:
                results.append(f"Error: unknown function '{c.name}'")
                valid, tool_error = False, True
                continue
            cls, doc = docs[c.name]
            try:
                args, err = validate_call(doc, c.arguments)
            except (RecursionError, OverflowError, ValueError, TypeError, MemoryError) as e:
                args, err = None, f"arguments of {c.name}() could not be checked ({type(e).__name__})"
            if err is not None:
                results.append(f"Error: {err}")
                valid, tool_error = False, True
                continue
            r = execute_call(state.instances[cls], c.name, args)
            state.all_results.append(r)
            state.turn_calls += 1
            tool_error = tool_error or is_error_result(r)
            results.append(r)
        return results, valid, tool_error


def _clip(text: str) -> str:
    if len(text) <= _MAX_OBS_RESULT_CHARS:
        return text
    return text[:_MAX_OBS_RESULT_CHARS] + f"... [{len(text) - _MAX_OBS_RESULT_CHARS} more characters]"
