"""Checkpoints: round trip (int layer keys, optimizer NamedTuples, PRNG key, data position), keep-N,
atomicity (temporary directories ignored), wrong-shape restores, sharded restore, an exact
kill-and-resume of a training run in subprocesses, and integrity: checksum manifests naming a flipped
or truncated file, clear errors for missing/corrupt orbax files, config and run-settings checks."""
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import sharding
from jaxagent.models import qwen3, weights
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.rl import checkpoint, optim, train_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
TX = optim.make_optimizer(1e-3, weight_decay=0.01)


def np_params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), jnp.float32),
                        qwen3.param_shapes(cfg))


def make_state(cfg=CFG, seed=0, **kw):
    state = train_state.init_train_state(cfg, TX, jax.random.key(seed), params=np_params(cfg, seed), **kw)
    # make every part distinguishable from a fresh state
    return state.replace(step=jnp.int32(7), data_pos=jnp.int32(123),
                         opt_state=jax.tree.map(
        lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x, state.opt_state))


def host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.random.key_data(x)
                                             if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                                             else x), tree)


def assert_same(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b))):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def test_round_trip_keeps_structure_values_key_and_position(tmp_path):
    cp = {"backbone": np_params(CFG, 1), "value_head": {"kernel": jnp.ones(32), "bias": jnp.zeros(())}}
    state = make_state(with_ref_params=True, value_settings=train_state.ValueSettings(), critic_params=cp)
    mngr = checkpoint.make_manager(tmp_path / "ck", max_to_keep=2)
    assert checkpoint.save(mngr, state, CFG, critic_cfg=CFG, extra={"note": "x"})
    abstract = train_state.abstract_train_state(CFG, TX, params=np_params(CFG), with_ref_params=True,
                                                value_settings=train_state.ValueSettings(), critic_params=cp)
    back = checkpoint.restore_latest(tmp_path / "ck", abstract, cfg=CFG, critic_cfg=CFG)
    assert_same(back, state)
    assert list(back.params["layers"]) == [0, 1]  # int layer keys, not '0', '1'
    assert jax.random.key_impl(back.rng) == jax.random.key_impl(state.rng)
    assert int(back.step) == 7 and int(back.data_pos) == 123
    meta = checkpoint.read_metadata(mngr)
    assert meta["model_config"]["hidden_size"] == 32 and meta["extra"] == {"note": "x"}
    assert meta["step"] == 7 and meta["data_pos"] == 123


def test_keep_n_and_atomic_tmp_dirs_ignored(tmp_path):
    d = tmp_path / "ck"
    mngr = checkpoint.make_manager(d, max_to_keep=2)
    state = make_state()
    for s in range(1, 6):
        checkpoint.save(mngr, state.replace(step=jnp.int32(s)), CFG)
    assert checkpoint.all_steps(d) == [4, 5]
    assert sorted(p for p in os.listdir(d) if p.isdigit()) == ["4", "5"]
    # a save killed mid-write leaves only a temporary directory: never listed, never restored
    (d / "9.orbax-checkpoint-tmp-1234").mkdir()
    (d / "9.orbax-checkpoint-tmp-1234" / "junk").write_text("partial")
    abstract = train_state.abstract_train_state(CFG, TX, params=np_params(CFG))
    back = checkpoint.restore_latest(d, abstract, cfg=CFG)
    assert int(back.step) == 5 and checkpoint.all_steps(d) == [4, 5]
    assert checkpoint.restore_latest(tmp_path / "missing", abstract, cfg=CFG) is None
    (tmp_path / "empty").mkdir()
    assert checkpoint.restore_latest(tmp_path / "empty", abstract, cfg=CFG) is None


