"""Saved models (`weights.save`): the checksum manifest names a flipped, truncated, missing or unlisted file;
directories without one (Hugging Face) load unverified; malformed safetensors headers and non-finite
weights give errors naming the file and the tensor; a checkpoint that is not what it claims (another activation,
integer weights, overlapping or gapped tensor data, absurd dimensions, a tokenizer larger than the model's
vocabulary) is refused naming the file and the field."""
import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import qwen3, safetensors_io, weights
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.models.tokenizer import build_word_tokenizer
from jaxagent.study import run_dir

CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
UP0 = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def params():
    return qwen3.init(CFG, jax.random.key(0))


def _save(params, d, **kw):
    weights.save(str(d), CFG, params, **kw)
    return d


def _flip(path, offset_from_end=64):
    raw = bytearray(path.read_bytes())
    raw[len(raw) - offset_from_end] ^= 0x20
    path.write_bytes(bytes(raw))


def _same(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_save_writes_a_manifest_of_every_file(params, tmp_path):
    d = _save(params, tmp_path / "m")
    manifest = json.loads((d / weights.MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors"]
    assert manifest["files"]["model.safetensors"]["bytes"] == (d / "model.safetensors").stat().st_size
    assert manifest["files"]["config.json"]["sha256"] == weights.file_sha256(str(d / "config.json"))
    cfg, back = weights.load(d)
    assert cfg == CFG and _same(back, params)


def test_flipped_byte_names_the_file(params, tmp_path):
    d = _save(params, tmp_path / "m")
    _flip(d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model directory .* is corrupt: file model\.safetensors does not match "
                                         r"its checksum"):
        weights.load(d)
    # verify=False reads it anyway (the flipped weight comes back silently: what the manifest is for)
    _, back = weights.load(d, verify=False)
    assert not _same(back, params)


def test_flipped_byte_in_one_shard_names_that_shard(params, tmp_path):
    d = _save(params, tmp_path / "m", max_shard_bytes=20_000)
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) >= 3
    manifest = json.loads((d / weights.MANIFEST_NAME).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors.index.json", *shards}
    _flip(d / shards[1])
    with pytest.raises(ValueError, match=rf"file {shards[1]} does not match its checksum"):
        weights.load(d)


def test_truncated_missing_and_unlisted_files_are_named(params, tmp_path):
    d = _save(params, tmp_path / "m")
    size = (d / "model.safetensors").stat().st_size
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ValueError, match=rf"file model\.safetensors has {size - 100} bytes but was saved with "
                                         rf"{size} \(truncated"):
        weights.load(d)
    d = _save(params, tmp_path / "m2")
    text = (d / "config.json").read_text()
    assert '"hidden_size": 32' in text
    (d / "config.json").write_text(text.replace('"hidden_size": 32', '"hidden_size": 16'))  # same length
    with pytest.raises(ValueError, match=r"file config\.json does not match its checksum"):
        weights.load(d)
    d = _save(params, tmp_path / "m3")
    safetensors_io.write_safetensors(str(d / "extra.safetensors"), {"x": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"file extra\.safetensors is not covered by its checksum manifest"):
        weights.load(d)
    os.remove(d / "extra.safetensors")
    os.remove(d / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights.load(d)


def test_directory_without_manifest_loads_as_before(params, tmp_path):
    d = _save(params, tmp_path / "m")
    os.remove(d / weights.MANIFEST_NAME)  # a Hugging Face directory has none
    cfg, back = weights.load(d)
    assert cfg == CFG and _same(back, params)


def test_resave_replaces_the_manifest(params, tmp_path):
    d = _save(params, tmp_path / "m")
    other = jax.tree.map(lambda x: x + 1.0, params)
    _save(other, d)
    _, back = weights.load(d)
    assert _same(back, other)


def test_manifest_that_is_not_json_is_an_error(params, tmp_path):
    d = _save(params, tmp_path / "m")
    (d / weights.MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match=r"checksum manifest .* is corrupt \(not JSON"):
        weights.load(d)


def _write_raw(path, header: dict, data: bytes):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.mark.parametrize("entry, message", [
    ({"dtype": "F32", "shape": [2]}, r"tensor 'w' lacks \['data_offsets'\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8]}, r"tensor 'w' has data_offsets \[8\]"),
    ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, r"tensor 'w' has shape \[-2\]"),
    ("F32", r"the entry of tensor 'w' is not an object"),
])
def test_malformed_safetensors_header_names_file_and_tensor(tmp_path, entry, message):
    path = tmp_path / "model.safetensors"
    _write_raw(path, {"w": entry}, b"\0" * 8)
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt safetensors header: " + message):
        safetensors_io.read_safetensors_header(str(path))
    _write_raw(path, [1, 2], b"")
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt safetensors header \(a JSON list"):
        safetensors_io.read_safetensors_header(str(path))


def test_header_without_data_offsets_through_load(params, tmp_path):
    d = _save(params, tmp_path / "m")
    os.remove(d / weights.MANIFEST_NAME)
    f = safetensors_io.SafetensorsFile(str(d / "model.safetensors"))
    header = {k: dict(v) for k, v in f.header.items()}
    data = (d / "model.safetensors").read_bytes()[f._base:]
    del f
    del header[UP0]["data_offsets"]
    _write_raw(d / "model.safetensors", header, data)
    with pytest.raises(ValueError, match=rf"model\.safetensors: corrupt safetensors header: tensor '{UP0}' lacks"):
        weights.load(d)


def test_non_finite_weights_are_named(params, tmp_path):
    bad = jax.tree.map(lambda x: x, params)
    bad["layers"][0]["mlp"]["up_proj"] = params["layers"][0]["mlp"]["up_proj"].at[3, 5].set(jnp.nan).at[0, 0].set(
        jnp.inf)
    d = _save(bad, tmp_path / "m")
    with pytest.raises(ValueError, match=rf"tensor '{UP0}' in .*model\.safetensors has 2 non-finite values"):
        weights.load(d)
    _, back = weights.load(d, check_finite=False)
    assert np.isnan(np.asarray(back["layers"][0]["mlp"]["up_proj"])[3, 5])
    # finite in the file, infinite after the cast: named too
    big = jax.tree.map(lambda x: x, params)
    big["norm"]["weight"] = params["norm"]["weight"].at[0].set(1e6)
    d = _save(big, tmp_path / "big")
    _, ok = weights.load(d)
    assert float(ok["norm"]["weight"][0]) == 1e6
    with pytest.raises(ValueError, match=r"tensor 'model\.norm\.weight' .* 1 non-finite .* cast to float16"):
        weights.load(d, dtype=jnp.float16)


# ---------------------------------------------------------------- a checkpoint is what it claims
def _hf_dir(params, d):
    """A saved model without its manifest, as a Hugging Face directory (edits are not checksum errors)."""
    _save(params, d)
    os.remove(d / weights.MANIFEST_NAME)
    return d


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, r"field hidden_act is 'gelu'; this Qwen3 computes SiLU"),
    ({"hidden_size": 10**30}, r"field hidden_size is 1000000000000000000000000000000; it must be an integer in "
                              r"\[1, 2147483647\]"),
    ({"num_hidden_layers": 2.5}, r"field num_hidden_layers is 2\.5; it must be an integer"),
    ({"rms_norm_eps": -1.0}, r"field rms_norm_eps is -1\.0; it must be a positive finite number"),
    ({"vocab_size": 2**31 - 1, "hidden_size": 2**31 - 1},
     r"Qwen3Config describes 4\.61e\+18 parameters, more than any model"),
])
def test_config_that_is_not_this_model_is_refused_naming_file_and_field(params, tmp_path, changes, message):
    d = _hf_dir(params, tmp_path / "m")
    _edit_config(d, **changes)
    for fn in (weights.load, weights.check_checkpoint):
        with pytest.raises(CheckpointError, match=rf"{tmp_path}/m/config\.json: {message}"):
            fn(d)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_non_float_weights_are_refused_not_cast(params, tmp_path, dtype):
    d = _hf_dir(params, tmp_path / "m")
    f = safetensors_io.SafetensorsFile(str(d / "model.safetensors"))
    tensors = {k: np.array(f.get(k)) for k in f.keys()}
    del f
    tensors[UP0] = np.ones(tensors[UP0].shape, dtype)
    safetensors_io.write_safetensors(str(d / "model.safetensors"), tensors)
    name = {np.int32: "I32", np.bool_: "BOOL"}[dtype]
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor '{UP0}' has dtype {name}; a Qwen3 "
                                              r"weight is floating point"):
        weights.load(d)


@pytest.mark.parametrize("offsets, data_bytes, message", [
    ({"a": [0, 8], "b": [4, 12]}, 12, r"tensor 'b' \(data_offsets 4\.\.12\) overlaps tensor 'a', which ends at 8"),
    ({"a": [0, 8], "b": [0, 8]}, 8, r"tensor '[ab]' \(data_offsets 0\.\.8\) overlaps tensor '[ab]'"),
    ({"a": [0, 8], "b": [16, 24]}, 24, r"tensor 'b' begins at 16 but the previous tensor \('a'\) ends at 8: 8 bytes "
                                       r"belong to no tensor"),
    ({"a": [8, 16], "b": [16, 24]}, 24, r"tensor 'a' begins at 8 but the previous tensor \(None\) ends at 0"),
    ({"a": [0, 8], "b": [8, 16]}, 24, r"the tensors end at byte 16 of the data but the file holds 24 bytes"),
])
def test_overlapping_or_gapped_data_offsets_are_refused(tmp_path, offsets, data_bytes, message):
    path = tmp_path / "model.safetensors"
    _write_raw(path, {k: {"dtype": "F32", "shape": [2], "data_offsets": v} for k, v in offsets.items()},
               b"\1" * data_bytes)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors header: " + message):
        safetensors_io.read_safetensors_header(str(path))


def test_overlapping_tensors_in_a_checkpoint_never_load_the_wrong_bytes(params, tmp_path):
    d = _hf_dir(params, tmp_path / "m")
    f = safetensors_io.SafetensorsFile(str(d / "model.safetensors"))
    header = {k: dict(v) for k, v in f.header.items()}
    data = (d / "model.safetensors").read_bytes()[f._base:]
    del f
    gate0 = "model.layers.0.mlp.gate_proj.weight"  # the same shape as up_proj: its bytes read as up_proj's
    header[UP0]["data_offsets"] = header[gate0]["data_offsets"]
    _write_raw(d / "model.safetensors", header, data)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors header: tensor .* overlaps"):
        weights.load(d)


def test_absurd_dimension_in_a_header_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    _write_raw(path, {"w": {"dtype": "F32", "shape": [10**30], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'w' is truncated or corrupt \(offsets "
                                              r"0\.\.8, shape \[1000000000000000000000000000000\]"):
        safetensors_io.read_safetensors_header(str(path))


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(params, tmp_path):
    d = _hf_dir(params, tmp_path / "m")  # CFG.vocab_size 64
    build_word_tokenizer([f"w{i}" for i in range(60)], d)  # 75 ids
    with pytest.raises(CheckpointError, match=rf"tokenizer at {d} has 75 ids but the model in {d} has vocab_size "
                                              r"64: ids 64\.\.74 have no embedding row"):
        run_dir.open_checkpoint(d)
    build_word_tokenizer([f"w{i}" for i in range(40)], d)  # 55 ids: fits
    cfg, tok = run_dir.open_checkpoint(d)
    assert cfg == CFG and tok.vocab_size == 55


def test_missing_checkpoint_is_one_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint directory '/nonexistent/x' does not exist"):
        run_dir.open_checkpoint("/nonexistent/x")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="does not exist"):
        run_dir.open_checkpoint(tmp_path / "f")
