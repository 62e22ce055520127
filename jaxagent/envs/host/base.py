"""Host-side (non-jittable) environments: the shared interface, helpers and the env registry.

No dimension legend: host-side Python, no arrays.

Interface. A host env is a Python object with `jittable = False` and
  tasks(split) -> list                    task objects ("train" | "test" | "all", plus env-specific splits)
  system_prompt(task) -> str              instructions (and tools / schema) for the system message
  reset(seed, task) -> (state, obs)       obs is the first user message (the SQL, code and BFCL envs
                                          are deterministic: they ignore the seed)
  step(state, action_text) -> (state, obs, reward, done, info)
  upper_bound_turns(task) -> int          turns of the reference solution: the structural upper bound
                                          (docs/study.md, "Structural upper bound": T >= this is solvable)
  ground_truth_actions(task) -> [str]     where defined, the reference solution's replies (the SFT targets
                                          of the host study's toy base, `study.host.sft`)
  slipped_actions(task, seed, fix=1.0) -> [str] | None   where defined, the reference with one generic
                                          mistake (a noisy expert's slip; None where none applies): the toy
                                          base's noise; on coding and BFCL followed, with probability `fix`
                                          (drawn with seed), by the reference, else by giving up
  checked_actions(task, seed, slip) -> [str]   where defined, a reference that checks before it answers
                                          (its first turn a tool call, slipped with `slip`; the toy base's
                                          multi-turn episodes)
  submission_mistake(task, actions, solved) -> str   where defined, what is wrong with an episode's final
                                          submission, one of `mistake_kinds` (the toy studies' mistake tables)
  step_quality(state, action_text) -> float   where defined (coding: unit-test pass rate)
  anchor(state) -> int                    GiGPO anchor of a state (below)
  clone(state) -> state                   an independent copy, to branch (error states, matched states)
Observations (and info["error"]) are valid text: `HostEnv` passes what every subclass's reset and step
return through `valid_text` (lone surrogates escaped), so no observation can break a tokenizer.
`step` may mutate and return its input state: clone first to keep a state. Stepping a finished
episode is a caller bug and raises ValueError. Any model output (empty, huge, random bytes, bad JSON,
unknown function, wrong argument types) is answered with an error observation and `valid=False`,
never an exception.

Threads and time limits. `rollout.host_rollout` runs reset and step (with its process-reward hook) on
worker threads, several episodes at once and from any thread: an env keeps no mutable state shared
between episodes unless it guards it, and one episode's state is used by one call at a time. A call
still running after the rollout's `step_timeout_s` is abandoned: its episode fails (a time-out) and
its state is never used again, but the thread is left to finish, so a step bounds its own work (the
SQL env's query time limit, the sandbox's timeout) and the rollout's limit is the last resort.

`info` always has: valid (the action parsed and was well-formed), success (the task is solved),
anchor (`anchor(state)` of the state BEFORE the step, the state the action was taken in: what GiGPO
groups steps on, as in jaxagent.envs.jax.base), next_anchor (`anchor` of the state after the step),
error (str or None), obs_role ("user" for a new user message, "tool" for tool results; how the
rollout should wrap obs in the chat template). An anchor is a stable hash, in [0, 2**31) so that it
fits int32 arrays, of the env state without history; each env documents what it hashes.

Registry: `register(name, factory)`, `make(name, **kwargs)`. Built in (imported lazily): 'sql', 'code',
'bfcl'.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import re
from typing import Any, Callable

MAX_ACTION_CHARS = 32_768  # longer actions are refused with an error observation
MAX_TOOL_CALLS = 32  # tool calls per action


def valid_text(text: str) -> str:
    """`text` with every lone surrogate (a code point no UTF-8 encoder or tokenizer accepts, e.g. from a
    JSON escape "\\ud800" in the model's tool call, echoed back) replaced by its escape text `\\ud800`;
    valid text is returned as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _valid_observations(method):
    """Wrap reset/step so that the observation (result[1]) and info["error"] are valid text."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        out = method(*args, **kwargs)
        if isinstance(out, tuple) and len(out) >= 2 and isinstance(out[1], str):
            out = (out[0], valid_text(out[1]), *out[2:])
            info = out[4] if len(out) == 5 else None
            if isinstance(info, dict) and isinstance(info.get("error"), str):
                info["error"] = valid_text(info["error"])
        return out
    wrapped.valid_observations = True
    return wrapped


class HostEnv:
    """Base class of host-side environments (see the module docstring for the contract).

    Every subclass's `reset` and `step` return valid text (`valid_text`): the one place where the
    observations of all host envs are made safe to tokenise, whatever the model's action echoed."""

    jittable = False
    name = "host"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("reset", "step"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "valid_observations", False):
                setattr(cls, name, _valid_observations(method))

    def tasks(self, split: str = "train") -> list:
        raise NotImplementedError

    def system_prompt(self, task) -> str:
        raise NotImplementedError

    def upper_bound_turns(self, task) -> int:
        raise NotImplementedError

    def reset(self, seed: int, task) -> tuple[Any, str]:
        raise NotImplementedError

    def step(self, state, action_text: str) -> tuple[Any, str, float, bool, dict]:
        raise NotImplementedError

    def anchor(self, state) -> int:
        raise NotImplementedError

    def step_quality(self, state, action_text: str) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no step quality")

    def ground_truth_actions(self, task) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} defines no reference solution")

    def slipped_actions(self, task, seed: int, fix: float = 1.0) -> list[str] | None:
        raise NotImplementedError(f"{type(self).__name__} defines no slipped reference solution")

    def checked_actions(self, task, seed: int, slip: bool) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} defines no checked reference solution")

    mistake_kinds: tuple = ()  # what `submission_mistake` can return; () where the env sorts no submissions

    def submission_mistake(self, task, actions: list, solved: bool) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not sort submissions by mistake")

    def clone(self, state):
        return copy.deepcopy(state)


