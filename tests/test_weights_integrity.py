"""Saved models (`qwen3.save`): the checksum manifest names a flipped, truncated, missing or unlisted file;
directories without one (Hugging Face) load as before; malformed safetensors headers and non-finite
weights give errors naming the file and the tensor."""
import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config

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
    cfg, back = qwen3.load(d)
    assert cfg == CFG and _same(back, params)


def test_flipped_byte_names_the_file(params, tmp_path):
    d = _save(params, tmp_path / "m")
    _flip(d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model directory .* is corrupt: file model\.safetensors does not match "
                                         r"its checksum"):
        qwen3.load(d)
    # verify=False reads it anyway (the flipped weight comes back silently: what the manifest is for)
    _, back = qwen3.load(d, verify=False)
    assert not _same(back, params)


def test_flipped_byte_in_one_shard_names_that_shard(params, tmp_path):
    d = _save(params, tmp_path / "m", max_shard_bytes=20_000)
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) >= 3
    manifest = json.loads((d / weights.MANIFEST_NAME).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors.index.json", *shards}
    _flip(d / shards[1])
    with pytest.raises(ValueError, match=rf"file {shards[1]} does not match its checksum"):
        qwen3.load(d)


def test_truncated_missing_and_unlisted_files_are_named(params, tmp_path):
    d = _save(params, tmp_path / "m")
    size = (d / "model.safetensors").stat().st_size
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ValueError, match=rf"file model\.safetensors has {size - 100} bytes but was saved with "
                                         rf"{size} \(truncated"):
        qwen3.load(d)
    d = _save(params, tmp_path / "m2")
    text = (d / "config.json").read_text()
    assert '"hidden_size": 32' in text
    (d / "config.json").write_text(text.replace('"hidden_size": 32', '"hidden_size": 16'))  # same length
    with pytest.raises(ValueError, match=r"file config\.json does not match its checksum"):
        qwen3.load(d)
    d = _save(params, tmp_path / "m3")
    weights.write_safetensors(str(d / "extra.safetensors"), {"x": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"file extra\.safetensors is not covered by its checksum manifest"):
        qwen3.load(d)
    os.remove(d / "extra.safetensors")
    os.remove(d / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        qwen3.load(d)


def test_directory_without_manifest_loads_as_before(params, tmp_path):
    d = _save(params, tmp_path / "m")
    os.remove(d / weights.MANIFEST_NAME)  # a Hugging Face directory has none
    cfg, back = qwen3.load(d)
    assert cfg == CFG and _same(back, params)


def test_resave_replaces_the_manifest(params, tmp_path):
    d = _save(params, tmp_path / "m")
    other = jax.tree.map(lambda x: x + 1.0, params)
    _save(other, d)
    _, back = qwen3.load(d)
    assert _same(back, other)


def test_manifest_that_is_not_json_is_an_error(params, tmp_path):
    d = _save(params, tmp_path / "m")
    (d / weights.MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match=r"checksum manifest .* is corrupt \(not JSON"):
        qwen3.load(d)


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
        weights.read_safetensors_header(str(path))
    _write_raw(path, [1, 2], b"")
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt safetensors header \(a JSON list"):
        weights.read_safetensors_header(str(path))


def test_header_without_data_offsets_through_load(params, tmp_path):
    d = _save(params, tmp_path / "m")
    os.remove(d / weights.MANIFEST_NAME)
    f = weights.SafetensorsFile(str(d / "model.safetensors"))
    header = {k: dict(v) for k, v in f.header.items()}
    data = (d / "model.safetensors").read_bytes()[f._base:]
    del f
    del header[UP0]["data_offsets"]
    _write_raw(d / "model.safetensors", header, data)
    with pytest.raises(ValueError, match=rf"model\.safetensors: corrupt safetensors header: tensor '{UP0}' lacks"):
        qwen3.load(d)


def test_non_finite_weights_are_named(params, tmp_path):
    bad = jax.tree.map(lambda x: x, params)
    bad["layers"][0]["mlp"]["up_proj"] = params["layers"][0]["mlp"]["up_proj"].at[3, 5].set(jnp.nan).at[0, 0].set(
        jnp.inf)
    d = _save(bad, tmp_path / "m")
    with pytest.raises(ValueError, match=rf"tensor '{UP0}' in .*model\.safetensors has 2 non-finite values"):
        qwen3.load(d)
    _, back = qwen3.load(d, check_finite=False)
    assert np.isnan(np.asarray(back["layers"][0]["mlp"]["up_proj"])[3, 5])
    # finite in the file, infinite after the cast: named too
    big = jax.tree.map(lambda x: x, params)
    big["norm"]["weight"] = params["norm"]["weight"].at[0].set(1e6)
    d = _save(big, tmp_path / "big")
    _, ok = qwen3.load(d)
    assert float(ok["norm"]["weight"][0]) == 1e6
    with pytest.raises(ValueError, match=r"tensor 'model\.norm\.weight' .* 1 non-finite .* cast to float16"):
        qwen3.load(d, dtype=jnp.float16)
