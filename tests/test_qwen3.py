"""Qwen3 parity with transformers' PyTorch Qwen3ForCausalLM, checkpoints in/out, cache and bad inputs."""
import functools
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import ops, ops_cpu, qwen3, safetensors_io, weights
from jaxagent.models.config import Qwen3Config
from tests.hf_reference import hf_logits, make_hf_qwen3

TOL = 1e-4  # HF parity (PyTorch vs XLA f32, logits of magnitude ~1); same-model comparisons use `_f32_tol`


def _f32_tol(ref, terms: int) -> float:
    """A bound for f32 rounding differences (summation order, fused multiply-adds) between two ways of
    computing `ref`: a few ulps per sqrt(reduction length), scaled by the values' magnitude."""
    return 16 * float(np.finfo(np.float32).eps) * np.sqrt(terms) * max(1.0, float(np.abs(np.asarray(ref)).max()))


@pytest.fixture(scope="module", params=["tied", "untied"])
def ckpt(request, tmp_path_factory):
    tie = request.param == "tied"
    d = str(tmp_path_factory.mktemp(f"hf_{request.param}"))
    model = make_hf_qwen3(d, tie=tie, seed=1 if tie else 2, rope_theta=12345.0 if tie else 777.0)
    cfg, params = weights.load(d)
    return d, model, cfg, params


@functools.partial(jax.jit, static_argnums=(1,))
def fwd_cached(params, cfg, toks, cache, n_valid=None):
    return qwen3.forward(params, cfg, toks, cache=cache, n_valid=n_valid)


@pytest.fixture(scope="module")
def fwd():
    return jax.jit(lambda p, t, cfg, pos=None, m=None: qwen3.forward(p, cfg, t, positions=pos, attention_mask=m)[0],
                   static_argnums=(2,))


def test_config_read(ckpt):
    d, model, cfg, _ = ckpt
    assert cfg.tie_word_embeddings == model.config.tie_word_embeddings
    assert cfg.rope_theta in (12345.0, 777.0)
    assert cfg.num_key_value_heads == 2 and cfg.num_attention_heads == 4


@pytest.mark.parametrize("seq", [1, 7, 13])
def test_logits_match_transformers(ckpt, fwd, seq):
    _check_logits_match_transformers(ckpt, fwd, seq)


@pytest.mark.parametrize("seam", ["accelerator"], indirect=True)
def test_logits_match_transformers_with_accelerator_branches(ckpt, fwd, seam):
    """One token (decode-shaped attention: dot_general scores and p.V, RoPE tables without the CPU's
    conditional), as GPUs and TPUs compile it, run on CPU."""
    _check_logits_match_transformers(ckpt, fwd, 1)


def _check_logits_match_transformers(ckpt, fwd, seq):
    _, model, cfg, params = ckpt
    toks = np.random.default_rng(seq).integers(0, cfg.vocab_size, (2, seq))
    ours = np.asarray(fwd(params, jnp.asarray(toks), cfg))
    ref = hf_logits(model, toks)
    assert np.abs(ours - ref).max() < TOL


def test_batched_left_padding_matches_transformers(ckpt, fwd):
    _, model, cfg, params = ckpt
    rng = np.random.default_rng(0)
    toks = rng.integers(0, cfg.vocab_size, (3, 9))
    mask = np.ones_like(toks)
    mask[0, :3] = 0
    mask[1, :5] = 0
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    ours = np.asarray(fwd(params, jnp.asarray(toks), cfg, jnp.asarray(pos), jnp.asarray(mask)))
    ref = hf_logits(model, toks, attention_mask=mask, position_ids=pos)
    valid = mask.astype(bool)
    assert np.abs(ours[valid] - ref[valid]).max() < TOL
    # and each padded row equals the same sequence run alone
    for b in range(3):
        alone = np.asarray(fwd(params, jnp.asarray(toks[b:b + 1, valid[b]]), cfg))
        assert np.abs(alone[0] - ours[b, valid[b]]).max() < TOL


