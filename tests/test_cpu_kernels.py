"""The compiled CPU kernels (jaxagent.kernels.cpu) against numpy and the XLA paths they replace."""
import functools
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.kernels import cpu
from jaxagent.models import ops, qwen3
from jaxagent.models.config import Qwen3Config

needs_kernels = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")


def _cfg(h, kv, e, **kw):
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=h, num_key_value_heads=kv, head_dim=e)
    return Qwen3Config(**{**base, **kw})


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None or jax.default_backend() != "cpu",
                    reason="no C++ compiler or not on CPU")
def test_kernels_build_where_a_compiler_exists():
    # CI has g++: the kernels must build there, or every other test here would silently run the XLA path.
    if os.environ.get("JAXAGENT_CPU_KERNELS") == "0":
        pytest.skip("the suite runs with the kernels disabled on purpose (JAXAGENT_CPU_KERNELS=0)")
    assert cpu.available(), cpu.unavailable_reason()


def _valid_rows(n_valid, t):
    return np.arange(t)[None, :] < np.clip(np.asarray(n_valid), 0, t)[:, None]  # [B, T]


@needs_kernels
@pytest.mark.parametrize("b,t,k,n", [(1, 1, 1, 1), (16, 1, 384, 1024), (5, 1, 7, 40), (7, 1, 33, 102),
                                     (13, 1, 64, 16), (64, 1, 128, 250), (3, 1, 5, 15),
                                     (64, 43, 128, 256),  # an append: chunks of 96 rows over all panels
                                     (9, 31, 20, 37)])    # row tails in every chunk, a partial panel
def test_rows_matmul_matches_numpy(b, t, k, n):
    rng = np.random.default_rng(b * 1000 + n)
    x = rng.standard_normal((b, t, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    n_valid = rng.integers(-1, t + 2, b).astype(np.int32)  # incl. 0, negative (-> 0) and > T (-> T)
    n_valid[0] = t
    got = np.asarray(jax.jit(lambda x, nv, w: cpu.rows_matmul(x, nv, cpu.pack_panels(w), w.shape[1]))(x, n_valid, w))
    valid = _valid_rows(n_valid, t)
    np.testing.assert_allclose(got[valid], (x.astype(np.float64) @ w)[valid], rtol=1e-5, atol=1e-4 * np.sqrt(k))
    assert (got[~valid] == 0).all()


@needs_kernels
@pytest.mark.parametrize("b,t,d,f", [(64, 43, 128, 384),  # the rollout's appends at the 1M shape
                                     (3, 7, 40, 24),      # F = 24: gate and up panels straddle
                                     (2, 50, 64, 1024),   # chunks of 18 rows (the intermediate within L2)
                                     (4, 2, 16, 8)])      # fewer rows than one tile
def test_mlp_matches_xla(b, t, d, f):
    rng = np.random.default_rng(b + t + d + f)
    x = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
    gate, up, down = (jnp.asarray(rng.standard_normal(s) * 0.3, jnp.float32) for s in ((d, f), (d, f), (f, d)))
    n_valid = rng.integers(0, t + 1, b).astype(np.int32)
    n_valid[0] = t
    got = np.asarray(jax.jit(lambda x, nv: cpu.mlp(x, nv, cpu.pack_panels(gate, up), cpu.pack_panels(down)))(x, n_valid))
    want = np.asarray((jax.nn.silu(x @ gate) * (x @ up)) @ down)
    valid = _valid_rows(n_valid, t)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (got[~valid] == 0).all()


@needs_kernels
def test_pack_panels_layout_and_concatenation():
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((7, n)).astype(np.float32) for n in (20, 5, 16))  # panels straddle a and b
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu.pack_panels)(a)), cpu.pack_panels_reference(a))
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu.pack_panels)(a, b, c)),
                                  cpu.pack_panels_reference(np.concatenate([a, b, c], axis=1)))
    with pytest.raises(ValueError, match="one K"):
        cpu.pack_panels(a, rng.standard_normal((6, 3)).astype(np.float32))


