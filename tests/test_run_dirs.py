"""Run directories of the study: validated CLI numbers, settings recorded in config.json, DONE markers and
checkpoints, refusal (naming the settings) of a rerun with other settings unless --force (which redoes the
stage), metrics not repeated after a kill between their append and the checkpoint save, a diverged RL stage
stopped with a clear error, --seed-offset, one writer per run directory (a lock naming the holder), DONE markers
that are not JSON objects refused, and checkpoints and settings checked before anything is written."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments import cli
from jaxagent.study.host import run as host_run
from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent.models import qwen3
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.study import run_dir, stages
from jaxagent.study.frozenlake.presets import PRESETS
from jaxagent.study.common.policies import save_policy
from jaxagent.study.common.run_checks import BASE_SEED, NonFiniteError
from jaxagent.study.frozenlake.run import Run
from jaxagent.study.frozenlake.train import make_runtime, run_arm, run_base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

CI = PRESETS["ci"]
ARM = "grpo_oracle"  # a random-init policy gets real gradients from the process reward (see test_study_mesh)
ONE_ARM = dataclasses.replace(CI, arms=(ARM,), seeds=(0,))


class Interrupted(Exception):
    pass


def _quiet(*_):
    pass


def _config(run):
    with open(os.path.join(run.dir, "config.json")) as f:
        return json.load(f)


def _rows(path, key):
    with open(path) as f:
        return [json.loads(line)[key] for line in f]


# ---------------------------------------------------------------- command line
@pytest.mark.parametrize("argv, message", [
    (["--iterations", "-3"], r"argument --iterations: must be a positive integer \(>= 1\), got -3"),
    (["--iterations", "0"], r"argument --iterations: must be a positive integer \(>= 1\), got 0"),
    (["--iterations", "two"], r"argument --iterations: expected an integer"),
    (["--seeds", "-1"], r"argument --seeds: must be a non-negative integer \(>= 0\), got -1"),
    (["--seeds", "1", "1"], r"argument --seeds: values must be distinct, got 1 1"),
    (["--mesh", "0", "1", "1"], r"argument --mesh: must be a positive integer"),
    (["--seed-offset", "-2"], r"argument --seed-offset: must be a non-negative integer"),
    (["--num-processes", "0"], r"argument --num-processes: must be a positive integer"),
])
def test_cli_numbers_are_validated(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parser("x", run_options=True).parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert __import__("re").search(message, err), err


def test_run_options_only_where_the_script_applies_them(capsys):
    # a script that does not build its run with make_run must not silently ignore --seed-offset / --force
    with pytest.raises(SystemExit):
        cli.parser("x").parse_args(["--seed-offset", "2"])
    args = cli.parser("x", run_options=True).parse_args(["--preset", "ci"])
    assert args.seed_offset == 0 and args.force is False


def test_preset_numbers_are_validated_in_run(tmp_path):
    for change, message in [({"iterations": -3}, "iterations must be a positive integer, got -3"),
                            ({"seeds": (0, 0)}, "seeds must be distinct"),
                            ({"seeds": (-1,)}, "seeds must be one or more non-negative integers"),
                            ({"dynamics_every": 0}, "dynamics_every must be a positive integer")]:
        with pytest.raises(ValueError, match=message):
            Run(dataclasses.replace(CI, **change), str(tmp_path))
    with pytest.raises(ValueError, match="seed_offset must be a non-negative integer"):
        Run(CI, str(tmp_path), seed_offset=-1)


# ---------------------------------------------------------------- seed offset
def test_a_config_of_an_older_version_without_newer_fields_is_the_same_run(tmp_path):
    """config.json written before a field existed (top-level or in a nested record) reads as that field's default:
    the rerun is accepted; a recorded value other than the default is still a mismatch."""
    root = str(tmp_path)
    first = Run(ONE_ARM, root)
    path = os.path.join(first.dir, "config.json")
    first.close()
    with open(path) as f:
        old = json.load(f)
    del old["scan_layers"], old["eval"]["n_continuations"]
    with open(path, "w") as f:
        json.dump(old, f)
    Run(ONE_ARM, root).close()
    old["eval"]["n_continuations"] = 2
    with open(path, "w") as f:
        json.dump(old, f)
    with pytest.raises(run_dir.SettingsMismatch, match=r"n_continuations: 2 vs 4"):
        Run(ONE_ARM, root)


def test_seed_offset_shifts_every_seed_into_its_own_directory(tmp_path, monkeypatch):
    root = str(tmp_path)
    run = cli.make_run(cli.parser("x", run_options=True).parse_args(
        ["--preset", "ci", "--root", root, "--seed-offset", "3"]))
    assert run.dir == os.path.join(root, "ci-s3")
    assert run.preset.seeds == (3, 4) and run.seed_offset == 3 and run.base_seed == BASE_SEED + 3
    assert _config(run)["seed_offset"] == 3 and _config(run)["seeds"] == [3, 4]
    assert run.base_settings()["seed"] == 1003 and run.arm_stage_settings("grpo", 3)["seed"] == 3
    plain = cli.make_run(cli.parser("x", run_options=True).parse_args(["--preset", "ci", "--root", root]))
    assert plain.dir == os.path.join(root, "ci") and plain.preset.seeds == (0, 1) and plain.base_seed == 1000
    assert _config(plain)["seed_offset"] == 0 and _config(run)["seed_offset"] == 3  # both coexist
    named = Run(dataclasses.replace(CI, seeds=(0,)), root, "mine", seed_offset=2)
    assert named.dir == os.path.join(root, "mine") and named.preset.seeds == (2,)
    # the same directory with another offset: refused
    with pytest.raises(run_dir.SettingsMismatch, match=r"seed_offset: 3 vs 0"):
        Run(CI, root, "ci-s3")
    # the base SFT draws from the shifted key
    seen = {}

    def fake_train_base(world, cfg, key, *args, **kw):
        seen["key"] = jax.random.key_data(key)
        raise Interrupted

    monkeypatch.setattr(stages, "train_base", fake_train_base)
    with pytest.raises(Interrupted):
        run_base(run, log=_quiet)
    assert (seen["key"] == jax.random.key_data(jax.random.key(1003))).all()


# ---------------------------------------------------------------- run-level settings
def test_other_preset_in_the_same_directory_is_refused_by_name(tmp_path):
    root = str(tmp_path)
    Run(CI, root)
    quick = dataclasses.replace(PRESETS["quick"], name="quick")
    with pytest.raises(run_dir.SettingsMismatch) as e:
        Run(quick, root, "ci")
    msg = str(e.value)
    assert "model.hidden_size: 32 vs 64" in msg and "name: 'ci' vs 'quick'" in msg and "--force" in msg
    assert _config(Run(CI, root))["name"] == "ci"  # config.json not overwritten by the refused run
    with pytest.raises(run_dir.SettingsMismatch, match=r"\(1 differ.*\): iterations: 2 vs 3"):
        Run(dataclasses.replace(CI, iterations=3), root)
    # where and which never count: mesh, seeds, arms
    Run(dataclasses.replace(CI, seeds=(0, 1, 2), arms=("grpo",)), root)
    # --force: accepted, recorded, and the cached evaluations of the old settings dropped
    os.makedirs(os.path.join(root, "ci", "eval"))
    open(os.path.join(root, "ci", "eval", "base.json"), "w").write("{}")
    run = Run(dataclasses.replace(CI, iterations=3), root, force=True)
    assert _config(run)["iterations"] == 3 and not os.path.exists(os.path.join(root, "ci", "eval"))


# ---------------------------------------------------------------- stage-level settings (base)
@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    run = Run(CI, root)
    with open(os.path.join(run.path("base"), "metrics.jsonl"), "w") as f:  # of an SFT killed at step 2
        f.write('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    params = run_base(run, log=_quiet)
    return dict(root=root, run=run, params=params, out=os.path.join(run.dir, "base"))


def _steps_changed(steps):
    return dataclasses.replace(CI, base=dataclasses.replace(CI.base, steps=steps))


@pytest.mark.slow
def test_base_done_marker_records_its_settings(base_run):
    run, out = base_run["run"], base_run["out"]
    assert run_dir.done_settings(out) == run.base_settings()
    assert run_dir.done_settings(out)["base"]["steps"] == CI.base.steps and run_dir.done_settings(out)["seed"] == 1000
    # the SFT restarted from step 0 after the (simulated) kill: its log starts over, no repeated steps
    assert _rows(os.path.join(out, "metrics.jsonl"), "step") == list(range(CI.base.steps))
    before = os.path.getmtime(os.path.join(out, "DONE"))
    logs = []
    run_base(Run(CI, base_run["root"]), log=logs.append)
    assert "done already" in logs[0] and os.path.getmtime(os.path.join(out, "DONE")) == before


@pytest.mark.slow
def test_base_with_other_settings_refused_then_redone_with_force(base_run, tmp_path):
    root = str(tmp_path)
    shutil.copytree(base_run["run"].dir, os.path.join(root, "ci"))
    out = os.path.join(root, "ci", "base")
    # config.json already says 5 steps (as an older version would have left it): the DONE marker still refuses
    Run(_steps_changed(5), root, force=True)
    with pytest.raises(run_dir.SettingsMismatch, match=r"stage base: .*base/DONE was made with other settings "
                                                       r"\(1 differ.*\): base\.steps: 4 vs 5.*--force"):
        run_base(Run(_steps_changed(5), root), log=_quiet)
    assert len(_rows(os.path.join(out, "metrics.jsonl"), "step")) == CI.base.steps
    run = Run(_steps_changed(5), root, force=True)
    run_base(run, log=_quiet)
    assert run_dir.done_settings(out)["base"]["steps"] == 5
    assert _rows(os.path.join(out, "metrics.jsonl"), "step") == list(range(5))  # redone, not appended


@pytest.mark.slow
def test_policy_of_another_model_never_reaches_xla(base_run, tmp_path):
    """An older run directory (DONE without settings) reused with another model: a clear error at load."""
    root = str(tmp_path)
    shutil.copytree(base_run["run"].dir, os.path.join(root, "ci"))
    run_dir.mark_done(os.path.join(root, "ci", "base"))  # a marker without settings
    os.remove(os.path.join(root, "ci", "config.json"))
    wider = dataclasses.replace(CI, model=dataclasses.replace(CI.model, hidden_size=64, intermediate_size=128))
    with pytest.raises(run_dir.SettingsMismatch, match=r"saved for another model config.*hidden_size: 32 vs 64"):
        run_base(Run(wider, root, "ci"), log=_quiet)


# ---------------------------------------------------------------- RL stage: kills, settings, divergence
@pytest.fixture(scope="module")
def arm_run(tmp_path_factory):
    """grpo_oracle/seed0 of the ci preset from a random-init base: killed between the metrics append and the
    checkpoint save of iteration 0 (no checkpoint yet), then of iteration 1 (checkpoint 0 on disk), then
    resumed to the end."""
    root = str(tmp_path_factory.mktemp("runs"))
    run = Run(ONE_ARM, root)
    save_policy(os.path.join(run.path("base"), "policy"), run.cfg, qwen3.init(run.cfg, jax.random.key(3)))
    run_dir.mark_done(run.path("base"))
    base = run_base(run, log=_quiet)
    rt = make_runtime(run, run.arm_settings(ARM))
    out = os.path.join(run.dir, "arms", ARM, "seed0")
    real_save = ckpt_lib.save
    seen = {}

    def killed_before_save(at):
        def save(manager, state, *args, step=None, **kw):
            if step == at:
                seen[at] = (_rows(os.path.join(out, "metrics.jsonl"), "iteration"),
                            _rows(os.path.join(out, "dynamics.jsonl"), "step"))
                raise Interrupted
            return real_save(manager, state, *args, step=step, **kw)
        return save

    logs = []
    with pytest.MonkeyPatch.context() as mp:
        for at in (0, 1):
            mp.setattr(ckpt_lib, "save", killed_before_save(at))
            with pytest.raises(Interrupted):
                run_arm(run, ARM, 0, base, runtime=rt, log=logs.append)
        mp.setattr(ckpt_lib, "save", real_save)
        params = run_arm(run, ARM, 0, base, runtime=rt, log=logs.append)
    return dict(root=root, run=run, base=base, rt=rt, out=out, seen=seen, logs=logs, params=params)


@pytest.mark.slow
def test_metrics_not_repeated_after_a_kill_between_append_and_save(arm_run):
    out, seen = arm_run["out"], arm_run["seen"]
    # what the kills left: the lines of the iteration whose checkpoint never came
    assert seen[0] == ([0], [-1, 0])
    assert seen[1] == ([0, 1], [-1, 0, 1])  # iteration 0 was redone from scratch: its lines not repeated
    assert any("resuming at iteration 1" in str(m) for m in arm_run["logs"])
    assert _rows(os.path.join(out, "metrics.jsonl"), "iteration") == [0, 1]
    assert _rows(os.path.join(out, "dynamics.jsonl"), "step") == [-1, 0, 1]
    assert ckpt_lib.all_steps(os.path.join(out, "ckpt")) == [0, 1]


@pytest.mark.slow
def test_arm_done_marker_and_checkpoints_record_settings(arm_run):
    run, out = arm_run["run"], arm_run["out"]
    want = run.arm_stage_settings(ARM, 0)
    assert run_dir.done_settings(out) == want
    assert want["arm"]["iterations"] == 2 and want["seed"] == 0 and want["base"] == run.base_settings()
    meta = ckpt_lib.read_metadata(ckpt_lib.make_manager(os.path.join(out, "ckpt"), read_only=True))
    assert meta["extra"]["settings"] == want


@pytest.mark.slow
def test_arm_with_other_settings_refused_then_redone_with_force(arm_run, tmp_path):
    root = str(tmp_path)
    shutil.copytree(arm_run["run"].dir, os.path.join(root, "ci"))
    out = os.path.join(root, "ci", "arms", ARM, "seed0")
    three = dataclasses.replace(ONE_ARM, iterations=3)
    with pytest.raises(run_dir.SettingsMismatch, match=r"iterations: 2 vs 3"):
        Run(three, root)  # the run directory first
    Run(three, root, force=True)  # config.json now says 3 (an older version overwrote it so)
    rt = arm_run["rt"]
    with pytest.raises(run_dir.SettingsMismatch, match=rf"stage {ARM}/seed0: .*DONE was made with other settings "
                                                       r"\(1 differ.*\): arm\.iterations: 2 vs 3"):
        run_arm(Run(three, root), ARM, 0, arm_run["base"], runtime=rt, log=_quiet)
    # an unfinished arm: its checkpoint's recorded settings refuse the same way
    os.remove(os.path.join(out, "DONE"))
    with pytest.raises(run_dir.SettingsMismatch, match=r"ckpt/1 was made with other settings.*arm\.iterations: 2 vs 3"):
        run_arm(Run(three, root), ARM, 0, arm_run["base"], runtime=rt, log=_quiet)
    assert _rows(os.path.join(out, "metrics.jsonl"), "iteration") == [0, 1]  # untouched by the refusals
    # --force: the stage is redone from iteration 0 with the new settings; its cached evaluations go
    ev = os.path.join(root, "ci", "eval")
    os.makedirs(ev, exist_ok=True)
    for f in (f"{ARM}_seed0.json", f"step_quality_{ARM}_seed0.json", "base.json"):
        open(os.path.join(ev, f), "w").write("{}")
    logs = []
    run_arm(Run(three, root, force=True), ARM, 0, arm_run["base"], runtime=rt, log=logs.append)
    assert not any("resuming" in str(m) for m in logs)
    assert _rows(os.path.join(out, "metrics.jsonl"), "iteration") == [0, 1, 2]
    assert run_dir.done_settings(out)["arm"]["iterations"] == 3
    assert sorted(os.listdir(ev)) == ["base.json"]


def _diverging(rt, how):
    def step(state, batch):
        new, m = rt.train_step(state, batch)
        if how == "nan_params":
            new = new.replace(params={**new.params, "norm": {"weight": new.params["norm"]["weight"] * jnp.nan}})
        else:
            m = {**m, "skipped": jnp.float32(1.0)}
        return new, m
    return dataclasses.replace(rt, train_step=step)


@pytest.mark.slow
@pytest.mark.parametrize("how, message", [
    ("nan_params", r"iteration 0 diverged: non-finite params: \['norm'\]\['weight'\]"),
    ("skipped", r"iteration 0 diverged: skipped=1 \(share of this iteration's updates the optimizer skipped"),
])
def test_diverged_rl_stage_stops_with_a_clear_error(arm_run, tmp_path, how, message):
    run = Run(ONE_ARM, str(tmp_path))
    shutil.copytree(os.path.join(arm_run["run"].dir, "base"), os.path.join(run.dir, "base"), dirs_exist_ok=True)
    with pytest.raises(NonFiniteError, match=rf"\[{ARM}/seed0\] RL {message}"):
        run_arm(run, ARM, 0, arm_run["base"], runtime=_diverging(arm_run["rt"], how), log=_quiet)
    out = os.path.join(run.dir, "arms", ARM, "seed0")
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))  # nothing of the bad iteration written
    assert ckpt_lib.all_steps(os.path.join(out, "ckpt")) == [] and not run_dir.done(out)


def test_cut_jsonl_keeps_earlier_records_and_drops_a_torn_line(tmp_path):
    path = str(tmp_path / "m.jsonl")
    with open(path, "w") as f:
        f.write('{"iteration": 0}\n{"iteration": 1}\n{"iteration": 2}\n{"iterat')
    assert run_dir.cut_jsonl(path, lambda r: r["iteration"] < 2) == 2
    assert _rows(path, "iteration") == [0, 1]
    assert run_dir.cut_jsonl(path, lambda r: True) == 0


# ---------------------------------------------------------------- one writer per run directory
HOLDER = ("import sys; from jaxagent.study import run_dir; held = [run_dir.RunDir(p) for p in sys.argv[1:]]; "
          "print('locked', flush=True); sys.stdin.read()")


def test_a_run_directory_held_by_another_process_is_refused_naming_it(tmp_path):
    root = str(tmp_path)
    ci, sql = os.path.join(root, "ci"), os.path.join(root, "ci-sql")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ci, sql], cwd=ROOT, env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        held = (rf"run directory {re.escape(ci)} is in use by pid {holder.pid} "
                r"\(started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: ")
        with pytest.raises(run_dir.RunDirInUse, match=held + r"-c .*\); wait for it to end, or choose another"):
            Run(CI, root)
        with pytest.raises(run_dir.RunDirInUse, match=rf"run directory {re.escape(sql)} is in use by pid {holder.pid}"):
            host_run.HostRun(HOST_PRESETS["ci-sql"], root)
        assert sorted(os.listdir(ci)) == [".lock"] and sorted(os.listdir(sql)) == [".lock"]  # nothing written
    finally:
        holder.communicate(input="")
    run = Run(CI, root)  # the holder ended: its lock went with it
    assert os.path.isfile(os.path.join(ci, "config.json"))
    # in this process the directory's lock is shared by its Run objects and dropped with the last one
    again = Run(CI, root)
    run.close()
    assert run_dir.is_locked(ci)
    again.close()
    assert not run_dir.is_locked(ci)


@pytest.mark.slow
def test_two_studies_started_at_once_on_one_directory(tmp_path):
    """Two real processes: one trains, the other stops at once with one line and exit code 2; the trained base's
    log holds each SFT step once."""
    root = str(tmp_path)
    cmd = [sys.executable, "-m", "experiments.base", "--preset", "ci", "--root", root]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    err = [line for line in outs[loser][1].splitlines() if line.strip()]
    assert len(err) == 1, err
    assert re.fullmatch(rf"error: run directory {re.escape(root)}/ci is in use by pid {procs[winner].pid} \(started "
                        r"[-0-9 :]+: \S*experiments/base\.py --preset ci --root .*\); wait for it to end, or choose "
                        r"another --name/--root", err[0]), err[0]
    out = os.path.join(root, "ci", "base")
    assert _rows(os.path.join(out, "metrics.jsonl"), "step") == list(range(CI.base.steps))
    assert run_dir.done_settings(out)["base"]["steps"] == CI.base.steps


@pytest.mark.slow
def test_in_a_multi_process_job_process_0_locks_for_the_job(tmp_path):
    from tests.multiprocess import start_workers, wait_workers

    held = run_dir.RunDir(str(tmp_path / "busy"))  # another run, here in the test process
    try:
        outs = wait_workers(start_workers("run_dir_worker.py", tmp_path), 300)
    finally:
        held.release()
    seen = sorted((json.load(open(o)) for o in outs), key=lambda r: r["process"])
    assert [(r["holds"], r["locked"]) for r in seen] == [(True, True), (False, True)]
    busy = re.escape(str(tmp_path / "busy"))
    assert re.match(rf"run directory {busy} is in use by pid {os.getpid()} ", seen[0]["busy"]), seen[0]
    assert re.match(rf"run directory {busy}: process 0 of this job could not make or lock it", seen[1]["busy"]), seen[1]


# ---------------------------------------------------------------- markers and checks before writing
@pytest.mark.parametrize("content", ["garbage", "", "[1, 2]", '{"finished": "2026-'])
def test_a_done_marker_that_is_not_a_json_object_is_an_error_not_a_finished_stage(tmp_path, content):
    run = Run(CI, str(tmp_path))
    out = run.path("base")
    with open(os.path.join(out, "DONE"), "w") as f:
        f.write(content)
    with pytest.raises(run_dir.InvalidMarker, match=rf"DONE marker {re.escape(out)}/DONE (is unreadable|holds a JSON "
                                                    r"list).*delete it to redo the stage"):
        run.stage_done(out, run.base_settings(), "base")
    with pytest.raises(run_dir.InvalidMarker):
        run_dir.done(out)
    forced = Run(CI, str(tmp_path), force=True)
    assert forced.stage_done(out, forced.base_settings(), "base") is False  # with --force: redone
    assert not os.path.exists(os.path.join(out, "DONE"))
    run_dir.mark_done(out, {"finished": "x"})  # an older version's marker (no settings) is still one
    assert run_dir.done(out) and run_dir.done_settings(out) is None


def test_a_missing_or_bad_checkpoint_is_refused_before_the_run_directory_is_written(tmp_path):
    root = str(tmp_path / "runs")
    with pytest.raises(CheckpointError, match=r"checkpoint directory '/nonexistent' does not exist"):
        Run(dataclasses.replace(CI, checkpoint="/nonexistent"), root, "x")
    assert not os.path.exists(root)  # not even the run directory: the corrected rerun is not refused
    small = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    ckpt = host_run.write_tiny_checkpoint(str(tmp_path / "small"), small)  # the real tokenizer: 151,669 ids
    with pytest.raises(CheckpointError, match=r"tokenizer at \S*small has 151669 ids but the model in \S*small has "
                                              r"vocab_size 40"):
        Run(dataclasses.replace(CI, checkpoint=ckpt), root, "x")
    with pytest.raises(CheckpointError, match=r"tokenizer at \S*small has 151669 ids"):
        host_run.HostRun(dataclasses.replace(HOST_PRESETS["ci-sql"], checkpoint=ckpt), root, "h")
    # packed policy positions need one batch shard: refused before the run directory is made
    sharded = dataclasses.replace(HOST_PRESETS["ci-sql"], mesh=(8, 1, 1), n_tasks=4, group_size=2)
    with pytest.raises(run_dir.InvalidSettings, match=r"policy_positions packs .* data x fsdp = 8"):
        host_run.HostRun(sharded, root, "p")
    assert not os.path.exists(root)
    good = host_run.write_tiny_checkpoint(str(tmp_path / "good"), dataclasses.replace(small, vocab_size=151936))
    run = Run(dataclasses.replace(CI, checkpoint=good), root, "x")
    assert run.cfg.vocab_size == 151936 and _config(run)["checkpoint"] == good


def test_a_root_that_is_a_file_or_read_only_is_one_clear_error(tmp_path):
    f = tmp_path / "passwd"
    f.write_text("x")
    with pytest.raises(run_dir.InvalidRunDir, match=rf"cannot make run directory {re.escape(str(f))}/ci: "
                                                    rf"{re.escape(str(f))} is a file, not a directory"):
        Run(CI, str(f))
    with pytest.raises(run_dir.InvalidRunDir, match=r"is a file, not a directory"):
        Run(CI, str(tmp_path), "passwd")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(run_dir.InvalidRunDir, match="Permission denied"):
            Run(CI, str(ro))
