"""XLA compiler options that jaxagent's jitted programs are compiled with, and `jit`, which applies them.

`COMPILER_OPTIONS` go with every jaxagent entry point that runs the model (generation, rollouts, train
steps, evaluation drivers), so no process-wide flag or environment variable is needed; research code
that jits its own functions can pass the same dict.

Composition: jax accepts `compiler_options` only on a top-level `jax.jit`; a jit carrying them raises
inside a user's `jax.jit`, `jax.eval_shape`, `jax.make_jaxpr` or `vmap`. So the entry points are made
with `jit` below: called at top level they compile with the options; called under any transformation
they are plain nested jits, and the outermost boundary (the user's) decides the options.

Two kinds of program, two option sets:
- decoding-shaped programs (generation, rollouts, cache scoring): `COMPILER_OPTIONS`;
- programs over whole sequences (train steps, SFT steps, log-probs and values of full rows, likelihood
  scoring) on one device, `jit(..., sequence=True)`: `SEQUENCE_COMPILER_OPTIONS`, XLA's defaults.

Why each option:
- ``xla_cpu_experimental_ynn_fusion_type = ""`` (decoding only): XLA:CPU routes dots through YNNPACK by
  default, which runs decoding's small-batch products with weights that do not fit in cache far below
  XLA's Eigen path; an empty list disables that fusion pass. Over whole sequences the products are tall
  and YNNPACK is the faster path on one device: the bfcl-toy RL train step (32 x 896 tokens, width 64)
  2.45 -> 1.95 s, `bench_train` (10M, 8 x 256) 0.84 -> 0.80 s, on a 2-core Intel Xeon. Partitioned over
  several CPU devices it is the slower one, and its first call peaks at twice the memory (the ci-sql
  miniature's step, 8 x 448 tokens over a (2, 2, 2) mesh of host devices: 4.3 -> 6.7 s, peak RSS
  5.7 -> 11.0 GB, `python -m experiments.bench_mesh_options`), so a sequence program on a mesh of more
  than one device keeps `COMPILER_OPTIONS` (`sequence_program`). The field belongs to XLA's
  backend-independent DebugOptions, so GPU and TPU compiles accept and ignore it.
Reproduce: `python -m experiments.bench_model --json` (reports both settings' matmul peaks) and
`python -m experiments.bench_train --json --no-torch` (docs/performance.md).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

COMPILER_OPTIONS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": ""}
SEQUENCE_COMPILER_OPTIONS: dict[str, str] = {}


def sequence_program(mesh) -> bool:
    """Whether a program over whole sequences built for `mesh` (None: one device) takes
    `SEQUENCE_COMPILER_OPTIONS`: on one device it does; partitioned over several devices it keeps
    `COMPILER_OPTIONS` (module docstring: there YNNPACK ran the step slower, at twice the peak memory). The
    builders that know their mesh pass `jit(..., sequence=sequence_program(mesh))`; a sequence program built
    without one makes the same choice per call, from its arguments' devices."""
    return mesh is None or mesh.size == 1


def compiler_options(extra: dict | None = None, *, sequence: bool = False) -> dict:
    """A fresh copy of `COMPILER_OPTIONS` (`SEQUENCE_COMPILER_OPTIONS` with `sequence`), updated with `extra`
    (which wins on conflicts)."""
    return {**(SEQUENCE_COMPILER_OPTIONS if sequence else COMPILER_OPTIONS), **(extra or {})}


_merged = compiler_options  # `jit` below takes a keyword of the same name
_PROBE = np.int8(0)  # a host constant: jnp.asarray of it is a tracer exactly while a jit-like trace runs


def top_level(args) -> bool:
    """Whether the call runs outside every jax transformation that would nest our jit (jit, eval_shape,
    make_jaxpr tracing, vmap or grad of a traced argument), from public APIs only (`jax.core.Tracer`):
      - a traced argument means a transformation (vmap, grad, jit of the caller's own arguments);
      - without one, a caller's jit / eval_shape / make_jaxpr may still be tracing (the entry point called
        on constants or closed-over values): under such a trace every new array is a tracer, so a fresh
        scalar tells. vmap and grad over constants leave it concrete, and there a top-level jit with
        options runs as it is (jax binds it in the enclosing eager context)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        return False
    return not isinstance(jnp.asarray(_PROBE), jax.core.Tracer)


def partitioned(args) -> bool:
    """Whether any array among `args` is placed over more than one device (a sharded or replicated
    `jax.Array`): the program it enters runs partitioned."""
    return any(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 for x in jax.tree.leaves(args))


class _Jitted:
    """A jitted function that compiles with compiler options at top level and nests without them. A sequence
    program (`partitioned_options`) compiles with those instead when an argument spans several devices
    (`sequence_program`)."""

    def __init__(self, fun: Callable, options: dict, jit_kwargs: dict, partitioned_options: Optional[dict] = None):
        self._top = jax.jit(fun, compiler_options=options, **jit_kwargs)
        self._partitioned = (None if partitioned_options is None or partitioned_options == options
                             else jax.jit(fun, compiler_options=partitioned_options, **jit_kwargs))
        self._nested = jax.jit(fun, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        if not top_level((args, kwargs)):
            return self._nested(*args, **kwargs)
        if self._partitioned is not None and partitioned((args, kwargs)):
            return self._partitioned(*args, **kwargs)
        return self._top(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # lower, trace, eval_shape, _cache_size, ...: the top-level jit's
        if name in ("_top", "_partitioned", "_nested"):
            raise AttributeError(name)
        return getattr(self._top, name)

    def __get__(self, obj, objtype=None):  # usable as a method decorator too
        return self if obj is None else functools.partial(self, obj)


def jit(fun: Optional[Callable] = None, *, compiler_options: Optional[dict] = None, sequence: bool = False,
        **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` with `COMPILER_OPTIONS` (`sequence`: `SEQUENCE_COMPILER_OPTIONS`, a program
    over whole sequences, unless an argument spans several devices; module docstring), updated with
    `compiler_options`, at top level, and a plain nested jit when called under a transformation (see the module
    docstring). `.lower` and other attributes are the one-device top-level jit's.
    Usable as `jit(f, ...)` or as a decorator `@functools.partial(jit, static_argnames=...)`."""
    options = _merged(compiler_options, sequence=sequence)
    multi = _merged(compiler_options) if sequence else None
    if fun is None:
        return lambda f: _Jitted(f, options, jit_kwargs, multi)
    return _Jitted(fun, options, jit_kwargs, multi)