def test_long_causal_forward_matches_transformers_and_both_branches(ckpt, fwd):
    """Sequences longer than `ops.CAUSAL_BLOCK` (a CPU program's queries in blocks, each over the keys up to its
    block's end), left-padded: the logits equal PyTorch's, and the loss gradient equals the dense branch's
    (the one GPUs and TPUs lower), run here on CPU."""
    from tests.conftest import seam_mode
    _, model, cfg, params = ckpt
    t = 2 * ops.CAUSAL_BLOCK + 37
    rng = np.random.default_rng(5)
    toks = rng.integers(0, cfg.vocab_size, (2, t))
    mask = np.ones_like(toks)
    mask[1, :50] = 0
    pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    args = (jnp.asarray(toks), cfg, jnp.asarray(pos), jnp.asarray(mask))
    ours = np.asarray(fwd(params, *args))
    ref = hf_logits(model, toks, attention_mask=mask, position_ids=pos)
    valid = mask.astype(bool)
    assert np.abs(ours[valid] - ref[valid]).max() < TOL
    r = jnp.asarray(rng.normal(size=ours.shape).astype(np.float32) * valid[..., None])
    grad = jax.jit(jax.grad(lambda p: jnp.sum(qwen3.forward(p, cfg, args[0], positions=args[2],
                                                            attention_mask=args[3])[0] * r)))
    blocked = grad(params)
    with seam_mode("accelerator"):
        dense = jax.jit(jax.grad(lambda p: jnp.sum(qwen3.forward(p, cfg, args[0], positions=args[2],
                                                                 attention_mask=args[3])[0] * r)))(params)
    for g, d in zip(jax.tree.leaves(blocked), jax.tree.leaves(dense)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(d), rtol=1e-4, atol=1e-5 * float(np.abs(d).max()))


def test_save_then_transformers_load(ckpt, tmp_path):
    from transformers import Qwen3ForCausalLM
    _, _, cfg, params = ckpt
    weights.save(tmp_path, cfg, params)
    model = Qwen3ForCausalLM.from_pretrained(str(tmp_path)).eval()
    toks = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 11))
    ours = np.asarray(qwen3.forward(params, cfg, jnp.asarray(toks))[0])
    assert np.abs(ours - hf_logits(model, toks)).max() < TOL
    cfg2, params2 = weights.load(tmp_path)
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_sharded_save_with_index(ckpt, tmp_path):
    _, _, cfg, params = ckpt
    weights.save(tmp_path, cfg, params, max_shard_bytes=20_000)
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    _, params2 = weights.load(tmp_path)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_legacy_rope_theta_key(tmp_path):
    make_hf_qwen3(str(tmp_path), legacy_rope_key=True, rope_theta=4321.0, layers=1)
    cfg, _ = weights.load(tmp_path)
    assert cfg.rope_theta == 4321.0


@pytest.mark.parametrize("seam", ["kernels", "accelerator"], indirect=True)
def test_cached_incremental_equals_full(ckpt, fwd, seam):
    """Prefill and decode through the cache equal the cache-free forward, with this host's CPU program
    (kernels) and with the XLA branches GPUs and TPUs compile (dot_general attention), run on CPU."""
    _, _, cfg, params = ckpt
    toks = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 12))
    full = np.asarray(fwd(params, jnp.asarray(toks), cfg))
    cache = qwen3.init_cache(cfg, 2, 32)
    outs = []
    for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 12)]:
        lg, cache = fwd_cached(params, cfg, jnp.asarray(toks[:, lo:hi]), cache)
        outs.append(np.asarray(lg))
    assert np.abs(np.concatenate(outs, 1) - full).max() < TOL
    assert np.asarray(cache["length"]).tolist() == [12, 12]


@pytest.mark.parametrize("seam,slots,window,n", [
    ("cpu_xla", 21, None, 20), ("cpu_xla", 37, 19, 19), ("cpu_xla", 600, None, 18),
    ("kernels", 37, 19, 19), ("accelerator", 37, 19, 19)], indirect=["seam"])