def test_restore_into_another_model_shape_fails_clearly(tmp_path):
    mngr = checkpoint.make_manager(tmp_path / "ck")
    checkpoint.save(mngr, make_state(), CFG)
    other = Qwen3Config(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    abstract = train_state.abstract_train_state(other, TX, params=np_params(other))
    with pytest.raises(ValueError, match=r"hidden_size: checkpoint 32 vs expected 48"):
        checkpoint.restore_latest(tmp_path / "ck", abstract, cfg=other)
    # with the saved config but a target of another shape, the parameter shapes are compared before any
    # array is read
    with pytest.raises(ValueError, match=r"params/embed: checkpoint shape \(64, 32\) vs expected "
                                         r"\(64, 48\)"):
        checkpoint.restore_latest(tmp_path / "ck", abstract, cfg=CFG)
    # a target with parts the checkpoint lacks
    abstract_ref = train_state.abstract_train_state(CFG, TX, params=np_params(CFG), with_ref_params=True)
    with pytest.raises(ValueError, match="ref_params"):
        checkpoint.restore_latest(tmp_path / "ck", abstract_ref, cfg=CFG)


def test_restore_onto_a_mesh(tmp_path):
    state = make_state()
    mngr = checkpoint.make_manager(tmp_path / "ck")
    checkpoint.save(mngr, state, CFG)
    mesh = sharding.make_mesh(2, 2, 2)
    abstract = train_state.abstract_train_state(CFG, TX, mesh=mesh, params=np_params(CFG))
    back = checkpoint.restore_latest(mngr, abstract, cfg=CFG)
    assert_same(back, state)
    want = train_state.state_shardings(CFG, TX, mesh)
    assert back.params["layers"][1]["attn"]["q_proj"].sharding == want.params["layers"][1]["attn"]["q_proj"]
    assert back.params["embed"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def _worker(args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "resume_worker.py"), *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait(proc, timeout=300):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"worker timed out:\n{out[-3000:]}")
    return proc.returncode, out


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
    n, k = 6, 4
    d = str(tmp_path / "ck")
    killed = _worker(["--dir", d, "--steps", str(n), "--kill-after", str(k), "--keep", "3",
                      "--out", str(tmp_path / "never.npz")])
    straight = _worker(["--steps", str(n), "--out", str(tmp_path / "straight.npz")])
    rc, out = _wait(killed)
    assert rc == -9, f"expected SIGKILL, got rc={rc}:\n{out[-3000:]}"
    assert not os.path.exists(tmp_path / "never.npz")
    assert checkpoint.all_steps(d) == [k - 2, k - 1, k]  # keep-3
    resumed = _worker(["--dir", d, "--steps", str(n), "--keep", "3",
                       "--out", str(tmp_path / "resumed.npz")])
    for proc in (straight, resumed):
        rc, out = _wait(proc)
        assert rc == 0, out[-3000:]
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz")
    assert int(b["resumed"]) == k and int(a["resumed"]) == -1
    assert int(a["step"]) == int(b["step"]) == n and int(a["data_pos"]) == int(b["data_pos"]) == 4 * n
    np.testing.assert_array_equal(a["rng"], b["rng"])
    np.testing.assert_array_equal(a["losses"][k:], b["losses"])  # the resumed steps' losses
    keys = [x for x in a.files if x.startswith("[")]
    assert len(keys) == len(jax.tree.leaves(qwen3.param_shapes(Qwen3Config(num_hidden_layers=1))))
    for key in keys:
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, rtol=0, err_msg=key)
    bitwise = all(np.array_equal(a[key], b[key]) for key in keys)
    assert bitwise, "resume matched to 1e-6 but not bitwise"
    assert checkpoint.all_steps(d) == [n - 2, n - 1, n]


# ---------------------------------------------------------------- integrity
def _saved(tmp_path, **kw):
    d = tmp_path / "ck"
    mngr = checkpoint.make_manager(d, **kw)
    assert checkpoint.save(mngr, make_state(), CFG, extra={"settings": {"arm": "grpo", "lr": 1e-3}})
    return d, d / "7"


def _abstract():
    return train_state.abstract_train_state(CFG, TX, params=np_params(CFG))