@needs_kernels
@pytest.mark.parametrize("b,t,h,kv,e", [(64, 43, 4, 2, 32), (3, 5, 6, 3, 8), (2, 1, 16, 8, 128)])
def test_norm_rope_matches_the_model(b, t, h, kv, e):
    rng = np.random.default_rng(b + t + e)
    qkv = jnp.asarray(rng.standard_normal((b, t, h + 2 * kv, e)) * 3, jnp.float32)
    wq, wk = (jnp.asarray(rng.standard_normal(e), jnp.float32) for _ in range(2))
    positions = jnp.asarray(rng.integers(0, 500, (b, t)), jnp.int32)
    cos, sin = ops.rope_tables(positions, e, 1e6)  # [B, T, 1, E]
    n_valid = rng.integers(0, t + 1, b).astype(np.int32)
    n_valid[0] = t
    got_q, got_k = jax.jit(lambda *a: cpu.norm_rope(*a, 1e-6, h))(qkv, n_valid, wq, wk, cos[:, :, 0], sin[:, :, 0])
    want_q = ops.rope(ops.rms_norm(qkv[:, :, :h], wq, 1e-6), (cos, sin))
    want_k = ops.rope(ops.rms_norm(qkv[:, :, h:h + kv], wk, 1e-6), (cos, sin))
    valid = _valid_rows(n_valid, t)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)
        assert (got[~valid] == 0).all()


@needs_kernels
def test_kernels_reject_mismatched_operands():
    x = jnp.ones((2, 3, 8))
    with pytest.raises(ValueError, match="rows_matmul"):
        cpu.rows_matmul(x, jnp.ones((2,), jnp.int32), cpu.pack_panels(jnp.ones((9, 16))), 16)
    with pytest.raises(ValueError, match="rows_matmul"):
        cpu.rows_matmul(x, jnp.ones((3,), jnp.int32), cpu.pack_panels(jnp.ones((8, 16))), 16)
    with pytest.raises(ValueError, match="mlp"):
        cpu.mlp(x, jnp.ones((2,), jnp.int32), cpu.pack_panels(jnp.ones((8, 12))), cpu.pack_panels(jnp.ones((12, 8))))
    with pytest.raises(ValueError, match="norm_rope"):  # 6 heads cannot split into 3 query heads + k + v
        cpu.norm_rope(jnp.ones((2, 3, 6, 8)), jnp.ones((2,), jnp.int32), jnp.ones(8), jnp.ones(8),
                      jnp.ones((2, 3, 8)), jnp.ones((2, 3, 8)), 1e-6, 3)


def _attention_case(rng, b, t, h, kv, e, s, causal):
    q = rng.standard_normal((b, t, h, e)).astype(np.float32)
    kt = rng.standard_normal((b, kv, e, s)).astype(np.float32)
    v = rng.standard_normal((b, kv, s, e)).astype(np.float32)
    if causal:  # what the model builds: slot <= position, rows at different lengths
        pos = rng.integers(0, s - t + 1, b)[:, None] + np.arange(t)
        mask = np.arange(s)[None, None, :] <= pos[:, :, None]
    else:
        mask = rng.random((b, t, s)) < 0.6
    mask[0, t // 2] = False  # a row with every key masked: uniform weights, as in the XLA path
    return q, kt, v, mask


@needs_kernels
@pytest.mark.parametrize("b,t,h,kv,e,s,window,causal", [
    (3, 1, 8, 2, 64, 40, None, True),     # decode, GQA 4
    (3, 1, 8, 2, 64, 40, 21, False),      # a window shorter than the cache
    (4, 43, 4, 2, 32, 130, 96, True),     # an append: many rows per KV head, blocks of 6 rows and 16 slots
    (2, 5, 6, 3, 24, 37, 37, False),      # head_dim 24: three 8-lane column groups; 37 slots: partial blocks
    (2, 3, 2, 1, 8, 5, None, True),       # smaller than one block everywhere
    (2, 9, 4, 1, 128, 150, None, True),   # head_dim 128: value chunks of 32 slots, accumulated; 150 slots
    (1, 25, 1, 1, 16, 300, 290, False),   # groups of 6, 6, 6, 6, 1 rows; two value chunks of 256 slots
    (2, 53, 2, 2, 40, 112, 100, True),    # blocks of 48 + 5 rows; head_dim 40: 16 + 16 + 8 columns
])
def test_attention_matches_xla(b, t, h, kv, e, s, window, causal):
    cfg = _cfg(h, kv, e)
    q, kt, v, mask = _attention_case(np.random.default_rng(b * 100 + t), b, t, h, kv, e, s, causal)
    w = s if window is None else window
    want = ops.attention(cfg, q, kt, v, mask, window=window)
    reference = functools.partial(ops.attention, cfg)
    got = jax.jit(lambda *a: cpu.attention(*a, reference))(q, kt, v, mask, w)  # the window traced
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6)


