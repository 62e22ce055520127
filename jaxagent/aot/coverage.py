"""Whether the AOT list knows every program a run executes: one description of a jitted call, made alike from a
recorded call (tests/jit_recorder.py) and from a `Program`'s function and abstract arguments.

A call's signature (`call_signature`): the function the jit wraps (module:qualname and a fingerprint of what its
closure holds: the settings a factory baked in), each bound argument either as arrays (every pytree leaf an array
or `jax.ShapeDtypeStruct`: the tree, each leaf's path, shape, dtype and sharding) or as a static value's
fingerprint (`fingerprint`: configs, envs, samplers, meshes, by value, never by id). Shardings are compared as
their device count and partition spec over the mesh axes of size > 1 (any one-device placement is the same);
an argument with no placement (a host numpy array) matches any. The options given to `jax.jit` itself
(shardings, donation) are not part of it: they are written beside the function they wrap.

`HELPERS`: the small programs a run calls that hold no model weights, each with why it needs no preflight;
`uncovered(calls, programs)` the recorded signatures that neither a program nor a helper covers.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import types
from typing import Any, Callable, Iterable, Optional

import jax
import numpy as np

_MAX_DEPTH = 6
_MAX_ITEMS = 64      # larger containers are fingerprinted by type and length (a tokenizer's vocabulary)
_MAX_HASHED = 1 << 20  # array elements hashed by value; larger arrays by shape and dtype

# module:qualname (optionally [argument=value]) -> why the program needs no preflight: it reads no model weights and
# its inputs and outputs are a few small arrays per task, state or reply (kilobytes at the accelerator presets' sizes)
HELPERS: dict[str, str] = {
    "jaxagent.envs.jax.frozenlake:sample_tasks": "draws maps: int8 [n, L, L]",
    "jaxagent.envs.jax.frozenlake_solver:shortest_path_length": "a map's shortest path (Pass@ bounds): int per map",
    "jaxagent.rollout.jax_loop:rollout_jit[cfg=None]": "the scripted expert's episodes (toy SFT data): no model runs",
    "jaxagent.study.plan_mode:_prompts_jit": "renders plan prompts: int32 [P, W]",
    "jaxagent.study.plan_mode:_outcomes_jit": "parses and walks plan replies: a few ints per reply",
    "jaxagent.study.plan_mode:_sft_rows_jit": "renders the toy base's plan SFT rows",
    "jaxagent.eval.pass_drivers:_pass_stats": "Pass@k grid and bootstrap over success flags: [U, P, Z] bools in",
    "jaxagent.eval.pass_drivers:slippery_p_star": "dynamic programming over map cells: [P, horizon] out",
    "jaxagent.eval.passk:_resample_counts": "bootstrap resample counts: [R, P] out",
    "jaxagent.eval.passk:_ci_from_counts": "bootstrap intervals from counts: [R, P] in",
    "jaxagent.eval.passk:_pass_at_k_one": "the Pass@k estimator over counts",
    "jaxagent.eval.scoring:_q_outcomes_jit": "exact Q-values of FrozenLake states from the solver: [I, A] out",
    "jaxagent.eval.state_drivers:_quality_summaries_jit": "step-quality summaries of scored states: [I] in",
    "jaxagent.eval.state_drivers:_error_actions_jit": "error actions of states from the solver: [I] out",
    "jaxagent.eval.state_drivers:_inject_jit": "writes an action into state contexts: int32 [I, S] in and out",
}


def helper_reason(call: dict, helpers=None) -> Optional[str]:
    """Why a recorded call needs no preflight (its `HELPERS` entry), or None: keyed by module:qualname, or by
    module:qualname[argument=value] when only calls with that argument's value are helpers."""
    helpers = HELPERS if helpers is None else helpers
    name = base_name(call["fn"])
    for key in helpers:
        base, _, cond = key.partition("[")
        if base != name:
            continue
        if not cond:
            return helpers[key] if isinstance(helpers, dict) else key
        arg, _, value = cond.rstrip("]").partition("=")
        if call["args"].get(arg) == describe_arg(ast.literal_eval(value)):
            return helpers[key] if isinstance(helpers, dict) else key
    return None