def check_slip_fix(fix, what: str = "slip fix probability") -> float:
    """`fix` of `slipped_actions` (the probability that the noisy expert fixes its slip) as a float; ValueError
    (naming it `what`) unless it is a number in [0, 1]."""
    if isinstance(fix, bool) or not isinstance(fix, (int, float)) or not 0 <= fix <= 1:
        raise ValueError(f"{what} must be a number in [0, 1], got {fix!r}")
    return float(fix)


def host_cores() -> int:
    """The cores this process may run on (`os.sched_getaffinity`; `os.cpu_count` where that is missing): the
    default number of env workers and of sandbox runs at once."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def make_info(*, valid: bool, success: bool, anchor: int, next_anchor: int, error: str | None,
              obs_role: str = "user", **extra) -> dict:
    info = {"valid": bool(valid), "success": bool(success), "anchor": int(anchor),
            "next_anchor": int(next_anchor), "error": error, "obs_role": obs_role}
    info.update(extra)
    return info


def stable_hash(obj: Any, bits: int = 31) -> int:
    """A process-independent hash in [0, 2**bits) of a JSON-like object (sha256 of its canonical JSON)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr, ensure_ascii=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % (1 << bits)


def coerce_action(action: Any, max_chars: int = MAX_ACTION_CHARS) -> tuple[str | None, str | None]:
    """(text, None) for a usable action, (None, error message) otherwise. Bytes are decoded leniently."""
    if isinstance(action, (bytes, bytearray)):
        action = bytes(action).decode("utf-8", "replace")
    if not isinstance(action, str):
        return None, f"action must be text, got {type(action).__name__}"
    if len(action) > max_chars:
        return None, f"action too long ({len(action)} characters, limit {max_chars})"
    action = action.replace("\x00", "")
    if not action.strip():
        return None, "empty action"
    return action, None


