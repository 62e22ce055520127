"""Input checks for the public entry points, and string options that work under `jax.jit`.

Array checks (`array`, `arrays`, `dtype`, `key`, `same_shape`) read only shapes and dtypes, which a tracer has
while a function is traced: they run once per compilation and cost nothing in the compiled program. A wrong dtype
kind raises TypeError, a wrong rank or a size that disagrees with another argument raises ValueError; the message
names the function, the argument, what it should be and what came, e.g.

    qwen3.forward: tokens_BxT must be an integer array [B, T]; got float32[2, 5]

Dimension letters (CONVENTIONS.md) bind across the arguments of one call (`arrays`: the B of `logp_BxT` equals the
B of `mask_BxT`). A string option (`losses.AggMode`, ...) is a `StrEnum` registered with
`jax.tree_util.register_static` (`static_option`, `option`): a member passed to a jitted function is part of the
program's static structure, so it needs no `static_argnames`, and equals its plain string everywhere else.

No dimension legend of its own: the letters are the callers'.
"""
from __future__ import annotations

import enum
from typing import Any, Iterable, Optional, Sequence

import jax
import numpy as np

# dtype kinds an argument may be asked for, and how the messages name them
KINDS = {
    "integer": "an integer",
    "float": "a floating-point",
    "bool": "a bool",
    "bool_or_integer": "a bool or integer",
    "number": "a numeric (bool, integer or float)",
}


def _dtype(x) -> np.dtype:
    if hasattr(x, "dtype"):
        return np.dtype(x.dtype) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x.dtype
    return np.asarray(x).dtype


def describe(x) -> str:
    """What came, as "float32[2, 5]" (dtype and shape), or the Python type of a non-array."""
    if x is None:
        return "None"
    if isinstance(x, (str, bytes, dict)) or not (hasattr(x, "shape") or isinstance(x, (list, tuple, int, float, bool))):
        return type(x).__name__
    try:
        shape = tuple(np.shape(x))
        return f"{_dtype(x)}[{', '.join(map(str, shape))}]"
    except (TypeError, ValueError):
        return type(x).__name__


def _kind_ok(dtype, kind: str) -> bool:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return False
    is_bool = dtype == np.bool_
    is_int = np.issubdtype(dtype, np.integer)
    is_float = np.issubdtype(dtype, np.floating) or dtype == jax.numpy.bfloat16
    return {"integer": is_int, "float": is_float, "bool": is_bool, "bool_or_integer": is_bool or is_int,
            "number": is_bool or is_int or is_float}[kind]


def is_kind(x, kind: str) -> bool:
    """Whether the dtype of `x` (an array, a tracer or a Python number) is of `kind` (a `KINDS` key)."""
    try:
        return _kind_ok(_dtype(x), kind)
    except (TypeError, ValueError):
        return False


def float_dtype(what: str, dtype, error: type = TypeError) -> np.dtype:
    """`dtype` (a dtype or its name) as a floating numpy dtype; `error` (default TypeError) naming `what` for a
    name that is no dtype ('bf16') or a dtype that is not floating (int8)."""
    try:
        dt = jax.numpy.dtype(dtype)
    except TypeError:
        raise error(f"{what} {dtype!r} is not a dtype; use jnp.bfloat16, jnp.float32 or their names ('bfloat16', "
                    "'float32')") from None
    if not jax.numpy.issubdtype(dt, jax.numpy.floating):
        raise error(f"{what} must be a floating dtype (bfloat16, float32), got {dt}")
    return dt


def array(where: str, name: str, x, dims: Sequence[str], kind: str) -> tuple[int, ...]:
    """Check one argument: dtype `kind` (a `KINDS` key) and rank len(dims); returns its shape.

    Non-arrays (lists, scalars) are read through numpy; a str, dict or None is a TypeError."""
    if kind not in KINDS:
        raise ValueError(f"unknown dtype kind {kind!r}; one of {sorted(KINDS)}")
    if dims and set(dims) == {"."}:  # any shape (`dtype`)
        want = f"{KINDS[kind]} array"
    else:
        want = f"{KINDS[kind]} array [{', '.join(dims)}]" if dims else f"{KINDS[kind]} scalar"
    if x is None or isinstance(x, (str, bytes, dict)):
        raise TypeError(f"{where}: {name} must be {want}; got {describe(x)}")
    try:
        dtype, shape = _dtype(x), tuple(np.shape(x))
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be {want}; got {describe(x)}") from None
    if not _kind_ok(dtype, kind):
        raise TypeError(f"{where}: {name} must be {want}; got {describe(x)}")
    if len(shape) != len(dims):
        raise ValueError(f"{where}: {name} must be {want} (rank {len(dims)}); got {describe(x)}")
    return shape


def dtype(where: str, name: str, x, kind: str) -> None:
    """Check only the dtype kind of an argument of any shape (broadcasting functions)."""
    any_rank = () if x is None or isinstance(x, (str, bytes, dict)) else (".",) * np.ndim(x)
    array(where, name, x, any_rank, kind)


def arrays(where: str, specs: Iterable[tuple[str, Any, Sequence[str], str]],
           sizes: Optional[dict[str, int]] = None) -> dict[str, int]:
    """Check several arguments (name, value, dims, kind) and bind their dimension letters.

    A value of None is skipped (an optional argument not given). A letter's first size wins (`sizes`
    may preset some, e.g. {'V': cfg.vocab_size}); a later argument with another size for it is a
    ValueError naming both. Returns {letter: size}."""
    bound: dict[str, tuple[int, str]] = {k: (v, "the config") for k, v in (sizes or {}).items()}
    for name, x, dims, kind in specs:
        if x is None:
            continue
        shape = array(where, name, x, dims, kind)
        for letter, n in zip(dims, shape):
            if letter in bound and bound[letter][0] != n:
                size, source = bound[letter]
                raise ValueError(f"{where}: {name} has {letter} = {n} (shape {list(shape)}) but {source} "
                                 f"has {letter} = {size}; they must agree")
            bound.setdefault(letter, (int(n), name))
    return {k: v for k, (v, _) in bound.items()}


def key(where: str, name: str, x) -> None:
    """A PRNG key: a typed key array (`jax.random.key`) or a raw uint32[2] (`jax.random.PRNGKey`)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return
    if dtype is not None and np.dtype(dtype) == np.uint32 and tuple(np.shape(x))[-1:] == (2,):
        return
    raise TypeError(f"{where}: {name} must be a PRNG key (jax.random.key(seed)); got {describe(x)}")


# ----------------------------------------------------------------------------- options
def static_option(cls):
    """Class decorator for a StrEnum of options: registered as a static pytree node (module docstring)."""
    jax.tree_util.register_static(cls)
    return cls


def option(cls: type[enum.StrEnum], value, where: str, name: str):
    """`value` (a member or its string) as a member of the option enum `cls`; ValueError listing the
    choices otherwise."""
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{where}: {name} must be one of {choices} (or {cls.__name__}.<NAME>); "
                         f"got {value!r}") from None


def same_shape(where: str, **named) -> tuple[int, ...]:
    """Arrays of any one shape (elementwise functions): ValueError naming the first that differs."""
    items = [(n, x) for n, x in named.items() if x is not None]
    first_name, first = items[0]
    shape = tuple(np.shape(first))
    for name, x in items[1:]:
        if tuple(np.shape(x)) != shape:
            raise ValueError(f"{where}: {name} has shape {list(np.shape(x))} but {first_name} has {list(shape)}; "
                             "they must be equal")
    return shape
