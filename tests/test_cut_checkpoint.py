"""`weights.cut_layers` and `python -m experiments.cut_checkpoint`: a checkpoint written by transformers, cut to its
first layers, loads as the same model with fewer layers (every kept tensor bit for bit, in its file dtype), keeps its
other files, verifies against a fresh manifest, and its logits equal transformers' own model truncated to those
layers; bad requests end in one line."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import qwen3, weights
from tests.hf_reference import make_hf_qwen3


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "full"
    model = make_hf_qwen3(str(path), layers=3)
    (path / "tokenizer_config.json").write_text('{"chat_template": "x"}')
    return path, model


def test_the_cut_keeps_the_first_layers_bit_for_bit(full, tmp_path):
    src, _ = full
    cfg = weights.cut_layers(src, tmp_path / "cut", 2)
    assert cfg.num_hidden_layers == 2
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["num_hidden_layers"] == 2
    assert (tmp_path / "cut" / "tokenizer_config.json").read_text() == '{"chat_template": "x"}'
    assert weights.verify_manifest(str(tmp_path / "cut"), required=["config.json", "model.safetensors"])
    _, p_full = weights.load(src)
    _, p_cut = weights.load(tmp_path / "cut")  # its manifest verified, every tensor checked against the config
    assert sorted(p_cut["layers"]) == [0, 1]
    kept = {"embed": p_full["embed"], "norm": p_full["norm"], "layers": {i: p_full["layers"][i] for i in (0, 1)}}
    assert jax.tree.structure(p_cut) == jax.tree.structure(kept)
    for a, b in zip(jax.tree.leaves(p_cut), jax.tree.leaves(kept)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_cut_model_is_transformers_model_with_those_layers(full, tmp_path):
    import torch
    src, model = full
    cfg = weights.cut_layers(src, tmp_path / "cut", 1)
    _, params = weights.load(tmp_path / "cut")
    tokens = np.array([[3, 17, 42, 5, 8, 99]], np.int64)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    with torch.no_grad():
        want = model(torch.as_tensor(tokens)).logits.numpy()
    got, _ = qwen3.forward(params, cfg, jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_bad_requests_end_in_one_line(full, tmp_path):
    src, _ = full
    for layers in ("0", "4"):
        r = subprocess.run([sys.executable, "-m", "experiments.cut_checkpoint", str(src), str(tmp_path / "x"),
                            "--layers", layers], capture_output=True, text=True)
        want = f"error: n_layers must lie in [1, 3] (the layers of {str(src)!r}), got {layers}"
        assert r.returncode == 2 and r.stderr.strip() == want
    (tmp_path / "there").mkdir()
    with pytest.raises(FileExistsError):
        weights.cut_layers(src, tmp_path / "there", 1)
    r = subprocess.run([sys.executable, "-m", "experiments.cut_checkpoint", str(src), str(tmp_path / "y"),
                        "--layers", "1"], capture_output=True, text=True)
    assert r.returncode == 0 and "1 of the checkpoint's layers" in r.stdout