@needs_kernels
def test_attention_window_out_of_range_is_an_error():
    cfg = _cfg(4, 2, 16)
    q, kt, v, mask = _attention_case(np.random.default_rng(0), 2, 1, 4, 2, 16, 24, True)
    f = jax.jit(lambda w: cpu.attention(q, kt, v, mask, w, functools.partial(ops.attention, cfg)))
    for bad in (0, 25):
        with pytest.raises(Exception, match="window"):
            jax.block_until_ready(f(bad))


@needs_kernels
def test_attention_gradient_is_the_xla_paths():
    cfg = _cfg(4, 2, 16)
    q, kt, v, mask = _attention_case(np.random.default_rng(0), 2, 3, 4, 2, 16, 24, True)
    reference = functools.partial(ops.attention, cfg)
    loss = lambda f: lambda q, kt, v: jnp.sum(jnp.sin(f(q, kt, v, mask)))
    want = jax.grad(loss(functools.partial(ops.attention, cfg, window=20)), argnums=(0, 1, 2))(q, kt, v)
    got = jax.jit(jax.grad(loss(lambda *a: cpu.attention(*a, 20, reference)), argnums=(0, 1, 2)))(q, kt, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                                   atol=1e-5 * float(np.abs(np.asarray(w)).max()))


@needs_kernels
def test_attention_under_vmap():
    cfg = _cfg(4, 2, 16)
    rng = np.random.default_rng(1)
    cases = [_attention_case(rng, 2, 3, 4, 2, 16, 24, True) for _ in range(3)]
    q, kt, v, mask = (np.stack(parts) for parts in zip(*cases))
    reference = functools.partial(ops.attention, cfg)
    got = jax.jit(jax.vmap(lambda *a: cpu.attention(*a, 24, reference)))(q, kt, v, mask)
    want = jax.vmap(reference)(q, kt, v, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6)


@needs_kernels
def test_attention_skips_padded_queries():
    cfg = _cfg(4, 2, 16)
    q, kt, v, mask = _attention_case(np.random.default_rng(3), 4, 9, 4, 2, 16, 40, True)
    n_valid = jnp.array([9, 0, 4, 1], jnp.int32)
    reference = functools.partial(ops.attention, cfg)
    got = np.asarray(jax.jit(lambda *a: cpu.attention(*a, reference, n_valid))(q, kt, v, mask, 40))
    want = np.asarray(reference(q, kt, v, mask))
    valid = _valid_rows(n_valid, 9)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=2e-6)
    assert (got[~valid] == 0).all()
    # the padded queries' outputs are constants (0): no gradient flows into them
    loss = lambda f: lambda q: jnp.sum(jnp.sin(f(q)))
    g = jax.grad(loss(lambda q: cpu.attention(q, kt, v, mask, 40, reference, n_valid)))(q)
    g_ref = jax.grad(loss(lambda q: jnp.where(valid[:, :, None, None], reference(q, kt, v, mask), 0.0)))(q)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5,
                               atol=1e-5 * float(np.abs(np.asarray(g_ref)).max()))


