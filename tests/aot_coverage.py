"""The end-to-end miniatures run under the jit recorder, and the check of their calls against the AOT list.

`record_reproduce` runs `experiments.reproduce` in a subprocess under tests/jit_recorder.py (jax.jit replaced before
jaxagent is imported), so tests/test_study_e2e.py (ci) and tests/test_host_study.py (ci-sql) check the run's files
as before and, from the same run, that every program it called is in the AOT list (`assert_covered`).
"""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest

from jaxagent import sharding
from jaxagent.aot import coverage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = "jit_calls.jsonl"  # the recorder's output, in the run's root


def run_recorded(module: str, argv: list, out: str, log: str, timeout_s: float = 1800, env: dict = None):
    """`python -m module argv` under the recorder, its calls written to `out`, its output to `log`; fails the test
    with the log's tail unless it exits 0."""
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "jit_recorder.py"), out, "-m", module,
                               *argv], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    if proc.returncode:
        with open(log) as f:
            pytest.fail(f"{module} {' '.join(argv)} exited {proc.returncode}:\n{f.read()[-4000:]}")


def record_reproduce(preset: str, root: str) -> str:
    """`experiments.reproduce --preset <preset> --root <root>` under the recorder; the run's directory."""
    run_recorded("experiments.reproduce", ["--preset", preset, "--root", root], os.path.join(root, CALLS),
                 os.path.join(root, "reproduce.log"))
    return os.path.join(root, preset)


def read_calls(path: str) -> list[dict]:
    """The distinct call signatures a recorder wrote to `path` (each with "calls" and "made_in")."""
    with open(path) as f:
        return [{**r["sig"], "calls": r["calls"], "made_in": r["made_in"]} for r in map(json.loads, f)]


def recorded(run_path: str) -> list[dict]:
    """The calls recorded while `record_reproduce` made the run directory `run_path`."""
    return read_calls(os.path.join(os.path.dirname(run_path), CALLS))


def one_device_mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def arm_settings(make, preset) -> list:
    """The preset's arms as its run makes them: `make(preset, arm)` is `common.arms.arm_settings` (FrozenLake) or
    `host.run.host_arm_settings`."""
    return [make(preset, a) for a in preset.arms]


def describe(call: dict) -> str:
    """A recorded call in one line: its function and the shapes of its array arguments."""
    shapes = {name: [leaf[1] for leaf in a["leaves"] if leaf[1] != "value"][:3] for name, a in call["args"].items()}
    return f"{coverage.base_name(call['fn'])} (made in {call.get('made_in')}, {call.get('calls')} calls): {shapes}"


def assert_covered(calls: list, progs: list) -> dict:
    """Every recorded call is one of the programs' calls (`Program.calls`) or a `coverage.HELPERS` function;
    returns {program name: recorded calls it covers}."""
    sigs = [(pr.name, c.signature()) for pr in progs for c in pr.calls]
    missing = coverage.uncovered(calls, [s for _, s in sigs])
    assert not missing, "programs the run calls that the AOT list does not know:\n" + "\n".join(map(describe, missing))
    counts: dict = {}
    for name, sig in sigs:
        counts[name] = counts.get(name, 0) + sum(c["calls"] for c in calls if coverage.matches(sig, c))
    return counts


def with_vocab(cfg, vocab_size: int):
    return dataclasses.replace(cfg, vocab_size=vocab_size)
