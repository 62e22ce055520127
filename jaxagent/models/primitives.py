"""The model's operations in plain XLA, the same program on every platform.

`ops` (the compute seam) builds the model's layers from these; nothing here depends on the platform.
Legend: B batch, T tokens, D model width, E head dim, V vocab (CONVENTIONS.md); `rope` takes any head
count (`x_BxTxhxE`, h heads).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


def rms_norm(x, weight, eps):
    """y = w * x / sqrt(mean(x^2) + eps), statistics in f32 (as HF Qwen3RMSNorm)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def rope_tables(positions_BxT, head_dim, theta):
    """(cos, sin) [B, T, 1, E] of the rotary angles pos * theta^(-2i/E), in f32 (as HF computes them)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    ang_BxTxE2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
    ang = jnp.concatenate([ang_BxTxE2, ang_BxTxE2], axis=-1)[:, :, None, :]
    return jnp.cos(ang), jnp.sin(ang)


def rope(x_BxTxhxE, tables):
    """Rotary embedding, half-split layout (HF `rotate_half`): x cos + rotate_half(x) sin."""
    cos, sin = (t.astype(x_BxTxhxE.dtype) for t in tables)
    x1, x2 = jnp.split(x_BxTxhxE, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BxTxhxE * cos + rotated * sin


def dot_f32(a, b, dims):
    """dot_general in the promoted dtype of a and b, accumulated and returned in f32."""
    dt = jnp.promote_types(a.dtype, b.dtype)
    return jax.lax.dot_general(a.astype(dt), b.astype(dt), (dims, ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x, w, out_dtype=None):
    """y[..., o...] = sum_i x[..., i] w[i, o...]: a projection (w's first axis contracts x's last).

    The same product as `jnp.einsum`; the backward is written out as two plain GEMMs over the
    flattened tokens (dx = dy w^T, dw = x^T dy), each in the layout a GEMM reads directly (autodiff's
    transpose of the einsum copied every activation gradient into a transposed layout first)."""
    return jnp.tensordot(x, w, axes=1, preferred_element_type=out_dtype)


def _dense_fwd(x, w, out_dtype):
    return dense(x, w, out_dtype), (x, w)


def _dense_bwd(out_dtype, res, dy):
    x, w = res
    k = x.shape[-1]
    w2 = w.reshape(k, -1)
    x2, dy2 = x.reshape(-1, k), dy.reshape(-1, w2.shape[1])
    dx = dot_f32(dy2, w2, ((1,), (1,))).astype(x.dtype).reshape(x.shape)   # [M, N] x [K, N] -> [M, K]
    dw = dot_f32(x2, dy2, ((0,), (0,))).astype(w.dtype).reshape(w.shape)   # [M, K] x [M, N] -> [K, N]
    return dx, dw


dense.defvjp(_dense_fwd, _dense_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense_transposed(x, w_NxI, out_dtype=None):
    """y[..., n] = sum_i x[..., i] w[n, i] (a tied unembedding: x @ embed^T), backward as in `dense`."""
    return jnp.einsum("...i,ni->...n", x, w_NxI, preferred_element_type=out_dtype)


def _dense_t_fwd(x, w, out_dtype):
    return dense_transposed(x, w, out_dtype), (x, w)


def _dense_t_bwd(out_dtype, res, dy):
    x, w = res
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, w.shape[0])
    dx = dot_f32(dy2, w, ((1,), (0,))).astype(x.dtype).reshape(x.shape)    # [M, N] x [N, I] -> [M, I]
    dw = dot_f32(dy2, x2, ((0,), (0,))).astype(w.dtype)                     # [M, N] x [M, I] -> [N, I]
    return dx, dw


dense_transposed.defvjp(_dense_t_fwd, _dense_t_bwd)


def batched_dot(a_BxKxMxC, b_BxKxCxN):
    """[B, K, M, C] @ [B, K, C, N] -> [B, K, M, N], accumulated in f32 (one GEMM per row and KV head)."""
    return jax.lax.dot_general(a_BxKxMxC, b_BxKxCxN, (((3,), (2,)), ((0, 1), (0, 1))),
                               preferred_element_type=jnp.float32)


def rows(x_BxTx_, index_B):
    """x[b, index[b]] for every row, keeping a length-1 token axis: [B, T, ...] -> [B, 1, ...]."""
    idx = index_B.astype(jnp.int32).reshape((-1, 1) + (1,) * (x_BxTx_.ndim - 2))
    return jnp.take_along_axis(x_BxTx_, idx, axis=1)


class KVWindows(NamedTuple):
    """A run-time choice among static attention windows: attend over the first `sizes[index]` cache slots.

    `sizes` (static, ascending) become one compiled branch each (`lax.switch` around the attention
    core only; the cache update stays outside); `index` is a traced int32 scalar (see `choose_window`).
    """
    sizes: tuple[int, ...]
    index: jax.Array


def choose_window(sizes: tuple[int, ...], need) -> KVWindows:
    """The smallest window in `sizes` holding `need` slots (traced), else the largest."""
    index = jnp.minimum(jnp.searchsorted(jnp.asarray(sizes, jnp.int32), jnp.asarray(need, jnp.int32)),
                        len(sizes) - 1)
    return KVWindows(tuple(int(w) for w in sizes), index.astype(jnp.int32))
