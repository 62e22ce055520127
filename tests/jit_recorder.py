"""Runs a module as __main__ with every top-level call of a jitted function recorded (tests/test_aot_coverage.py).

    python tests/jit_recorder.py OUT.jsonl -m experiments.reproduce --preset ci --root DIR

`jax.jit` is replaced before anything else is imported, so every jit made afterwards is a recording wrapper:
module-level `jax.jit(f)`, `functools.partial(jax.jit, ...)` decorators, jits made in factories, and the jit behind
each `xla_options.jit` (whose top-level calls run that jit's compiled executable: `xla_options.Program.__call__` is
wrapped to record them). A call is recorded when it runs a program of its own: no argument is a tracer and no trace
is running (a jit called while another is traced is part of that program). Each distinct
`jaxagent.aot.coverage.call_signature` is written once, as a JSON line with its call count and the module that
made the jit, also when the module fails.
"""
import functools
import json
import os
import runpy
import sys

import jax
import jax.numpy as jnp
import numpy as np

_PROBE = np.int8(0)


class _Recorded:
    """A jitted function that records its top-level calls into `calls` and otherwise is the jit it wraps."""

    def __init__(self, jitted, fun, made_in: str, calls: dict, static_argnames=(), static_argnums=()):
        self._jitted, self._fun, self._made_in, self._calls, self._fn_id = jitted, fun, made_in, calls, None
        self._static_args = (static_argnames, static_argnums)
        self._static = None
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        self.record(args, kwargs)
        return self._jitted(*args, **kwargs)

    def record(self, args, kwargs):
        if _top_level((args, kwargs)):
            from jaxagent.aot import coverage
            if self._fn_id is None:
                self._fn_id = coverage.function_id(self._fun)
                self._static = coverage.static_names(self._fun, *self._static_args)
            sig = json.dumps(coverage.call_signature(self._fun, args, kwargs, self._static, self._fn_id),
                             sort_keys=True)
            entry = self._calls.setdefault(sig, {"calls": 0, "made_in": self._made_in})
            entry["calls"] += 1

    def __getattr__(self, name):  # lower, trace, eval_shape, _cache_size, ...
        if name.startswith("_") and name in ("_jitted", "_fun", "_made_in", "_calls", "_fn_id", "_static",
                                             "_static_args"):
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)


def _top_level(tree) -> bool:
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)):
        return False
    return not isinstance(jnp.asarray(_PROBE), jax.core.Tracer)


def install(calls: dict):
    """Replaces `jax.jit` by a maker of recording wrappers (for jits made from now on)."""
    real = jax.jit

    def jit(fun=None, /, **kwargs):
        made_in = sys._getframe(1).f_globals.get("__name__", "?")
        static = (kwargs.get("static_argnames", ()), kwargs.get("static_argnums", ()))

        def wrap(f):
            return _Recorded(real(f, **kwargs), f, made_in, calls, *static)
        return wrap if fun is None else wrap(fun)

    jax.jit = jit
    from jaxagent import xla_options  # makes no jit at import
    program_call = xla_options.Program.__call__

    def recorded_call(program, *args, **kwargs):
        program.jit.record(args, kwargs)
        return program_call(program, *args, **kwargs)

    xla_options.Program.__call__ = recorded_call


def write(calls: dict, path: str):
    with open(path + ".tmp", "w") as f:
        for sig, entry in calls.items():
            f.write(json.dumps({"sig": json.loads(sig), **entry}) + "\n")
    os.replace(path + ".tmp", path)


def main(argv):
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit("usage: python tests/jit_recorder.py OUT.jsonl -m MODULE [ARGS...]")
    out, module, rest = argv[0], argv[2], argv[3:]
    calls: dict = {}
    install(calls)
    sys.argv = [module] + rest
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        write(calls, out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1:])
