"""The CUDA branch of the model's seam (`jaxagent.models.ops_gpu`), checked on this CPU: its arguments
(`kernel_args`: the model's key/value layout, GQA head grouping, the mask as causal or as a bias) run through
`jax.nn.dot_product_attention(implementation="xla")`, the same call as the cuDNN kernel's on any platform, equal the
dense `ops.attention` the other platforms run; which shapes go to the kernel (`fusable`); and that a program lowered
for CUDA takes the CUDA branch of `ops.platform_select`. The kernel's own numbers need a GPU:
`python -m experiments.gpu_attention_check` (docs/performance.md).

Legend: B batch, T queries, S key slots, H query heads, K KV heads, E head dim.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import ops, ops_gpu
from jaxagent.models.config import Qwen3Config

CFG = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
B, T, S = 3, 12, 20


def _qkv(dtype, t=T, s=S, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (B, t, CFG.num_attention_heads, CFG.head_dim), dtype)
    kt = jax.random.normal(kk, (B, CFG.num_key_value_heads, CFG.head_dim, s), dtype)
    v = jax.random.normal(kv, (B, CFG.num_key_value_heads, s, CFG.head_dim), dtype)
    return q, kt, v


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_causal_arguments_equal_the_dense_attention(dtype, tol):
    """Plain causal attention (T = S, `causal_only`): the kernel's causal flag in place of the [B, T, T] mask."""
    q, kt, v = _qkv(dtype, s=T)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    dense = ops.attention(CFG, q, kt, v, mask)
    q2, k2, v2, m2, causal = ops_gpu.kernel_args(q, kt, v, mask, causal_only=True)
    assert causal and m2 is None and k2.shape == (B, T, CFG.num_key_value_heads, CFG.head_dim) == v2.shape
    fused = ops_gpu.attention(q, kt, v, mask, causal_only=True, implementation="xla")
    assert fused.dtype == dense.dtype and fused.shape == dense.shape
    np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(dense, np.float32), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_cached_append_mask_as_bias_equals_the_dense_attention(dtype, tol):
    """A cached append: row b's query t sits at slot length[b] + t and sees slots up to it (a per-row offset the
    kernel's causal flag cannot express), so the mask goes in as the kernel's bias; the values equal the dense
    attention's, rows with different lengths and a window included."""
    q, kt, v = _qkv(dtype)
    length = jnp.array([0, 3, 8])
    slots = length[:, None] + jnp.arange(T)
    mask = jnp.arange(S)[None, None, :] <= slots[:, :, None]
    _, _, _, m2, causal = ops_gpu.kernel_args(q, kt, v, mask, causal_only=False)
    assert not causal and m2.shape == (B, 1, T, S) and m2.dtype == jnp.bool_
    dense = ops.attention(CFG, q, kt, v, mask)
    fused = ops_gpu.attention(q, kt, v, mask, implementation="xla")
    np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(dense, np.float32), atol=tol, rtol=tol)
    w = 16  # rows 0 and 1 live in slots < 16 (the caller's guarantee for a window); row 2 reaches slot 19
    live = slots.max(axis=1) < w
    assert live.tolist() == [True, True, False]
    dense_w = ops.attention(CFG, q, kt, v, mask, window=w)
    fused_w = ops_gpu.attention(q, kt[..., :w], v[:, :, :w], mask[..., :w], implementation="xla")
    np.testing.assert_allclose(np.asarray(fused_w, np.float32)[live], np.asarray(dense_w, np.float32)[live],
                               atol=tol, rtol=tol)


def test_gqa_heads_read_their_own_kv_head():
    """Query head h reads KV head h // (H / K), in the kernel's call as in the dense attention: moving one KV head's
    values changes exactly the query heads of its group."""
    q, kt, v = _qkv(jnp.float32, s=T)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    base = ops_gpu.attention(q, kt, v, mask, causal_only=True, implementation="xla")
    moved = ops_gpu.attention(q, kt, v.at[:, 1].add(1.0), mask, causal_only=True, implementation="xla")
    changed = np.abs(np.asarray(moved - base)).max(axis=(0, 1, 3)) > 1e-3
    assert changed.tolist() == [False, False, True, True]


