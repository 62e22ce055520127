"""Host-side (non-jittable) environments: the shared interface `HostEnv`, its helpers and the env registry.

A host env has `jittable = False` and
  tasks(split) -> list;  system_prompt(task) -> str;  reset(seed, task) -> (state, obs);
  step(state, action_text) -> (state, obs, reward, done, info);  upper_bound_turns(task) -> int;
  anchor(state) -> int;  clone(state) -> state;  where defined: ground_truth_actions, step_quality.
`info` always has valid, success, anchor (of the state BEFORE the step), next_anchor, error and obs_role ("user" |
"tool"); an anchor is a stable hash in [0, 2**31) of the state without history. Observations and info["error"]
are valid text (`valid_text`). Model output never raises: it gets an error observation and valid=False; stepping a
finished episode raises ValueError; `step` may mutate its state (clone to keep one). Reset and step run on worker
threads, several episodes at once, and a step bounds its own work.
Registry: `register(name, factory)`, `make(name, **kwargs)`; built in (imported lazily): 'sql', 'code', 'bfcl'.
Each method's contract, threads and time limits: docs/host_rollout.md, "The env interface".

No dimension legend: host-side Python, no arrays.
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
    """Base class of host-side environments (the contract: module docstring; docs/host_rollout.md).

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

    def clone(self, state):
        return copy.deepcopy(state)


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