def test_decode_steps_with_partial_reduction_blocks(ckpt, fwd, seam, slots, window, n):
    """One-token steps equal the full forward. cpu_xla (kernels off): XLA:CPU's decode attention as
    blocked multiply-adds over 16 slots (`ops_cpu.sum_products`), on caches and windows whose size is not a
    multiple of 16 (n > 16: the last block holds live slots); 600 slots: past `ops_cpu.SUM_MAX_SLOTS`, p.V is
    a dot_general. kernels: the fused CPU attention kernel. accelerator: dot_general scores and p.V."""
    _, _, cfg, params = ckpt
    toks = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, n))
    full = np.asarray(fwd(params, jnp.asarray(toks), cfg))
    step = jax.jit(lambda p, t, c: qwen3.forward(p, cfg, t, cache=c, kv_window=window))
    cache = qwen3.init_cache(cfg, 2, slots)
    # the path the docstring names is the one compiled: batched dot_generals (attention's scores and p.V; the
    # projections are plain dots) and custom calls (the CPU kernels) in the program XLA built for this step
    hlo = step.lower(params, jnp.asarray(toks[:, :1]), cache).compile().as_text().splitlines()
    batched = sum(bool(re.search(r"\bdot\(", x)) and "lhs_batch_dims={0,1}" in x for x in hlo)
    kernel_calls = sum("custom-call(" in x for x in hlo)
    layers = cfg.num_hidden_layers
    if seam == "cpu_xla":  # scores always multiply-adds; p.V too up to SUM_MAX_SLOTS slots, a dot past it
        assert kernel_calls == 0 and batched == (layers if slots > ops_cpu.SUM_MAX_SLOTS else 0), (slots, batched)
    elif seam == "accelerator":
        assert kernel_calls == 0 and batched == 2 * layers
    elif ops_cpu.kernels_built():  # the fused attention kernel in every layer, no XLA attention
        assert kernel_calls >= layers and batched == 0
    outs = []
    for i in range(toks.shape[1]):
        lg, cache = step(params, jnp.asarray(toks[:, i:i + 1]), cache)
        outs.append(np.asarray(lg))
    assert np.abs(np.concatenate(outs, 1) - full).max() < TOL


@pytest.mark.parametrize("seam", ["kernels", "accelerator"], indirect=True)
def test_ragged_appends_per_row(ckpt, fwd, seam):
    """Rows advance by different amounts (n_valid) and still match their own full forward."""
    _, _, cfg, params = ckpt
    rng = np.random.default_rng(4)
    seqs = [rng.integers(0, cfg.vocab_size, n) for n in (10, 6)]
    cache = qwen3.init_cache(cfg, 2, 32)
    chunks = [(4, 2), (1, 0), (5, 4)]  # tokens appended per row at each call
    pos = [0, 0]
    last = [None, None]
    for n0, n1 in chunks:
        width = max(n0, n1, 1)
        block = np.zeros((2, width), np.int64)
        for b, n in enumerate((n0, n1)):
            block[b, :n] = seqs[b][pos[b]:pos[b] + n]
        lg, cache = fwd_cached(params, cfg, jnp.asarray(block), cache, jnp.asarray([n0, n1]))
        for b, n in enumerate((n0, n1)):
            if n:
                last[b] = np.asarray(lg[b, n - 1])
            pos[b] += n
    for b in range(2):
        full = np.asarray(fwd(params, jnp.asarray(seqs[b][None, :pos[b]]), cfg))[0, -1]
        assert np.abs(full - last[b]).max() < TOL
    assert np.asarray(cache["length"]).tolist() == pos


def test_logits_index_equals_full_logits_and_cache(ckpt):
    """With `logits_index` the last layer runs queries and MLP for one token per row only: the logits
    equal the full forward's at that index, and the cache (every layer's keys and values) is the same."""
    _, _, cfg, params = ckpt
    rng = np.random.default_rng(5)
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 7)))
    idx = jnp.asarray([6, 0, 3])
    full, _ = qwen3.forward(params, cfg, toks)
    one, _ = qwen3.forward(params, cfg, toks, logits_index=idx)
    np.testing.assert_allclose(np.asarray(one)[:, 0], np.asarray(full)[np.arange(3), np.asarray(idx)], atol=TOL)
    cache = qwen3.init_cache(cfg, 3, 16)
    cache = qwen3.forward(params, cfg, toks[:, :2], cache=cache)[1]  # some history first
    n = jnp.asarray([5, 1, 3])
    full, c_full = qwen3.forward(params, cfg, toks[:, 2:], cache=cache, n_valid=n)
    one, c_one = qwen3.forward(params, cfg, toks[:, 2:], cache=cache, n_valid=n, logits_index=n - 1)
    np.testing.assert_allclose(np.asarray(one)[:, 0], np.asarray(full)[np.arange(3), np.asarray(n) - 1], atol=TOL)
    for a, b in zip(jax.tree.leaves(c_full), jax.tree.leaves(c_one)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=_f32_tol(b, cfg.hidden_size))