def test_fusable_takes_half_precision_many_queries_and_small_heads(monkeypatch):
    monkeypatch.setattr(ops_gpu, "available", lambda: True)
    n = ops_gpu.FUSED_MIN_QUERIES

    def q(t, e=128, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct((2, t, 4, e), dtype)
    assert ops_gpu.fusable(q(n), 4 * n) and ops_gpu.fusable(q(n, dtype=jnp.float16), n)
    assert not ops_gpu.fusable(q(n, dtype=jnp.float32), n)          # the kernel runs bf16 / f16
    assert not ops_gpu.fusable(q(n - 2), 4 * n)                      # few queries: decode, short appends
    assert not ops_gpu.fusable(q(n, e=256), n) and not ops_gpu.fusable(q(n, e=100), n)
    assert ops_gpu.fusable(q(n + 1), n + 3)                          # odd lengths: padded for the biased backward
    monkeypatch.setattr(ops_gpu, "available", lambda: False)
    assert not ops_gpu.fusable(q(n), n)                              # no cuDNN here: the CUDA branch is not built


def test_platform_select_lowers_the_cuda_branch_for_cuda_only():
    """A program exported for CUDA holds the `cuda` branch, one for CPU the `cpu` branch, one for TPU the default."""
    def f(x):
        return ops.platform_select(x, cpu=jnp.sin, cuda=jnp.cos, default=jnp.tanh)
    x = jax.ShapeDtypeStruct((4,), jnp.float32)

    def ops_in(fn, platform):
        text = jax.export.export(jax.jit(fn), platforms=[platform])(x).mlir_module()
        return {op for op in ("sine", "cosine", "tanh") if f"stablehlo.{op} " in text}
    assert ops_in(f, "cuda") == {"cosine"} and ops_in(f, "cpu") == {"sine"} and ops_in(f, "tpu") == {"tanh"}
    g = lambda x: ops.platform_select(x, cpu=jnp.sin, default=jnp.tanh)  # noqa: E731
    assert ops_in(g, "cuda") == {"tanh"}


def test_device_check_cases_run_here_with_jax_attention(monkeypatch):
    """experiments/gpu_attention_check.py's cases, with jax's own attention in place of the cuDNN kernel (the same
    call on this CPU): its comparisons run and agree within its tolerance; on a GPU they compare the kernel."""
    from experiments import gpu_attention_check as check
    monkeypatch.setattr(ops_gpu, "attention", functools.partial(ops_gpu.attention, implementation="xla"))
    key = jax.random.key(0)
    causal = check.causal_case(key, b=1, t=128)
    append = check.append_case(key, b=2, t=128, s=256)
    errors = [v for rec in (causal, append) for k, v in rec.items() if k.endswith("_error")]
    assert len(errors) == 5 and max(errors) <= check.TOLERANCE and max(errors) > 0
    with pytest.raises(SystemExit, match="needs an NVIDIA GPU"):
        check.main([])


def test_odd_lengths_are_padded_for_the_bias_and_give_the_same_values():
    """An odd number of queries (a FrozenLake rollout's first prompt chunk) and of key slots: one masked query and
    one masked slot are added for the kernel's bias (its backward takes even lengths), the values and the gradient
    equal the dense attention's."""
    t, s = 11, 17
    q, kt, v = _qkv(jnp.float32, t=t, s=s)
    length = jnp.array([0, 2, 6])
    mask = jnp.arange(s)[None, None, :] <= (length[:, None] + jnp.arange(t))[:, :, None]
    q2, k2, v2, m2, _ = ops_gpu.kernel_args(q, kt, v, mask, causal_only=False)
    assert q2.shape[1] == t + 1 and k2.shape[1] == v2.shape[1] == s + 1 and m2.shape == (B, 1, t + 1, s + 1)
    assert not m2[:, :, t].any() and not m2[..., s].any()  # the added query and slot see / are seen by nothing

    def loss(fn, q, kt, v):
        return (fn(q, kt, v) ** 2).sum()
    dense = lambda q, kt, v: ops.attention(CFG, q, kt, v, mask)  # noqa: E731
    fused = lambda q, kt, v: ops_gpu.attention(q, kt, v, mask, implementation="xla")  # noqa: E731
    np.testing.assert_allclose(fused(q, kt, v), dense(q, kt, v), atol=1e-5, rtol=1e-5)
    g_f = jax.grad(functools.partial(loss, fused), argnums=(0, 1, 2))(q, kt, v)
    g_d = jax.grad(functools.partial(loss, dense), argnums=(0, 1, 2))(q, kt, v)
    for a, b in zip(g_f, g_d):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
