"""The AOT list's coverage check (`jaxagent.aot.coverage`, tests/jit_recorder.py): the recorder sees every kind of jit
a module makes (module-level `jax.jit(f)`, `functools.partial(jax.jit, ...)` decorators, jits made in factories,
`xla_options.jit`) and only their top-level calls, and a jitted program that no `Call` declares is reported, as a new
program of the pipeline would be by the end-to-end checks (tests/test_study_e2e.py, tests/test_host_study.py).
"""
import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent.aot import coverage
from jaxagent.aot.coverage import Call
from tests import aot_coverage

PROBE = '''
import functools

import jax

from jaxagent import xla_options


def double(x):
    return 2 * x


double_jit = jax.jit(double)


@functools.partial(jax.jit, static_argnames=("n",))
def power(x, *, n):
    return x ** n


def make_scale(k):
    return jax.jit(lambda x: k * x)


@functools.partial(xla_options.jit, static_argnames=("n",))
def outer(x, *, n):
    return power(double_jit(x), n=n)  # nested: part of outer's program


def main():
    x = jax.numpy.ones((3,), jax.numpy.float32)
    double_jit(x)
    double_jit(x + 1)
    power(x, n=2)
    make_scale(3.0)(x)
    outer(jax.numpy.ones((2, 2)), n=3)
    jax.jit(lambda x: x + 1)(x)  # a program nobody declared
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """(the probe module imported here, its calls recorded in a subprocess)."""
    d = tmp_path_factory.mktemp("probe")
    (d / "jit_probe.py").write_text(PROBE)
    (d / "jit_probe_main.py").write_text("import jit_probe\n\njit_probe.main()\n")
    out = str(d / "calls.jsonl")
    aot_coverage.run_recorded("jit_probe_main", [], out, str(d / "log"), timeout_s=300, env={"PYTHONPATH": str(d)})
    sys.path.insert(0, str(d))
    try:
        mod = importlib.import_module("jit_probe")
    finally:
        sys.path.remove(str(d))
    return mod, aot_coverage.read_calls(out)


def test_recorder_sees_every_kind_of_jit_and_only_top_level_calls(probe):
    _, calls = probe
    got = sorted((coverage.base_name(c["fn"]), c["calls"]) for c in calls)
    assert got == [("jit_probe:double", 2), ("jit_probe:main.<locals>.<lambda>", 1),
                   ("jit_probe:make_scale.<locals>.<lambda>", 1), ("jit_probe:outer", 1), ("jit_probe:power", 1)]
    power = next(c for c in calls if c["fn"] == "jit_probe:power")
    assert power["args"]["n"]["leaves"] == [["", "value", "2"]]
    assert power["args"]["x"]["leaves"] == [["", [3], "float32", "1"]]
    scale = next(c for c in calls if "make_scale" in c["fn"])
    assert scale["fn"].endswith("{'k': 3.0}")  # the factory's setting is part of the function


def test_an_undeclared_program_is_caught(probe):
    """The calls declared as the probe's programs cover all it runs but the one jit nobody declared; a declared call
    at another static value, shape or closure does not cover the recorded one."""
    mod, calls = probe
    x3, x22 = jax.ShapeDtypeStruct((3,), jnp.float32), jax.ShapeDtypeStruct((2, 2), jnp.float32)
    declared = [Call(mod.double_jit, (x3,)), Call(mod.power, (x3,), {"n": 2}), Call(mod.make_scale(3.0), (x3,)),
                Call(mod.outer, (x22,), {"n": 3})]
    missing = coverage.uncovered(calls, [c.signature() for c in declared])
    assert [coverage.base_name(c["fn"]) for c in missing] == ["jit_probe:main.<locals>.<lambda>"]
    wrong = [Call(mod.double_jit, (jax.ShapeDtypeStruct((4,), jnp.float32),)), Call(mod.power, (x3,), {"n": 4}),
             Call(mod.make_scale(5.0), (x3,)), Call(mod.outer, (x22,), {"n": 3})]
    assert len(coverage.uncovered(calls, [c.signature() for c in wrong])) == 4
    assert coverage.uncovered(calls, [], helpers=["jit_probe:double", "jit_probe:power", "jit_probe:outer",
                                                  "jit_probe:make_scale.<locals>.<lambda>"]) == missing


def test_signatures_compare_shardings_and_traced_scalars():
    """A NamedSharding's spec counts (over mesh axes of size > 1), any one-device placement is one; a Python scalar
    traced by the jit is its weak dtype, a static one its value."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    f = jax.jit(lambda x, s, *, n: x * s * n, static_argnames=("n",))
    x = jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P("data")))
    rec = coverage.call_signature(coverage.unjit(f), (x, 2.0), {"n": 3}, coverage.static_names(coverage.unjit(f),
                                                                                                    ("n",)))
    assert rec["args"]["s"]["leaves"] == [["", [], "float32", None]] and rec["args"]["n"]["leaves"] == [["", "value",
                                                                                                          "3"]]
    sds = lambda spec, m=mesh: jax.ShapeDtypeStruct((4, 2), jnp.float32, sharding=NamedSharding(m, spec))  # noqa: E731
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    assert coverage.matches(Call(f, (sds(P("data")), scalar), {"n": 3}).signature(), rec)
    assert not coverage.matches(Call(f, (sds(P(None, "data")), scalar), {"n": 3}).signature(), rec)
    assert not coverage.matches(Call(f, (sds(P("data")), scalar), {"n": 4}).signature(), rec)
    one = Mesh(np.array(jax.devices()[:1]), ("data",))
    assert coverage.describe_sharding(NamedSharding(one, P("data")), 2) == "1"
    assert coverage.describe_sharding(x.sharding, 2) == "2:[('data',)]"