def test_bf16_runs_close(ckpt):
    d, _, cfg, params = ckpt
    _, p16 = weights.load(d, dtype=jnp.bfloat16)
    assert jax.tree.leaves(p16)[0].dtype == jnp.bfloat16
    toks = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 8)))
    a = np.asarray(qwen3.forward(params, cfg, toks)[0])
    b = np.asarray(qwen3.forward(p16, cfg, toks)[0])
    assert b.dtype == np.float32 and np.isfinite(b).all()
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.1


def test_gradients_match_transformers(ckpt, tmp_path):
    """d/dparams of sum(logits * R) equals PyTorch autograd's on the same weights (the hand-written
    projection backward included), compared tensor by tensor under the checkpoint's names."""
    import torch
    from safetensors.numpy import load_file

    d, model, cfg, params = ckpt
    rng = np.random.default_rng(3)
    toks = rng.integers(0, cfg.vocab_size, (2, 9))
    r = rng.normal(size=(2, 9, cfg.vocab_size)).astype(np.float32)
    grads = jax.grad(lambda p: jnp.sum(qwen3.forward(p, cfg, jnp.asarray(toks))[0] * r))(params)
    weights.save(str(tmp_path), cfg, grads)
    ours = {}
    for f in sorted(os.listdir(tmp_path)):
        if f.endswith(".safetensors"):
            ours.update(load_file(os.path.join(tmp_path, f)))
    model.zero_grad()
    (model(torch.tensor(toks)).logits * torch.tensor(r)).sum().backward()
    named = dict(model.named_parameters())
    assert set(ours) == set(named)
    for name, p in named.items():
        want = p.grad.numpy()
        np.testing.assert_allclose(ours[name], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name)
    model.zero_grad()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_backward_equals_autodiff(dtype):
    """`dense` / `dense_transposed` (hand-written GEMM backward) give autodiff's gradients of the einsum,
    in the inputs' dtypes, for multi-axis weights and for an f32 output from bf16 inputs."""
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (2, 5, 6)).astype(dtype)
    w = jax.random.normal(k[1], (6, 3, 4)).astype(dtype)
    e = jax.random.normal(k[2], (7, 6)).astype(dtype)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2

    def check(ours, ref, *args):
        got, want = jax.grad(ours, argnums=(0, 1))(*args), jax.grad(ref, argnums=(0, 1))(*args)
        for g, r, a in zip(got, want, args):
            assert g.dtype == a.dtype and g.shape == a.shape
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=tol,
                                       atol=tol * float(jnp.max(jnp.abs(r.astype(jnp.float32)))))

    loss = lambda y: jnp.sum(jnp.sin(y.astype(jnp.float32)))  # noqa: E731
    check(lambda x, w: loss(ops.dense(x, w)), lambda x, w: loss(jnp.einsum("btd,dhe->bthe", x, w)), x, w)
    check(lambda x, w: loss(ops.dense(x, w, jnp.float32)),
          lambda x, w: loss(jnp.einsum("btd,dhe->bthe", x, w, preferred_element_type=jnp.float32)), x, w)
    check(lambda x, e: loss(ops.dense_transposed(x, e, jnp.float32)),
          lambda x, e: loss(jnp.einsum("btd,vd->btv", x, e, preferred_element_type=jnp.float32)), x, e)
    assert ops.dense(x, w).shape == (2, 5, 3, 4) and ops.dense_transposed(x, e).shape == (2, 5, 7)