@dataclasses.dataclass
class Call:
    """A jitted function on abstract arguments (`jax.ShapeDtypeStruct`s; static values as they are) as a run calls
    it: `lower()` lowers it, under `jax.set_mesh(mesh)` when given; `signature()` is what a recorded call of the
    same program matches (`matches`)."""
    fn: Callable
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    mesh: Optional[Any] = None

    def lower(self):
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            return self.fn.lower(*self.args, **self.kwargs)

    def signature(self) -> dict:
        return call_signature(unjit(self.fn), self.args, self.kwargs)


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _array_fp(x) -> str:
    shape, dtype = tuple(np.shape(x)), str(x.dtype)
    if isinstance(x, jax.ShapeDtypeStruct) or int(np.prod(shape)) > _MAX_HASHED:
        return f"array{shape}{dtype}"
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return f"array{shape}{dtype}#{hashlib.sha1(np.ascontiguousarray(np.asarray(x)).tobytes()).hexdigest()[:12]}"


def fingerprint(v: Any, depth: int = 0, _seen: Optional[frozenset] = None) -> str:
    """A value's description that is equal across processes exactly when the values are equal as jit static
    arguments would be for the programs built here: scalars and strings by repr, containers and dataclasses
    by their items, arrays by shape, dtype and (up to 2^20 elements) content, functions by
    module:qualname and closure, meshes by their axes, other objects by type and attributes."""
    _seen = _seen or frozenset()
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return repr(v)
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, np.dtype) or isinstance(v, type):
        return getattr(v, "__module__", "") + "." + getattr(v, "__qualname__", str(v)) if isinstance(v, type) \
            else str(v)
    if _is_array(v):
        return _array_fp(v)
    if depth >= _MAX_DEPTH or id(v) in _seen:
        return f"<{type(v).__qualname__}>"
    seen, d = _seen | {id(v)}, depth + 1
    if isinstance(v, jax.sharding.Mesh):
        return f"Mesh({dict(v.shape)})"
    if isinstance(v, jax.sharding.Sharding):
        return f"Sharding({describe_sharding(v, None)})"
    if isinstance(v, (tuple, list, set, frozenset, dict)):
        items = sorted(v.items(), key=lambda kv: str(kv[0])) if isinstance(v, dict) else (
            sorted(v, key=str) if isinstance(v, (set, frozenset)) else list(v))
        if len(items) > _MAX_ITEMS:
            return f"{type(v).__name__}[{len(items)}]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {fingerprint(x, d, seen)}" for k, x in items) + "}"
        return type(v).__name__ + "(" + ", ".join(fingerprint(x, d, seen) for x in items) + ")"
    if isinstance(v, types.MethodType):
        return f"method({function_id(v.__func__, d, seen)}, {fingerprint(v.__self__, d, seen)})"
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, functools.partial)) or hasattr(v, "__wrapped__"):
        return function_id(v, d, seen)
    if dataclasses.is_dataclass(v):
        return type(v).__qualname__ + "(" + ", ".join(
            f"{f.name}={fingerprint(getattr(v, f.name), d, seen)}" for f in dataclasses.fields(v)) + ")"
    attrs = getattr(v, "__dict__", None)
    if isinstance(attrs, dict):
        return f"{type(v).__module__}.{type(v).__qualname__}{fingerprint(attrs, d, seen)}"
    return f"{type(v).__module__}.{type(v).__qualname__}"


def function_id(f, depth: int = 0, _seen: Optional[frozenset] = None) -> str:
    """module:qualname of a function with the fingerprints of its closure's values (a factory's settings) and
    of a partial's bound arguments; the jit layer of a jitted function is looked through (`unjit`)."""
    _seen = _seen or frozenset()
    if isinstance(f, functools.partial):
        return (f"partial({function_id(f.func, depth + 1, _seen)}, {fingerprint(f.args, depth + 1, _seen)}, "
                f"{fingerprint(f.keywords, depth + 1, _seen)})")
    name = f"{getattr(f, '__module__', '?')}:{getattr(f, '__qualname__', type(f).__qualname__)}"
    cells = getattr(f, "__closure__", None) or ()
    if not cells or depth >= _MAX_DEPTH:
        return name
    names = f.__code__.co_freevars
    held = {n: c.cell_contents for n, c in zip(names, cells) if _filled(c)}
    return f"{name}{fingerprint(held, depth + 1, _seen | {id(f)})}"


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name assigned after the closure was made)
        return False
    return True


def base_name(fn_id: str) -> str:
    """The module:qualname part of a `function_id` (what `HELPERS` is keyed by)."""
    return fn_id.split("{", 1)[0]


def unjit(fn):
    """The function a jitted callable (a `jax.jit` or `xla_options.jit` object) wraps."""
    return getattr(fn, "__wrapped__", fn) if hasattr(fn, "lower") else fn


