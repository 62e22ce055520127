"""Value checks shared by the eval metrics: clear ValueErrors on concrete inputs, silence under tracing (the
shape and dtype checks of the public entry points are `jaxagent.checks`)."""
from __future__ import annotations

import jax
import numpy as np


def concrete(x) -> np.ndarray | None:
    """`x` as a numpy array when its value is known on the host, None when it is a tracer."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def require_ndim(x, ndim: int, name: str) -> None:
    """Raise ValueError unless `x` has exactly `ndim` dimensions."""
    if np.ndim(x) != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {np.shape(x)}")


def require_same_shape(a, b, name_a: str, name_b: str) -> None:
    """Raise ValueError unless `a` and `b` have equal shapes."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"{name_a} {np.shape(a)} and {name_b} {np.shape(b)} must have the same shape")


def require_integer(x, name: str) -> None:
    """Raise ValueError unless `x` has an integer (or bool) dtype."""
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if not (np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise ValueError(f"{name} must be an integer array, got dtype {dtype}")


def require_unit_interval(alpha, name: str) -> None:
    """Raise ValueError unless a concrete `alpha` lies strictly inside (0, 1)."""
    value = concrete(alpha)
    if value is not None and not np.all((value > 0) & (value < 1)):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value}")
