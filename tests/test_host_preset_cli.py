"""Host presets on the command line as FrozenLake's are: every host preset dumps to TOML and loads back equal
(`--dump-config`, `--config`, `--set`, with one-line errors for unknown keys and wrong types), and `--seed-offset N`
shifts the RL seeds, the base's SFT seed and the tiny model's init seed into a run directory of its own."""
import dataclasses
import json
import os
import re
import tomllib

import numpy as np
import pytest

from experiments import host_study, reproduce
from jaxagent import config_file
from jaxagent.models import weights
from jaxagent.study.host.presets import HOST_PRESETS, HostPreset, run_name, with_seed_offset
from jaxagent.study.host.run import HostRun


def _dump(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--dump-config"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("name", sorted(HOST_PRESETS))
def test_every_host_preset_round_trips_through_toml(name, capsys, tmp_path):
    text = _dump(reproduce.main, ["--preset", name], capsys)
    assert text.startswith(f"# the host study preset {name}: python -m experiments.reproduce --config FILE")
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    assert config_file.load(HostPreset, str(path)) == HOST_PRESETS[name]
    assert _dump(reproduce.main, ["--config", str(path)], capsys) == text   # reproduce hands it to host_study


def test_a_null_worker_count_is_none_in_toml_and_set_overrides(capsys, tmp_path):
    assert HOST_PRESETS["qwen3-0.6b-1gpu-code"].task.workers is None   # a field whose default is 4
    text = _dump(host_study.main, ["--preset", "qwen3-0.6b-1gpu-code"], capsys)
    assert '\nworkers = "none"\n' in text
    path = tmp_path / "code.toml"
    path.write_text(text)
    changed = _dump(host_study.main, ["--config", str(path), "--set", "task.workers=3", "--set", "lr=3e-5"], capsys)
    assert set(changed.splitlines()) - set(text.splitlines()) == {"workers = 3", "lr = 3e-05"}
    ci = _dump(host_study.main, ["--preset", "ci-sql", "--set", "task.workers=none"], capsys)
    assert config_file.load(HostPreset, tomllib.loads(ci)).task.workers is None


@pytest.mark.parametrize("argv, message", [
    (["--preset", "ci-sql", "--set", "task.t_maxx=3"], "error: config: HostTaskSettings has no field task.t_maxx"),
    (["--preset", "ci-sql", "--set", "iterations=many"], "error: config: iterations must be an int, got 'many'"),
    (["--preset", "ci-sql", "--set", "lr=none"], "error: config: lr must be a float, got 'none'"),
    (["--config", "/nonexistent/x.toml"], "error: config file /nonexistent/x.toml: cannot be read"),
    ([], "error: give --preset NAME or --config FILE"),
])
def test_config_errors_are_one_line(argv, message, capsys):
    assert _error(host_study.main, [*argv, "--dump-config"], capsys).startswith(message)


def test_reproduce_accepts_seed_offset_for_host_presets(capsys):
    text = _dump(reproduce.main, ["--preset", "sql-toy", "--seed-offset", "30"], capsys)
    assert "\nseeds = [30, 31, 32]\n" in text and "\nseed_offset = 30\n" in text
    assert re.search(r"\[sft\]\n(.*\n)*seed = 30\n", text)


def test_seed_offset_gives_other_seeds_sft_seed_base_and_run_directory(tmp_path):
    ci, toy = HOST_PRESETS["ci-sql"], HOST_PRESETS["sql-toy"]
    assert with_seed_offset(ci, 0) is ci and run_name(ci) == "ci-sql"   # offset 0 changes nothing
    shifted = with_seed_offset(ci, 3)
    assert shifted.seeds == tuple(s + 3 for s in ci.seeds) and shifted.seed_offset == 3
    assert run_name(shifted) == "ci-sql-s3" and run_name(with_seed_offset(shifted, 2)) == "ci-sql-s5"
    assert run_name(dataclasses.replace(shifted, rehearsal=True)) == "ci-sql-rehearsal-s3"   # as FrozenLake's
    assert with_seed_offset(toy, 3).sft.seed == toy.sft.seed + 3 and with_seed_offset(toy, 3).seeds == (3, 4, 5)
    # ci-sql's base is the tiny model's random init: its own seed, in its own run directory
    plain, other = HostRun(ci, str(tmp_path)), HostRun(shifted, str(tmp_path))
    assert os.path.basename(plain.dir) == "ci-sql" and os.path.basename(other.dir) == "ci-sql-s3"
    with open(os.path.join(other.dir, "config.json")) as f:
        record = json.load(f)
    assert record["seed_offset"] == 3 and record["seeds"] == [3, 4]
    embed = [np.asarray(weights.load(r.checkpoint)[1]["embed"]) for r in (plain, other)]
    assert embed[0].shape == embed[1].shape and not np.array_equal(embed[0], embed[1])
    plain.run_dir.release()
    other.run_dir.release()


def test_seed_offset_through_host_studys_parser(capsys):
    args = host_study.parser().parse_args(["--preset", "ci-sql", "--seed-offset", "3"])
    p = host_study.preset_from(args)
    assert p.seeds == (3, 4) and p.seed_offset == 3 and run_name(p) == "ci-sql-s3"
    zero = host_study.preset_from(host_study.parser().parse_args(["--preset", "ci-sql", "--seed-offset", "0"]))
    assert zero == HOST_PRESETS["ci-sql"] and run_name(zero) == "ci-sql"
    assert "argument --seed-offset: must be a non-negative integer" in _error(
        host_study.main, ["--preset", "ci-sql", "--seed-offset", "-1"], capsys)
