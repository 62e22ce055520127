"""The scripts' --help and usage errors answer without loading JAX or the study: every experiments script's --help
imports none of jax, flax, optax, scipy, orbax or the study's stages (checked with `python -X importtime` in a fresh
interpreter), and the light names module they read (`jaxagent.study.preset_names`) holds exactly the presets, arms
and grids of the modules that define them."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from jaxagent.study import preset_names, stages
from jaxagent.study.common import run_checks
from jaxagent.study.frozenlake import presets as fl_presets, run as fl_run, sweep as fl_sweep
from jaxagent.study.host import stages as host_stages
from jaxagent.study.host.presets import HOST_PRESETS

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("jax", "jaxlib", "flax", "optax", "scipy", "orbax", "tensorstore", "torch", "jaxagent.study.stages",
         "jaxagent.study.frozenlake.run", "jaxagent.study.host.run", "jaxagent.study.run_dir")
# every script with a command line (experiments/<name>.py with a main)
SCRIPTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if "\ndef main(" in p.read_text())


def imported_modules(argv):
    """(exit code, stdout, stderr without the import lines, the modules imported) of `python -X importtime argv`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    names, rest = set(), []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)", line)
        if m:
            names.add(m.group(2))
        elif not line.startswith("import time:"):
            rest.append(line)
    return proc.returncode, proc.stdout, "\n".join(rest), names


def test_every_script_is_checked():
    assert {"reproduce", "host_study", "aot_check", "bench_accel", "base", "rl", "eval", "sweep", "mistakes",
            "gpu_attention_check"} <= set(SCRIPTS), SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_imports_no_jax_and_no_study(script):
    rc, out, err, names = imported_modules(["-m", f"experiments.{script}", "--help"])
    assert rc == 0, err
    assert out.startswith("usage: "), out[:200]
    heavy = sorted(n for n in names if n in HEAVY or n.split(".")[0] in HEAVY[:8])
    assert not heavy, f"experiments.{script} --help imports {heavy}"
    assert "jaxagent.study.preset_names" in names or script.startswith(("bench_", "gpu_", "aot_report",
                                                                       "compare_seed_sets"))


@pytest.mark.parametrize("argv, message", [
    (["experiments.reproduce", "--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
    (["experiments.reproduce", "--preset", "ci-sql", "--seeds", "-1"], "argument --seeds: must be a non-negative"),
    (["experiments.host_study", "--preset", "ci-sql", "--arms", "ppo"], "argument --arms: invalid choice: 'ppo'"),
    (["experiments.sweep", "--grid", "nope"], "argument --grid: invalid choice: 'nope'"),
])
def test_usage_errors_are_one_line_without_jax(argv, message):
    rc, _, err, names = imported_modules(["-m", *argv])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert "jax" not in names and "jaxagent.study.stages" not in names


def test_the_light_names_are_the_presets_arms_and_grids():
    assert set(preset_names.FROZENLAKE) == set(fl_presets.PRESETS)
    assert fl_presets.PRESET_NOTES is preset_names.FROZENLAKE
    assert set(preset_names.HOST) == set(HOST_PRESETS) and len(preset_names.HOST) == len(HOST_PRESETS)
    assert set(preset_names.HOST_SFT) == {n for n, p in HOST_PRESETS.items() if p.sft is not None}
    assert preset_names.ARMS == tuple(stages.ARMS)
    assert preset_names.HOST_ARMS == tuple(host_stages.HOST_ARMS)
    assert preset_names.SWEEP_GRIDS == (*fl_sweep.GRIDS, *fl_sweep.BASE_GRIDS)
    assert (run_checks.BASE_SEED, run_checks.MAX_SEED, run_checks.MAX_ITERATIONS) == (1000, 2**31 - 1, 10**6)
    assert fl_run.BASE_SEED is run_checks.BASE_SEED
    assert all(note and "\n" not in note for note in (*preset_names.FROZENLAKE.values(), *preset_names.HOST.values()))


def test_describe_groups_the_names_of_one_note_in_order():
    assert preset_names.describe({"a": "x", "b": "y", "c": "x"}) == "a, c (x); b (y)"


@pytest.mark.parametrize("module", ["experiments.aot_check", "experiments.aot_report", "experiments.bench_model",
                                    "experiments.bench_rollout", "experiments.bench_train",
                                    "experiments.compare_seed_sets", "experiments.gpu_attention_check"])
def test_every_other_script_gives_a_one_line_usage_error(module):
    rc, _, err, _ = imported_modules(["-m", module, "--no-such-option"])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"python -m {module}: error: ") and "(--help lists the options)" in lines[0]


def test_a_script_on_a_machine_without_accelerators_logs_no_libtpu_error():
    """libtpu (the test extra) logs a TPU initialisation error in any process that lets JAX look for a TPU; the
    scripts run on the CPU where no accelerator device exists, and leave an explicit JAX_PLATFORMS alone."""
    import glob
    if any(glob.glob(p) for p in ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")):
        pytest.skip("this machine has an accelerator device")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = "import experiments, jax, os; print(jax.devices()[0].platform, os.environ['JAX_PLATFORMS'])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["cpu", "cpu"], proc.stderr
    assert "TPU_WORKER_HOSTNAMES" not in proc.stderr and "libtpu" not in proc.stderr, proc.stderr
    code = "import experiments, os; print(os.environ['JAX_PLATFORMS'])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT),
                                                                        "JAX_PLATFORMS": "cpu,tpu"},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "cpu,tpu"