def describe_sharding(s, ndim: Optional[int]) -> Optional[str]:
    """'1' for any one-device placement; else '<devices>:<spec>' with the spec over the mesh axes of size > 1
    (trailing unsplit dimensions dropped); None without a placement."""
    if s is None:
        return None
    n = len(s.device_set)
    if n == 1:
        return "1"
    spec = getattr(s, "spec", None)
    mesh = getattr(s, "mesh", None)
    if spec is None or mesh is None:
        return f"{n}:{type(s).__name__}"
    sizes = dict(mesh.shape)

    def keep(entry):
        axes = entry if isinstance(entry, tuple) else (entry,)
        axes = tuple(a for a in axes if a is not None and sizes.get(a, 1) > 1)
        return axes or None
    parts = [keep(e) for e in spec] + [None] * max(0, (ndim or 0) - len(spec))
    while parts and parts[-1] is None:
        parts.pop()
    return f"{n}:{parts}"


def _bind(fun, args, kwargs) -> dict:
    """name -> (value, passed): the call's arguments bound to `fun`'s parameters, defaults filled in (passed False:
    a default jit never sees as an argument, a constant of the program)."""
    try:
        sig = inspect.signature(fun)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {**{str(i): (a, True) for i, a in enumerate(args)}, **{k: (v, True) for k, v in kwargs.items()}}
    given = set(bound.arguments)
    bound.apply_defaults()
    out = {}
    for name, v in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind == inspect.Parameter.VAR_POSITIONAL:
            out.update({f"{name}[{i}]": (x, True) for i, x in enumerate(v)})
        elif kind == inspect.Parameter.VAR_KEYWORD:
            out.update({k: (x, True) for k, x in v.items()})
        else:
            out[name] = (v, name in given)
    return out


def static_names(fun, static_argnames=(), static_argnums=()) -> frozenset:
    """The parameter names of `fun` a jit with these options treats as static (numbers resolved by position)."""
    names = {static_argnames} if isinstance(static_argnames, str) else set(static_argnames or ())
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums or ())
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        params = []
    names.update(params[i] for i in nums if -len(params) <= i < len(params))
    return frozenset(names)


def _leaf(x, dynamic: bool) -> list:
    if _is_array(x):
        return [list(np.shape(x)), str(x.dtype), describe_sharding(getattr(x, "sharding", None), np.ndim(x))]
    if dynamic and isinstance(x, (bool, int, float)):  # a Python scalar traced: its (weak) dtype
        return [[], str(jax.numpy.asarray(x).dtype), None]
    return ["value", fingerprint(x)]


def call_signature(fun, args: tuple, kwargs: dict, static: Optional[frozenset] = None,
                   fn_id: Optional[str] = None) -> dict:
    """{"fn", "args"} of a call of the jit of `fun` (the function it wraps) on `args` / `kwargs`: per bound
    argument its tree and leaves, each an array's [shape, dtype, sharding] or a value's ["value", fingerprint].
    Python scalars count as values except in the parameters known to be traced (not in `static`, the jit's
    static names where its options are known; None: unknown); a program passes a traced scalar as a
    `jax.ShapeDtypeStruct`.
    `fn_id`: `function_id(fun)` when already known."""
    return {"fn": fn_id or function_id(fun), "args": {
        name: describe_arg(v, passed and static is not None and name not in static)
        for name, (v, passed) in _bind(fun, args, kwargs).items()}}


def describe_arg(v, traced: bool = False) -> dict:
    """One argument's {"tree", "leaves"} (`call_signature`); `traced`: Python scalars in it are traced values."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(v)
    return {"tree": _sha(str(treedef)), "leaves": [[jax.tree_util.keystr(p), *_leaf(x, traced)] for p, x in leaves]}


def matches(program: dict, call: dict) -> bool:
    """Whether a recorded call's signature is a program's: the same function, argument trees, values, shapes
    and dtypes, and shardings (where both have one)."""
    if program["fn"] != call["fn"] or program["args"].keys() != call["args"].keys():
        return False
    for name, want in program["args"].items():
        got = call["args"][name]
        if want["tree"] != got["tree"] or len(want["leaves"]) != len(got["leaves"]):
            return False
        for w, g in zip(want["leaves"], got["leaves"]):
            if len(w) != len(g) or w[:3] != g[:3]:
                return False
            if len(w) == 4 and w[3] is not None and g[3] is not None and w[3] != g[3]:
                return False
    return True


def uncovered(calls: Iterable[dict], programs: Iterable[dict], helpers=None) -> list[dict]:
    """The recorded call signatures that no program signature matches and that are no helper (`helper_reason`;
    `helpers`: keys as `HELPERS`', default those)."""
    programs = list(programs)
    return [c for c in calls if helper_reason(c, helpers) is None and not any(matches(p, c) for p in programs)]
