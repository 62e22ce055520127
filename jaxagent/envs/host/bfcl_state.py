"""BFCL v4 tool state (`bfcl_env`): depth-safe copying, canonical state (anchors) and BFCL's state and
response checks.

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import collections
import copy
import copyreg
import types
from typing import Any, Mapping, Sequence

from jaxagent.envs.host.base import stable_hash

# ------------------------------------------------------------------------------------------------
# Depth-safe copying
# ------------------------------------------------------------------------------------------------
_ATOMIC = frozenset({type(None), bool, int, float, complex, str, bytes, range, type, types.FunctionType,
                     types.BuiltinFunctionType, type(Ellipsis), type(NotImplemented)})


def _plain_instance(obj: Any) -> bool:
    """An instance copy.deepcopy would copy as cls.__new__(cls) plus a deep copy of its __dict__."""
    cls = type(obj)
    return (hasattr(obj, "__dict__") and not hasattr(obj, "__deepcopy__") and not hasattr(cls, "__setstate__")
            and cls not in copyreg.dispatch_table
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and not any("__slots__" in vars(k) for k in cls.__mro__))


def deep_copy(obj: Any, memo: dict | None = None) -> Any:
    """copy.deepcopy without recursion through dicts, lists and plain instances (objects copied as
    class + __dict__), so nesting depth (e.g. a deep directory tree made by the model) is not limited
    by the interpreter's recursion limit. Shared references and cycles are preserved through `memo`;
    other objects (datetime, random.Random, tuples, sets, ...) go to copy.deepcopy with the same memo."""
    memo = {} if memo is None else memo
    keep_alive: list = []
    pending: list = []  # (original, copy) whose contents are still to be filled in

    def shell(x: Any) -> Any:
        if type(x) in _ATOMIC:
            return x
        found = memo.get(id(x), memo)
        if found is not memo:
            return found
        t = type(x)
        if t is dict:
            y = {}
        elif t is list:
            y = []
        elif _plain_instance(x):
            y = t.__new__(t)
        else:
            return copy.deepcopy(x, memo)
        memo[id(x)] = y
        keep_alive.append(x)
        pending.append((x, y))
        return y

    root = shell(obj)
    while pending:
        x, y = pending.pop()
        if type(x) is dict:
            for k, v in x.items():  # keys are hashed too, so they are copied whole
                y[k if type(k) in _ATOMIC else copy.deepcopy(k, memo)] = shell(v)
        elif type(x) is list:
            y.extend(shell(v) for v in x)
        else:
            y.__dict__.update((k, shell(v)) for k, v in vars(x).items())
    return root


# ------------------------------------------------------------------------------------------------
# State canonicalisation (anchors) and BFCL's state comparison
# ------------------------------------------------------------------------------------------------
def _canon(obj: Any, depth: int = 0) -> Any:
    if depth > 60:
        return "<deep>"
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _canon(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canon(v, depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_canon(v, depth + 1) for v in obj), key=repr)
    if hasattr(obj, "__dict__"):
        out = {k: _canon(v, depth + 1) for k, v in vars(obj).items() if not k.startswith("_") and k != "parent"}
        out["__class__"] = type(obj).__name__
        return out
    return repr(obj)


def _cwd(instance: Any) -> str | None:
    d = getattr(instance, "_current_dir", None)
    names = []
    while d is not None and len(names) < 100:
        names.append(getattr(d, "name", "?"))
        d = getattr(d, "parent", None)
    return "/".join(reversed(names)) if names else None


def state_anchor(turn: int, instances: Mapping[str, Any]) -> int:
    return stable_hash([turn, {c: [_canon(i), _cwd(i)] for c, i in sorted(instances.items())}])


def states_equal(model_instance: Any, gt_instance: Any) -> bool:
    """BFCL's state check: every public attribute of the ground-truth instance compares equal."""
    for k, v in vars(gt_instance).items():
        if k.startswith("_"):
            continue
        if getattr(model_instance, k, object()) != v:
            return False
    return True


def results_contained(gt_results: Sequence[str], model_results: Sequence[str]) -> bool:
    """BFCL's response check: the ground-truth results are a sub-multiset of the model's results."""
    have = collections.Counter(model_results)
    need = collections.Counter(gt_results)
    return all(have[k] >= n for k, n in need.items())