@needs_kernels
@pytest.mark.parametrize("tied", [True, False])
def test_prepared_forward_equals_unprepared(tied):
    cfg = _cfg(4, 2, 16, tie_word_embeddings=tied, intermediate_size=40)  # 40: a partial panel
    params = qwen3.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (5, 9), 0, cfg.vocab_size)
    _, cache = qwen3.forward(params, cfg, tokens, cache=qwen3.init_cache(cfg, 5, 24))
    prepared = ops.prepare(params, cfg)
    assert ops.PREPARED in prepared
    step = jax.jit(lambda p, c, t: qwen3.forward(p, cfg, t, cache=c))
    want, want_cache = step(params, cache, tokens[:, :1])
    got, got_cache = step(prepared, cache, tokens[:, :1])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_cache["k"][1]), np.asarray(want_cache["k"][1]), rtol=1e-5, atol=1e-5)
    # a right-padded append (rows of 7, 0, 3, 1 and 5 real tokens) with the logits of each row's last
    # real token: the kernels compute only the real tokens; what they write must equal the XLA path
    n_valid = jnp.array([7, 0, 3, 1, 5], jnp.int32)
    append = jax.jit(lambda p, c, t: qwen3.forward(p, cfg, t, cache=c, n_valid=n_valid,
                                                   logits_index=jnp.maximum(n_valid - 1, 0)))
    want, want_cache = append(params, cache, tokens[:, :7])
    got, got_cache = append(prepared, cache, tokens[:, :7])
    live = np.asarray(n_valid) > 0
    np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got_cache["length"]), np.asarray(want_cache["length"]))
    slots = np.arange(24)[None, :] < np.asarray(want_cache["length"])[:, None]  # [B, S]: written and real
    for layer in range(cfg.num_hidden_layers):
        for name, s_axis in (("k", 3), ("v", 2)):
            g, w = (np.moveaxis(np.asarray(c[name][layer]), s_axis, 1) for c in (got_cache, want_cache))  # [B, S, ..]
            np.testing.assert_allclose(g[slots], w[slots], rtol=1e-5, atol=1e-5)


@needs_kernels
def test_prepared_weights_only_where_the_kernels_apply():
    """f32 params get the kernels' panels (flat, the weights' sizes) beside each layer's weights and the
    head; other dtypes none, or for decoding a tied head's [D, V] copy; prepared params pass through."""
    cfg = _cfg(4, 2, 16)
    params = qwen3.init(cfg, jax.random.key(0))
    bf16 = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
    assert ops.prepare(bf16, cfg) is bf16
    assert ops.prepare(bf16, cfg, decoding=True)[ops.PREPARED]["head_DxV"].shape == (32, 61)
    prepared = ops.prepare(params, cfg)
    assert prepared[ops.PREPARED]["lm_head"].shape == (32 * 61,)
    assert all(ops.PREPARED in prepared["layers"][i]["attn"] and ops.PREPARED in prepared["layers"][i]["mlp"]
               for i in range(cfg.num_hidden_layers))
    assert ops.prepare(prepared, cfg, decoding=True) is prepared


def _probe(env: dict) -> str:
    code = ("from jaxagent.kernels import cpu; import jax\n"
            "print(cpu.available(), '|', cpu.unavailable_reason())\n")
    base = {k: v for k, v in os.environ.items() if k != "JAXAGENT_CPU_KERNELS"}  # the suite may run with it =0
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_kernels_load_on_first_direct_call():
    # a fresh process calling a kernel before anything asked `available()`
    code = ("import jax.numpy as jnp; from jaxagent.kernels import cpu\n"
            "print(float(cpu.rows_matmul(jnp.ones((2, 1, 3)), jnp.ones((2,), jnp.int32), cpu.pack_panels(jnp.ones((3, 5))), 5)[1, 0, 4]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if cpu.available():
        assert out.returncode == 0 and out.stdout.strip() == "3.0", out.stderr[-2000:]
    else:
        assert "CPU kernels unavailable" in out.stderr


def test_disabled_or_missing_compiler_falls_back(tmp_path):
    assert _probe({"JAXAGENT_CPU_KERNELS": "0"}) == "False | disabled by JAXAGENT_CPU_KERNELS=0"
    out = _probe({"CXX": "no-such-compiler-xyz", "JAXAGENT_KERNEL_CACHE": str(tmp_path)})
    assert out.startswith("False | no C++ compiler")
    out = _probe({"CXX": "false", "JAXAGENT_KERNEL_CACHE": str(tmp_path)})  # a "compiler" that always fails
    assert out.startswith("False | build or load failed")
    assert not list(tmp_path.rglob("*.so"))  # no half-written library left behind


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None or jax.default_backend() != "cpu",
                    reason="no C++ compiler or not on CPU")
def test_unwritable_cache_directory_falls_back_to_a_temporary_one():
    assert _probe({"JAXAGENT_KERNEL_CACHE": "/proc/jaxagent-not-writable"}) == "True |"