def test_init_matches_logical_axes():
    cfg = Qwen3Config(tie_word_embeddings=False)
    params = qwen3.init(cfg, jax.random.key(0))
    axes = qwen3.logical_axes(cfg)
    flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_a = dict(jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))[0])
    assert len(flat_p) == len(flat_a)
    for path, x in flat_p:
        assert len(flat_a[path]) == x.ndim, path
    n = sum(x.size for _, x in flat_p)
    assert n == cfg.num_params()


# ---------------------------------------------------------------- bad checkpoints
@pytest.fixture
def good_dir(tmp_path):
    make_hf_qwen3(str(tmp_path / "ok"), layers=1, tie=False)
    return tmp_path / "ok"


def _rewrite(d, fn):
    f = safetensors_io.SafetensorsFile(str(d / "model.safetensors"))
    tensors = {k: np.array(f.get(k)) for k in f.keys()}
    del f
    fn(tensors)
    safetensors_io.write_safetensors(str(d / "model.safetensors"), tensors)


def test_missing_tensor_is_named(good_dir):
    _rewrite(good_dir, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks tensors.*model\.layers\.0\.mlp\.up_proj\.weight"):
        weights.load(good_dir)


def test_unexpected_tensor_is_named(good_dir):
    _rewrite(good_dir, lambda t: t.__setitem__("model.layers.7.mlp.up_proj.weight", np.zeros((2, 2), np.float32)))
    with pytest.raises(ValueError, match=r"does not expect.*model\.layers\.7"):
        weights.load(good_dir)


def test_wrong_shape_names_both_shapes(good_dir):
    _rewrite(good_dir, lambda t: t.__setitem__("model.norm.weight", np.zeros((5,), np.float32)))
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*\(5,\).*\(48,\)"):
        weights.load(good_dir)


def test_config_shape_mismatch(good_dir):
    cfg_path = good_dir / "config.json"
    hf = json.loads(cfg_path.read_text())
    hf["intermediate_size"] = 64
    cfg_path.write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"gate_proj\.weight.*\(96, 48\).*\(48, 64\)"):
        weights.load(good_dir)


def test_missing_config_and_files(good_dir, tmp_path):
    os.remove(good_dir / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        weights.load(good_dir)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        weights.load(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(Qwen3Config().to_hf_dict()))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights.load(empty)


def test_corrupt_safetensors(good_dir):
    path = good_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt|corrupt"):
        weights.load(good_dir)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="corrupt|not a safetensors"):
        weights.load(good_dir)


def test_bad_config_values():
    with pytest.raises(ValueError, match="multiple"):
        Qwen3Config(num_attention_heads=3, num_key_value_heads=2)
    with pytest.raises(ValueError, match="positive"):
        Qwen3Config(hidden_size=0)
    with pytest.raises(ValueError, match="model_type"):
        Qwen3Config.from_hf_dict({"model_type": "llama"})


def test_remat_policies_keep_values_and_gradients():
    """Per-block `jax.checkpoint` (remat=...) changes what the backward keeps, not what it computes."""
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 7), 0, cfg.vocab_size)
    r = jax.random.normal(jax.random.key(2), (2, 7, cfg.vocab_size))

    def loss_and_grad(remat):
        return jax.jit(jax.value_and_grad(lambda p: jnp.sum(qwen3.forward(p, cfg, toks, remat=remat)[0] * r)))(params)

    want_loss, want = loss_and_grad(None)
    assert set(qwen3.REMAT_POLICIES) == {"full", "dots", "dots_no_batch"}
    for policy in ("full", "dots_no_batch"):  # nothing saved; the projections saved (attention recomputed)
        got_loss, got = loss_and_grad(policy)
        np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=_f32_tol(w, 2 * 7 * cfg.vocab_size))
    jaxpr = str(jax.make_jaxpr(lambda p: qwen3.hidden_states(p, cfg, toks, remat="full")[0])(params))
    assert jaxpr.count("remat2[") == cfg.num_hidden_layers  # one checkpoint per block
    with pytest.raises(ValueError, match="remat"):
        qwen3.forward(params, cfg, toks, remat="everything")
