"""The study scripts explain themselves: every user error (a number out of range, an unknown preset, a mesh that
does not fit the devices, a root that is a file, a missing or bad checkpoint, a garbage DONE marker) is one line on
stderr and exit code 2, with no traceback and nothing written to the run directory; help texts name the command
(`python -m experiments.<script>`), list every runnable preset and show only defaults worth showing; the first
step of a stage, which compiles, is reported apart from the progress bar's rate."""
import os
import re
import subprocess
import sys
import time

import pytest

from experiments import base, cli, host_study, mistakes, progress, reproduce, rl, sweep
from experiments import eval as eval_stage
from jaxagent.study.host import run as host_run
from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent.models.config import Qwen3Config
from jaxagent.study import run_dir
from jaxagent.study.frozenlake.presets import PRESETS
from jaxagent.study.frozenlake.run import Run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16)


def _user_error(main, argv, capsys) -> str:
    """The one stderr line of `main(argv)`, which must end with exit code 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", str(2**70)], r"argument --seeds: must be a non-negative integer \(at most 2147482647\), got "
                              r"1180591620717411303424"),
    (["--seed-offset", str(2**31)], r"argument --seed-offset: must be a non-negative integer \(at most"),
    (["--iterations", str(10**9)], r"argument --iterations: must be a positive integer \(at most 1000000\)"),
    (["--preset", "nope"], r"argument --preset: invalid choice: 'nope'"),
    (["--mesh", "0", "1", "1"], r"argument --mesh: must be a positive integer \(>= 1\), got 0"),
    (["--remat", "some"], r"argument --remat: invalid choice: 'some'"),
    (["--preset"], r"argument --preset: expected one argument"),
])
def test_usage_errors_are_one_line(argv, message, capsys, tmp_path):
    line = _user_error(reproduce.main, ["--root", str(tmp_path), *argv], capsys)
    assert re.fullmatch(r"python -m experiments\.reproduce: error: " + message + r".* \(--help lists the options\)",
                        line), line
    assert not os.listdir(tmp_path)


def test_settings_that_cannot_run_are_one_line_before_any_work(capsys, tmp_path):
    root = str(tmp_path)
    # the test process has 8 CPU devices (tests/conftest.py): a 2-device mesh does not cover them
    line = _user_error(base.main, ["--preset", "ci", "--root", root, "--mesh", "2", "1", "1"], capsys)
    assert line == ("error: preset 'ci' has mesh (data, fsdp, tensor) = (2, 1, 1), which needs 2 devices, but "
                    "jax.device_count() = 8 (cpu); pick a preset/--mesh whose product is the device count")
    line = _user_error(base.main, ["--preset", "ci", "--root", root, "--mesh", "4", "4", "1"], capsys)
    assert line.endswith("(cpu); pick a preset/--mesh whose product is the device count (on a CPU host, "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=16 makes 16 CPU devices)")
    line = _user_error(rl.main, ["--preset", "ci", "--root", root, "--micro-batches", "3"], capsys)
    assert line.startswith("error: preset 'ci': the RL batch n_tasks x group_size = 2 x 4 = 8 must split into")
    assert _user_error(base.main, ["--preset", "qwen3-0.6b-1gpu", "--root", root], capsys) == (
        "error: preset qwen3-0.6b-1gpu needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    assert _user_error(base.main, ["--preset", "ci", "--process-id", "1"], capsys) == (
        "error: --process-id needs --distributed")
    assert not os.listdir(tmp_path)


def test_a_root_that_is_a_file_is_one_line(capsys, tmp_path):
    f = tmp_path / "passwd"
    f.write_text("root:x:0:0")
    for main, preset in ((base.main, "ci"), (reproduce.main, "ci-sql")):
        line = _user_error(main, ["--preset", preset, "--root", str(f)], capsys)
        assert line == f"error: cannot make run directory {f}/{preset}: {f} is a file, not a directory"
    assert f.read_text() == "root:x:0:0"


def test_a_missing_checkpoint_is_one_line_and_the_corrected_rerun_runs(capsys, tmp_path):
    root = str(tmp_path / "runs")
    line = _user_error(base.main, ["--preset", "ci", "--root", root, "--checkpoint", "/nonexistent"], capsys)
    assert line == "error: checkpoint directory '/nonexistent' does not exist"
    assert not os.path.exists(root)  # no config.json to refuse the rerun below
    ckpt = host_run.write_tiny_checkpoint(str(tmp_path / "qwen3"), TINY)
    os.remove(os.path.join(ckpt, "tokenizer.json"))
    line = _user_error(base.main, ["--preset", "ci", "--root", root, "--checkpoint", ckpt], capsys)
    assert line.startswith(f"error: tokenizer directory '{ckpt}' has no tokenizer.json")
    line = _user_error(reproduce.main, ["--preset", "ci-sql", "--root", root, "--checkpoint", ckpt], capsys)
    assert line.startswith(f"error: tokenizer directory '{ckpt}' has no tokenizer.json")
    assert not os.path.exists(root)
    os.remove(os.path.join(ckpt, "DONE"))
    ckpt = host_run.write_tiny_checkpoint(ckpt, TINY)
    base.main(["--preset", "ci", "--root", root, "--checkpoint", ckpt])
    assert run_dir.done(os.path.join(root, "ci", "base"))
    assert f"base policy in {root}/ci/base/policy" in capsys.readouterr().out


def test_a_garbage_done_marker_is_one_line(capsys, tmp_path):
    root = str(tmp_path)
    run = Run(PRESETS["ci"], root)
    with open(os.path.join(run.path("base"), "DONE"), "w") as f:
        f.write("\x00garbage")
    run.close()
    line = _user_error(base.main, ["--preset", "ci", "--root", root], capsys)
    assert re.fullmatch(rf"error: DONE marker {re.escape(run.dir)}/base/DONE is unreadable \(not JSON: .*\); it "
                        r"cannot say whether the stage finished or with which settings: delete it to redo the stage",
                        line), line


def test_one_line_and_exit_code_2_from_the_command_line(tmp_path):
    """The real command: no traceback, one line, and config.json not written."""
    proc = subprocess.run([sys.executable, "-m", "experiments.reproduce", "--preset", "ci", "--root", str(tmp_path),
                           "--checkpoint", "/nonexistent"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 2
    assert proc.stderr == "error: checkpoint directory '/nonexistent' does not exist\n"
    assert not os.listdir(tmp_path)


# ---------------------------------------------------------------- help texts
def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("main, module, argv", [
    (reproduce.main, "experiments.reproduce", []),
    (base.main, "experiments.base", []),
    (rl.main, "experiments.rl", []),
    (sweep.main, "experiments.sweep", []),
    (host_study.main, "experiments.host_study", []),
    (mistakes.main, "experiments.mistakes", []),
    (reproduce.main, "experiments.reproduce", ["--preset", "ci-sql"]),
])
def test_help_names_the_command_and_shows_only_real_defaults(main, module, argv, capsys):
    text = _help(main, argv, capsys)
    assert text.startswith(f"usage: python -m {module} ")
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: runs)" in text  # --root's default, shown
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", " ".join(text.split()))  # never two in a row
    # the description is the docstring's whole first paragraph: it ends a sentence, not mid-way
    description = " ".join(text.split("\n\n")[1].split())
    assert description.endswith((".", ".)")) and description in {
        cli.summary(m.__doc__) for m in (reproduce, base, rl, sweep, host_study, mistakes)}


def test_aot_check_usage_names_the_module_and_no_preset(capsys, monkeypatch):
    from experiments import aot_check
    monkeypatch.setenv("COLUMNS", "2000")    # no wrapping (argparse breaks lines at hyphens)
    text = _help(aot_check.parse_args, [], capsys)
    usage = " ".join(text.split("\n\n")[0].split())
    assert usage.startswith("usage: python -m experiments.aot_check [-h] --preset PRESET ")
    assert not [n for n in (*PRESETS, *HOST_PRESETS) if "-" in n and n in usage], usage   # in --preset's help
    assert all(name in " ".join(text.split()) for name in (*PRESETS, *HOST_PRESETS))


def test_mistakes_errors_are_one_line(capsys, tmp_path, monkeypatch):
    from jaxagent.study.host import mistakes as host_mistakes
    assert "invalid choice: 'sql-huge'" in _user_error(mistakes.main, ["--preset", "sql-huge"], capsys)
    assert "--budget" in _user_error(mistakes.main, ["--preset", "ci-sql", "--budget", "0"], capsys)
    monkeypatch.setattr(host_mistakes, "ENVS", ("sql", "code"))  # an env that does not sort its submissions
    err = _user_error(mistakes.main, ["--preset", "ci-bfcl", "--root", str(tmp_path)], capsys)
    assert "its domain's env is 'bfcl'" in err
    assert "T_max is 2" in _user_error(mistakes.main, ["--preset", "ci-sql", "--root", str(tmp_path),
                                                        "--budget", "3"], capsys)
    assert os.listdir(tmp_path) == []  # refused before any run directory is made


def test_reproduce_help_lists_every_runnable_preset(capsys):
    text = " ".join(_help(reproduce.main, [], capsys).split())
    for name in sorted(PRESETS) + sorted(HOST_PRESETS):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text.replace("- ", "-")), name
    assert "(default: the preset name) (default: None)" not in text and "(default: quick)" in text


def test_a_script_run_as_a_module_names_itself(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [eval_stage.__file__])  # `python -m experiments.eval` sets argv[0] so
    assert _help(eval_stage.main, [], capsys).startswith("usage: python -m experiments.eval ")
    assert cli.script_prog() == "python -m experiments.eval"


# ---------------------------------------------------------------- compile time apart from the step rate
def test_the_first_step_is_reported_apart_and_the_bar_rates_the_rest(monkeypatch):
    monkeypatch.setattr(progress.ProgressBar, "QUICK_S", 0.5)
    lines = []
    bar = progress.ProgressBar(5, "base SFT", "step", log=lines.append)
    time.sleep(0.6)  # the first step: compiling
    bar.step(loss="1.0")
    assert bar.bar.n == 1 and len(lines) == 1
    m = re.fullmatch(r"\[base SFT\] step 1 of 5: (\d+\.\d) s \(it compiles the programs the first time they run; the "
                     r"rate below counts the steps after it\)", lines[0])
    assert m and float(m.group(1)) >= 0.6, lines
    for _ in range(4):
        time.sleep(0.01)
        bar.step(loss="0.5")
    fmt = bar.bar.format_dict
    assert bar.bar.n == 5 and fmt["initial"] == 1 and fmt["unit"] == "step"
    assert fmt["elapsed"] < 0.5  # the bar's clock started after the first step: its rate is 4 steps in ~0.05 s
    bar.close()
    resumed = progress.ProgressBar(10, "grpo seed 0", "iteration", initial=3, log=lines.append)
    time.sleep(0.6)
    resumed.step(success="0.50")
    assert lines[-1].startswith("[grpo seed 0] iteration 4 of 10: ") and resumed.bar.n == 4
    resumed.close()
    # a first step that compiled nothing (a result read back): no "it compiles" line; whole unit names
    cached = progress.ProgressBar(3, "eval Pass@(K,T)", "policy", log=lines.append)
    cached.step()
    assert len(lines) == 2 and cached.bar.format_dict["unit"] == "policy"
    cached.close()
    assert [progress.plural(u) for u in ("policy", "step", "iteration", "day")] == [
        "policies", "steps", "iterations", "days"]


def test_a_preset_as_a_toml_file_with_overrides(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--preset", "ci", "--dump-config"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("# the study preset ci: python -m experiments.reproduce --config FILE")
    assert "\n[task]\n" in text
    (tmp_path / "ci.toml").write_text(text)
    with pytest.raises(SystemExit):
        reproduce.main(["--config", str(tmp_path / "ci.toml"), "--set", "iterations=3", "--set", "task.t_max=5",
                        "--dump-config"])
    again = capsys.readouterr().out
    changed = {line for line in again.splitlines()} - set(text.splitlines())
    assert changed == {"iterations = 3", "t_max = 5"}, changed
    missing = str(tmp_path / "none.toml")
    for argv, message in ((["--set", "task.t_maxx=5"], "error: config: TaskSettings has no field task.t_maxx"),
                          (["--config", missing], "error: config file .*none.toml: cannot be read")):
        with pytest.raises(SystemExit) as e:
            reproduce.main(["--preset", "ci", *argv, "--dump-config"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert re.match(message, err) and err.count("\n") == 1, err