_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def strip_think(text: str) -> str:
    """Drop Qwen3 `<think>...</think>` blocks (an unterminated one runs to the end of the text)."""
    return _THINK_RE.sub("", text)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed `<tool_call>` block: name and arguments, or an error saying why it is malformed."""

    name: str | None
    arguments: dict | None
    error: str | None = None


_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, max_calls: int = MAX_TOOL_CALLS) -> list[ToolCall]:
    """Parse every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block of `text`.

    Qwen3's tool-call format. Returns [] when the text has no tool-call tag; a malformed block gives a
    ToolCall with `error` set (bad JSON, missing name, arguments not an object, unterminated tag).
    `arguments` may also be a JSON string that encodes an object (some models emit that).
    """
    calls: list[ToolCall] = []
    rest_start = 0
    for m in _CALL_RE.finditer(text):
        calls.append(_parse_call_body(m.group(1)))
        rest_start = m.end()
    tail = text[rest_start:]
    if "<tool_call>" in tail:
        calls.append(ToolCall(None, None, "unterminated <tool_call> (missing </tool_call>)"))
    elif not calls and "</tool_call>" in text:
        calls.append(ToolCall(None, None, "</tool_call> without a matching <tool_call>"))
    if len(calls) > max_calls:
        return [ToolCall(None, None, f"too many tool calls in one message ({len(calls)}, limit {max_calls})")]
    return calls


def _parse_call_body(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError) as e:
        return ToolCall(None, None, f"tool call is not valid JSON: {str(e)[:200]}")
    if not isinstance(obj, dict):
        return ToolCall(None, None, "tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, None, "tool call needs a string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ToolCall(name, None, f"arguments of {name} are a string that is not a JSON object")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, None, f"arguments of {name} must be a JSON object")
    return ToolCall(name, args)


def split_tasks(tasks: list, split: str, test_every: int = 4) -> list:
    """Deterministic split by position: every `test_every`-th task (index % test_every ==
    test_every - 1) is "test", the rest "train"; "all" is everything."""
    if split == "all":
        return list(tasks)
    if split == "train":
        return [t for i, t in enumerate(tasks) if i % test_every != test_every - 1]
    if split == "test":
        return [t for i, t in enumerate(tasks) if i % test_every == test_every - 1]
    raise ValueError(f"unknown split {split!r}; expected 'train', 'test' or 'all'")


# ------------------------------------------------------------------------------------------------
# Registry. Factories are callables or "module:attribute" strings imported on first use, so that
# selecting 'sql' does not import the BFCL package.
# ------------------------------------------------------------------------------------------------
_FACTORIES: dict[str, Callable[..., Any] | str] = {
    "sql": "jaxagent.envs.host.sql_env:SQLEnv",
    "code": "jaxagent.envs.host.code_env:CodeEnv",
    "bfcl": "jaxagent.envs.host.bfcl_env:BFCLEnv",
}


def register(name: str, factory: Callable[..., Any] | str, *, overwrite: bool = False) -> None:
    """Register an environment factory under `name` (a callable or a "module:attribute" string)."""
    if not isinstance(name, str) or not name:
        raise ValueError("env name must be a non-empty string")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise ValueError(f"factory for {name!r} must be callable or 'module:attribute', got {factory!r}")
    if name in _FACTORIES and not overwrite:
        raise ValueError(f"environment {name!r} is already registered (pass overwrite=True to replace)")
    _FACTORIES[name] = factory


def registered() -> list[str]:
    return sorted(_FACTORIES)


def make(name: str, **kwargs):
    """Build the environment registered as `name` with constructor keyword arguments."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown environment {name!r}; registered: {registered()}")
    factory = _FACTORIES[name]
    if isinstance(factory, str):
        module_name, attr = factory.split(":", 1)
        factory = getattr(importlib.import_module(module_name), attr)
    return factory(**kwargs)
