"""BFCL v4's tools (`bfcl_env`): the tool classes and their function docs from the installed `bfcl-eval`
package, and what happens to one call: schema validation, execution with BFCL's result strings, parsing
a ground-truth call string, and writing a Qwen3 tool call.

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import ast
import decimal
import functools
import importlib
import importlib.util
import inspect
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

_TOOL_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
_CLASSES = {  # class -> (module, function-doc file)
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS = {"MathAPI"}
_MAX_PRECISION = 1000
_MAX_INT = 2**63 - 1  # larger integer arguments are refused (no BFCL parameter needs them)
MAX_CALLS_PER_MESSAGE = 64  # the largest ground-truth turn has 34 calls


def bfcl_data_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the BFCL environment needs the bfcl-eval package: pip install --no-deps bfcl-eval")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def function_docs(class_name: str) -> tuple[dict, ...]:
    return tuple(read_jsonl(bfcl_data_dir() / "multi_turn_func_doc" / _CLASSES[class_name][1]))


@functools.lru_cache(maxsize=None)
def tool_class(class_name: str) -> type:
    return getattr(importlib.import_module(_TOOL_MODULE + _CLASSES[class_name][0]), class_name)


@functools.lru_cache(maxsize=None)
def docs_for(class_names: tuple) -> dict[str, tuple[str, dict]]:
    return {d["name"]: (c, d) for c in class_names for d in function_docs(c)}


# ------------------------------------------------------------------------------------------------
# Schema validation and execution
# ------------------------------------------------------------------------------------------------
def _number_error(value: Any, path: str) -> str | None:
    """A float parameter must be a finite float (NaN, Infinity, 1e400 and integers beyond the float
    range are refused, not passed to the tools)."""
    try:
        as_float = float(value)
    except OverflowError:
        return f"{path} is too large for a float"
    if not math.isfinite(as_float):
        return f"{path} must be a finite number, got {as_float!r}"
    return None


def _short_repr(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _type_error(value: Any, schema: Mapping, path: str) -> str | None:
    """None if `value` fits the BFCL parameter schema, else a message naming the problem."""
    t = schema.get("type", "any")
    ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "tuple": lambda v: isinstance(v, list),
        "dict": lambda v: isinstance(v, dict),
        "object": lambda v: isinstance(v, dict),
    }.get(t)
    if ok is not None and not ok(value):
        return f"{path} must be of type {t}, got {type(value).__name__}"
    if t in ("float", "number") or (isinstance(value, float) and t == "any"):
        err = _number_error(value, path)
        if err:
            return err
    if t == "integer" and not -_MAX_INT <= value <= _MAX_INT:
        return f"{path} must be a 64-bit integer (|value| <= 2**63 - 1)"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} must be one of {schema['enum']}, got {_short_repr(value)}"
    if t in ("array", "tuple") and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            err = _type_error(v, schema["items"], f"{path}[{i}]")
            if err:
                return err
    if t in ("dict", "object") and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        for k in schema.get("required", []):
            if k not in value:
                return f"{path} is missing required key '{k}'"
        for k, v in value.items():
            if k in props:
                err = _type_error(v, props[k], f"{path}.{k}")
                if err:
                    return err
    return None


def _coerce_floats(value: Any, schema: Mapping) -> Any:
    t = schema.get("type")
    if t == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if t in ("array", "tuple") and isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_coerce_floats(v, schema["items"]) for v in value]
    if t == "dict" and isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        return {k: _coerce_floats(v, schema["properties"][k]) if k in schema["properties"] else v
                for k, v in value.items()}
    return value


def validate_call(doc: Mapping, arguments: Mapping) -> tuple[dict | None, str | None]:
    """Check `arguments` against a BFCL function doc; returns (arguments to call with, error)."""
    params = doc.get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    name = doc["name"]
    for k in arguments:
        if k not in props:
            return None, f"{name}() got an unexpected argument '{k}' (arguments: {sorted(props)})"
    for k in params.get("required", []) or []:
        if k not in arguments:
            return None, f"{name}() is missing the required argument '{k}'"
    for k, v in arguments.items():
        err = _type_error(v, props[k], f"argument '{k}' of {name}()")
        if err:
            return None, err
        if k == "precision" and isinstance(v, int) and v > _MAX_PRECISION:
            return None, f"argument 'precision' of {name}() must be at most {_MAX_PRECISION}"
    return {k: _coerce_floats(v, props[k]) for k, v in arguments.items()}, None


def _stringify(result: Any) -> str:
    """BFCL's stringification of an execution result (multi_turn_utils.execute_multi_turn_func_call)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def execute_call(instance: Any, name: str, arguments: Mapping) -> str:
    """Call instance.name(**arguments) and return BFCL's result string; never raises (but for
    BaseExceptions that are not Exceptions)."""
    try:
        import mpmath
        dps = mpmath.mp.dps
    except ImportError:  # MathAPI needs mpmath; without it the class does not import anyway
        mpmath, dps = None, None
    try:
        with decimal.localcontext():
            result = getattr(instance, name)(**arguments)
        return _stringify(result)
    except Exception as e:  # the tool raised: BFCL reports it as the result
        return f"Error during execution: {e}"
    finally:
        if mpmath is not None:
            mpmath.mp.dps = dps


def is_error_result(result: str) -> bool:
    if result.startswith("Error during execution"):
        return True
    if result.startswith("{"):
        try:
            obj = json.loads(result)
        except (ValueError, RecursionError):
            return False
        return isinstance(obj, dict) and "error" in obj
    return False


def parse_call_string(call: str, class_names: Sequence[str]) -> tuple[str, dict]:
    """Parse a ground-truth call string like "mv(source='a', destination='b')" into (name, kwargs),
    mapping positional arguments to parameter names with the tool method's signature."""
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a simple function call: {call!r}")
    name = node.func.id
    owner = next((c for c in class_names if hasattr(tool_class(c), name)), None)
    if owner is None:
        raise ValueError(f"no involved class has a function {name!r}")
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        params = [p for p in inspect.signature(getattr(tool_class(owner), name)).parameters if p != "self"]
        for p, a in zip(params, node.args):
            kwargs[p] = ast.literal_eval(a)
    return name, kwargs


def format_tool_call(name: str, arguments: Mapping) -> str:
    """Qwen3 tool-call text for one call."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False) + "\n</tool_call>"