def _largest_data_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def test_manifest_lists_every_file_of_the_step(tmp_path):
    d, step_dir = _saved(tmp_path)
    manifest = json.loads((step_dir / weights.MANIFEST_NAME).read_text())
    on_disk = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*")
               if p.is_file() and p.name != weights.MANIFEST_NAME}
    assert set(manifest["files"]) == on_disk and f"state/_METADATA" in on_disk
    data = _largest_data_file(step_dir)
    rel = str(data.relative_to(step_dir))
    assert manifest["files"][rel]["bytes"] == data.stat().st_size
    assert manifest["files"][rel]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    back = checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    assert_same(back, make_state())


def _saved_format_1(tmp_path, monkeypatch):
    """A step as an older version saved it: format 1, no checksum manifest."""
    monkeypatch.setattr(checkpoint, "FORMAT_VERSION", 1)
    d, step_dir = _saved(tmp_path)
    monkeypatch.undo()
    os.remove(step_dir / weights.MANIFEST_NAME)
    return d, step_dir


def _flip_byte(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def test_flipped_byte_in_the_array_data_names_the_step_and_the_file(tmp_path):
    d, step_dir = _saved(tmp_path)
    data = _largest_data_file(step_dir)
    _flip_byte(data)
    rel = str(data.relative_to(step_dir))
    with pytest.raises(CheckpointError, match=rf"checkpoint step 7 at .*7 is corrupt: file {re.escape(rel)} "
                                              r"does not match its checksum"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)


def test_step_without_its_manifest_is_refused_and_never_given_one(tmp_path):
    """A deleted manifest and a flipped byte: the step is refused by name, and a later save does not write a fresh
    manifest over the corrupt bytes."""
    d, step_dir = _saved(tmp_path)
    os.remove(step_dir / weights.MANIFEST_NAME)
    _flip_byte(_largest_data_file(step_dir))
    with pytest.raises(CheckpointError, match=r"checkpoint step 7 at \S*ck/7 has no checksum manifest "
                                              r"\(jaxagent_checksums\.json\).*delete this step directory"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    mngr = checkpoint.make_manager(d, max_to_keep=3)
    checkpoint.save(mngr, make_state(), CFG, step=8)
    checkpoint.wait_until_finished(mngr)
    assert (d / "8" / weights.MANIFEST_NAME).is_file() and not (step_dir / weights.MANIFEST_NAME).exists()
    with pytest.raises(CheckpointError, match="has no checksum manifest"):
        checkpoint.verify_step(mngr, 7)


def test_kill_between_commit_and_manifest_resumes_and_completes_the_manifest(tmp_path, monkeypatch):
    d = tmp_path / "ck"
    mngr = checkpoint.make_manager(d)

    def killed(*_):
        raise KeyboardInterrupt  # the process dies after orbax committed the step, before its manifest

    monkeypatch.setattr(weights, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(mngr, make_state(), CFG)
    monkeypatch.undo()
    assert checkpoint.all_steps(d) == [7] and not (d / "7" / weights.MANIFEST_NAME).exists()
    assert checkpoint.pending_step(checkpoint.make_manager(d, read_only=True)) == 7
    # the restart: the step this code saved restores (orbax committed it), and the next save gives it its manifest
    mngr = checkpoint.make_manager(d)
    assert_same(checkpoint.restore_latest(mngr, _abstract(), cfg=CFG), make_state())
    checkpoint.save(mngr, make_state(), CFG, step=8)
    assert checkpoint.verify_step(mngr, 7) is True and checkpoint.verify_step(mngr, 8) is True
    assert checkpoint.pending_step(mngr) is None


def test_truncated_array_data_is_named_with_and_without_manifest(tmp_path, monkeypatch):
    d, step_dir = _saved(tmp_path)
    data = _largest_data_file(step_dir)
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    rel = str(data.relative_to(step_dir))
    with pytest.raises(ValueError, match=rf"file {re.escape(rel)} has {size // 2} bytes but was saved with "
                                         rf"{size} \(truncated"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    # a step of an older format without a manifest: no TensorStore spec dump, the step directory and the cause
    d, step_dir = _saved_format_1(tmp_path / "v1", monkeypatch)
    data = _largest_data_file(step_dir)
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    with pytest.raises(ValueError, match=r"checkpoint .*7: orbax could not read the saved arrays: .*probably "
                                         r"truncated or corrupt") as e:
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    assert "TensorStore({" not in str(e.value) and len(str(e.value)) < 800


def test_missing_orbax_metadata_is_named(tmp_path, monkeypatch):
    d, step_dir = _saved(tmp_path)
    os.remove(step_dir / "state" / "_METADATA")
    with pytest.raises(ValueError, match=r"incomplete: file state/_METADATA is missing"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    d, step_dir = _saved_format_1(tmp_path / "v1", monkeypatch)  # no manifest: found by name all the same
    os.remove(step_dir / "state" / "_METADATA")
    with pytest.raises(ValueError, match=r"checkpoint .*7 is incomplete: file state/_METADATA is missing"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG)
    os.remove(step_dir / "metadata" / "metadata")
    with pytest.raises(ValueError, match=r"file metadata/metadata is missing"):
        checkpoint.read_metadata(checkpoint.make_manager(d, read_only=True))


def test_step_of_the_older_format_without_manifest_restores_unverified(tmp_path, monkeypatch):
    d, _ = _saved_format_1(tmp_path, monkeypatch)
    assert checkpoint.verify_step(checkpoint.make_manager(d, read_only=True), 7) is False
    assert_same(checkpoint.restore_latest(d, _abstract(), cfg=CFG), make_state())


def test_async_save_gets_its_manifest(tmp_path):
    d = tmp_path / "ck"
    mngr = checkpoint.make_manager(d, async_save=True)
    checkpoint.save(mngr, make_state(), CFG, step=1)
    checkpoint.save(mngr, make_state(), CFG, step=2)  # completes step 1 (and its manifest) first
    assert (d / "1" / weights.MANIFEST_NAME).is_file()
    checkpoint.wait_until_finished(mngr)
    assert (d / "2" / weights.MANIFEST_NAME).is_file()
    assert checkpoint.verify_step(mngr, 2) is True


def test_restore_needs_the_config_and_checks_run_settings(tmp_path):
    d, _ = _saved(tmp_path)
    with pytest.raises(ValueError, match="needs cfg"):
        checkpoint.restore_latest(d, _abstract(), cfg=None)
    # same shapes, another model: refused (before, a restore without cfg accepted it silently)
    other = dataclasses.replace(CFG, rope_theta=CFG.rope_theta * 2)
    with pytest.raises(ValueError, match=r"another model config: rope_theta: checkpoint"):
        checkpoint.restore_latest(d, _abstract(), cfg=other)
    with pytest.raises(ValueError, match=r"other run settings.*settings\.lr: 0\.001 vs 0\.002"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG, expect_extra={"settings": {"arm": "grpo", "lr": 2e-3}})
    with pytest.raises(ValueError, match=r"seed: '<absent>' vs 3"):
        checkpoint.restore_latest(d, _abstract(), cfg=CFG, expect_extra={"seed": 3})
    back = checkpoint.restore_latest(d, _abstract(), cfg=CFG, expect_extra={"settings": {"arm": "grpo", "lr": 1e-3}})
    assert int(back.step) == 7


def test_settings_diff_names_nested_fields():
    assert checkpoint.settings_diff({"a": {"b": 1, "c": (1, 2)}}, {"a": {"b": 1, "c": [1, 2]}}) == []
    assert checkpoint.settings_diff({"a": {"b": 1}}, {"a": {"b": 2, "d": 0}}) == ["a.b: 1 vs 2",
                                                                                "a.d: '<absent>' vs 0"]
