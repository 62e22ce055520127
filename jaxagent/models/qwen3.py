"""Dense Qwen3 in Flax NNX, used through pure functions over a plain params pytree.

The NNX modules below define the parameters (with their logical sharding axes) and the computation;
jitted code never holds a module: it takes `params` (a nested dict of arrays, the module's state as a
pure dict) and merges it into the module inside the trace (`nnx.merge`), so `forward` composes with
`jax.jit`, `jax.vmap`, `jax.grad` and `lax.scan` like any pure function.

Dimension legend: B batch, T new tokens, S cache slots, D model width, F MLP width, H query heads,
K key/value heads, G = H / K query heads per KV head, E head dim, V vocab, L layers.

KV cache (`init_cache`): {'k': [L x (B, K, E, S)], 'v': [L x (B, K, S, E)], 'length': int32[B]}: head-major,
keys stored transposed so that decoding scores every slot with vector ops along S (see `Attention`). Row b holds its tokens
contiguously in slots [0, length[b]); a call writes its T tokens at slots length[b] .. length[b]+T-1 and
advances length by n_valid[b] (<= T). Positions (RoPE) equal slot indices, so right-padded batches,
per-row decode and appending an environment's reply to a cached history all use the same path. Slots
past `length` may hold stale values; the causal mask (key slot <= query slot) never reads them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.kernels import cpu as cpu_kernels
from jaxagent.models.config import Qwen3Config

Params = dict[str, Any]
Cache = dict[str, Any]
Packed = dict[str, Any]
_FEW_QUERIES = 8  # at most this many query rows per KV head: decode-style attention (see Attention)
_SUM_BLOCK = 16  # reduction block of decode attention's multiply-adds (see _sum_products)
_SUM_MAX_SLOTS = 512  # decode's p.V as multiply-adds up to this many slots (32 blocks), on CPU only
_MASK_VALUE = -1e30  # finite, so a row with every key masked gives a uniform softmax instead of NaN


def _normal(rngs: nnx.Rngs, shape, std=0.02):
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


def _param(value, *axes):
    return nnx.Param(value, logical_axes=tuple(axes))


def rms_norm(x, weight, eps):
    """y = w * x / sqrt(mean(x^2) + eps), statistics in f32 (as HF Qwen3RMSNorm)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def rope_tables(positions_BxT, head_dim, theta):
    """(cos, sin) [B, T, 1, E] of the rotary angles pos * theta^(-2i/E), in f32 (as HF computes them);
    computed once per forward and shared by every layer.

    On CPU they are computed inside a conditional (a buffer XLA cannot fuse into its consumers), so
    that they are computed once: otherwise XLA:CPU fused cos and sin into every layer's q and k
    rotation, evaluating them once per head and layer (a 1M-parameter rollout spent ~40 ms of ~470 in
    those fusions); it drops optimization barriers before fusion, so a barrier does not do it."""
    def tables(positions):
        inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
        ang_BxTxE2 = positions.astype(jnp.float32)[..., None] * inv_freq
        ang = jnp.concatenate([ang_BxTxE2, ang_BxTxE2], axis=-1)[:, :, None, :]
        return jnp.cos(ang), jnp.sin(ang)
    if jax.default_backend() != "cpu":  # (GPU conditionals read their predicate on the host)
        return tables(positions_BxT)
    # Both branches are the same function, so the result never depends on the (traced) predicate.
    return jax.lax.cond(jnp.any(positions_BxT != 0), tables, tables, positions_BxT)


def rope(x_BxTxNxE, tables):
    """Rotary embedding, half-split layout (HF `rotate_half`): x cos + rotate_half(x) sin."""
    cos, sin = (t.astype(x_BxTxNxE.dtype) for t in tables)
    x1, x2 = jnp.split(x_BxTxNxE, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BxTxNxE * cos + rotated * sin


def _dot_f32(a, b, dims):
    """dot_general in the promoted dtype of a and b, accumulated and returned in f32."""
    dt = jnp.promote_types(a.dtype, b.dtype)
    return jax.lax.dot_general(a.astype(dt), b.astype(dt), (dims, ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x, w, out_dtype=None):
    """y[..., o...] = sum_i x[..., i] w[i, o...]: a projection (w's first axis contracts x's last).

    The same product as `jnp.einsum`; only the backward is written out, as two plain GEMMs over the
    flattened tokens: dx = dy w^T and dw = x^T dy. With autodiff's transpose of the einsum, XLA:CPU
    wrote every activation gradient a second time in transposed layout for the weight-gradient dot (a
    strided copy as slow as the dot itself: 30% of a 10M model's train step); this form needs no copy.
    """
    return jnp.tensordot(x, w, axes=1, preferred_element_type=out_dtype)


def _dense_fwd(x, w, out_dtype):
    return dense(x, w, out_dtype), (x, w)


def _dense_bwd(out_dtype, res, dy):
    x, w = res
    k = x.shape[-1]
    w2 = w.reshape(k, -1)
    x2, dy2 = x.reshape(-1, k), dy.reshape(-1, w2.shape[1])
    dx = _dot_f32(dy2, w2, ((1,), (1,))).astype(x.dtype).reshape(x.shape)   # [M, N] x [K, N] -> [M, K]
    dw = _dot_f32(x2, dy2, ((0,), (0,))).astype(w.dtype).reshape(w.shape)   # [M, K] x [M, N] -> [K, N]
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
    dx = _dot_f32(dy2, w, ((1,), (0,))).astype(x.dtype).reshape(x.shape)    # [M, N] x [N, I] -> [M, I]
    dw = _dot_f32(dy2, x2, ((0,), (0,))).astype(w.dtype)                     # [M, N] x [M, I] -> [N, I]
    return dx, dw


dense_transposed.defvjp(_dense_t_fwd, _dense_t_bwd)


def _rows(x_BxTx_, index_B):
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


def _sum_products(a, b):
    """sum over axis -2 of a * b (broadcast), as a sum of blocks of `_SUM_BLOCK` along that axis.

    XLA:CPU fuses each block's multiply with its reduction (vectorised along the last axis). Measured in
    a 10M decode step (in-process A/B): scores and P.V both this way, 13.7 -> 10.7 ms per step (P.V as a
    batched dot ran at ~4 GFLOP/s). Blocks of 32 for the scores: 52 ms (XLA fused q's norm and rope
    into every block); 32 or 64 for P.V: 13-14 ms.
    """
    n = a.shape[-2]
    return sum(jnp.sum(a[..., i:i + _SUM_BLOCK, :] * b[..., i:i + _SUM_BLOCK, :], axis=-2)
               for i in range(0, n, _SUM_BLOCK))


def _attend(cfg: Qwen3Config, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window: Optional[int] = None,
            traced_window=None):
    """softmax(q k^T / sqrt(E) + mask) v over the first `window` slots of keys kt [B, K, E, S] and values
    v [B, K, S, E]; returns [B, T, H, E]. With `window`, the caller guarantees every live slot lies below it.
    `traced_window` (int32 scalar): the same over the first `traced_window` slots without slicing (slots
    past it weigh exactly 0, even in a row whose every slot is masked): the CPU kernel's gradient."""
    if window is not None:
        kt_all, v_all, mask_BxTxS = kt_all[..., :window], v_all[:, :, :window], mask_BxTxS[..., :window]
    q = q_BxTxHxE
    kt_all, v_all = kt_all.astype(q.dtype), v_all.astype(q.dtype)
    b, t = q.shape[:2]
    q = q.reshape(b, t, cfg.num_key_value_heads, cfg.group_size, cfg.head_dim)
    few = t * cfg.group_size <= _FEW_QUERIES
    if few:
        # Decoding: a few query rows per (row, KV head). XLA:CPU runs such batched dots at ~1-4 GFLOP/s;
        # multiply-adds over E with S as the vector axis (keys stored [.., E, S]) are 3-5x faster.
        q32 = q.transpose(0, 2, 3, 1, 4).astype(jnp.float32)[..., None]  # [B, K, G, T, E, 1]
        scores = _sum_products(q32, kt_all[:, :, None, None].astype(jnp.float32))  # x [B, K, 1, 1, E, S]
    else:  # [B, K, G*T, E] @ [B, K, E, S]: a plain (non-transposed) GEMM per (row, KV head)
        q_m = q.transpose(0, 2, 3, 1, 4).reshape(b, cfg.num_key_value_heads, -1, cfg.head_dim)
        scores = jax.lax.dot_general(q_m, kt_all, (((3,), (2,)), ((0, 1), (0, 1))),
                                     preferred_element_type=jnp.float32)
        scores = scores.reshape(b, cfg.num_key_value_heads, cfg.group_size, t, -1)
    scores = scores * (cfg.head_dim ** -0.5)
    scores = jnp.where(mask_BxTxS[:, None, None], scores, _MASK_VALUE)
    if traced_window is not None:  # below every masked score: exp(-2e30 - max) = 0 whatever the row's max
        scores = jnp.where(jnp.arange(scores.shape[-1]) < traced_window, scores, 2 * _MASK_VALUE)
    # softmax(scores) @ V with the normalisation after the product: the division touches [T, E] per
    # head instead of [T, S]. A row with every key masked gets uniform weights (finite mask value).
    # The shift only keeps exp in range; the result does not depend on it, so its gradient is exactly 0:
    # stop_gradient spares the backward max's tie masks (a compare + convert over every score per layer).
    unnorm = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    denom = jnp.sum(unnorm, axis=-1)  # [B, K, G, T]
    if few and v_all.shape[2] <= _SUM_MAX_SLOTS and jax.default_backend() == "cpu":
        # The same multiply-adds over S, E the vector axis (values stored [.., S, E]). One block per 16
        # slots: past a few hundred slots the program grows with the context, and GPUs/TPUs run the dot well.
        out = _sum_products(unnorm[..., None], v_all[:, :, None, None].astype(jnp.float32))  # [B, K, G, T, E]
    else:
        p_m = unnorm.astype(v_all.dtype).reshape(b, cfg.num_key_value_heads, -1, unnorm.shape[-1])
        out = jax.lax.dot_general(p_m, v_all, (((3,), (2,)), ((0, 1), (0, 1))),
                                  preferred_element_type=jnp.float32)  # [B, K, G*T, E]
        out = out.reshape(b, cfg.num_key_value_heads, cfg.group_size, t, -1)
    out = out.transpose(0, 3, 1, 2, 4)
    out = (out / denom.transpose(0, 3, 1, 2)[..., None]).astype(v_all.dtype)
    return out.reshape(b, t, cfg.num_attention_heads, cfg.head_dim)


def _attend_cached(cfg: Qwen3Config, q_BxTxHxE, kt_all, v_all, mask_BxTxS,
                   window: Union[int, KVWindows, None] = None, n_valid_B=None):
    """`_attend` over a KV cache, over its first `window` slots (a static size or a `KVWindows` choice).

    On CPU, by the fused kernel (`jaxagent.kernels.cpu.attention`: scores, softmax and values in one
    pass per (row, KV head), same results), which reads the window at run time: a `KVWindows` needs no
    branch per size; with `n_valid_B` it skips each row's padded queries (their outputs are 0).
    Measured (in-process A/B, 2-core EPYC): the 1M-parameter rollout 658 -> 495 ms, the 10M prefill
    425 -> 383 ms. Elsewhere XLA's `_attend`, in a `lax.switch` over the sizes (all queries computed)."""
    if cpu_kernels.attention_supported(q_BxTxHxE, kt_all, v_all):
        if isinstance(window, KVWindows):
            size = jnp.asarray(window.sizes, jnp.int32)[window.index]
        else:
            size = kt_all.shape[-1] if window is None else window
        return cpu_kernels.attention(q_BxTxHxE, kt_all, v_all, mask_BxTxS, size, functools.partial(_attend, cfg),
                                     n_valid_B)
    if isinstance(window, KVWindows):
        # The branches only read the cache (updated by the caller, outside the switch): a conditional
        # that took and returned the cache would copy all of it into and out of the branch.
        branches = [functools.partial(_attend, cfg, window=w) for w in window.sizes]
        return jax.lax.switch(window.index, branches, q_BxTxHxE, kt_all, v_all, mask_BxTxS)
    return _attend(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window)


def _packed_dense(x_BxTxI, packed_w, out_dims: tuple[int, ...], n_valid_B=None):
    """x @ w over x's last axis (as `dense`) by the CPU GEMM kernel, w given as panels
    (`packed_weights`); output [B, T, *out_dims]. With `n_valid_B`, only each row's first n_valid
    tokens are computed (the others are 0): padding and finished rows cost nothing."""
    b, t = x_BxTxI.shape[:2]
    n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
    y = cpu_kernels.rows_matmul(x_BxTxI, n, packed_w, int(np.prod(out_dims)))
    return y.reshape((b, t) + tuple(out_dims)).astype(x_BxTxI.dtype)


def _query_rows_valid(n_valid_B, query_index):
    """Valid tokens per row after `_rows(x, query_index)` kept one token per row: 1 where any was valid."""
    if n_valid_B is None or query_index is None:
        return n_valid_B
    return (n_valid_B > 0).astype(jnp.int32)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, axis: str):
        self.weight = _param(jnp.ones((dim,), jnp.float32), axis)
        self.eps = eps

    def __call__(self, x):
        return rms_norm(x, self.weight[...].astype(x.dtype), self.eps)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        d, h, k, e = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = _param(_normal(rngs, (d, h, e)), "embed", "q_heads", "head_dim")
        self.k_proj = _param(_normal(rngs, (d, k, e)), "embed", "kv_heads", "head_dim")
        self.v_proj = _param(_normal(rngs, (d, k, e)), "embed", "kv_heads", "head_dim")
        self.o_proj = _param(_normal(rngs, (h, e, d)), "q_heads", "head_dim", "embed")
        if cfg.attention_bias:
            self.q_bias = _param(jnp.zeros((h, e)), "q_heads", "head_dim")
            self.k_bias = _param(jnp.zeros((k, e)), "kv_heads", "head_dim")
            self.v_bias = _param(jnp.zeros((k, e)), "kv_heads", "head_dim")
            self.o_bias = _param(jnp.zeros((d,)), "embed")
        self.q_norm = RMSNorm(e, cfg.rms_norm_eps, "head_dim")
        self.k_norm = RMSNorm(e, cfg.rms_norm_eps, "head_dim")
        self.cfg = cfg

    def __call__(self, x_BxTxD, rope_BxT, mask_BxTxS, kv_cache, write_slots_BxT, kv_window=None,
                 query_index=None, packed=None, n_valid_B=None):
        """Keys and values of all T tokens (written to the cache); queries of all T, or with
        `query_index` [B] of that one token per row (output [B, 1, D]). With `packed`, `n_valid_B`:
        the products only for each row's first n_valid tokens (the others' outputs are 0)."""
        cfg = self.cfg
        x_q, rope_q = x_BxTxD, rope_BxT
        if query_index is not None:
            x_q, mask_BxTxS = _rows(x_BxTxD, query_index), _rows(mask_BxTxS, query_index)
            rope_q = tuple(_rows(r, query_index) for r in rope_BxT)
        if packed is not None:  # q, k and v of every token from one kernel call on [q | k | v] panels
            h, kv, e = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            qkv = _packed_dense(x_BxTxD, packed["qkv_proj"], (h + 2 * kv, e), n_valid_B)
            v = qkv[:, :, h + kv:]
            if cfg.attention_bias:
                q, k = jnp.split(qkv[:, :, :h + kv], (h,), axis=2)
                q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
                q, k = rope(self.q_norm(q), rope_BxT), rope(self.k_norm(k), rope_BxT)
            else:  # q/k norms and rotation in one kernel pass (five XLA fusions per layer otherwise)
                b, t = qkv.shape[:2]
                q, k = cpu_kernels.norm_rope(
                    qkv, jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B,
                    self.q_norm.weight[...], self.k_norm.weight[...], rope_BxT[0].reshape(b, t, e),
                    rope_BxT[1].reshape(b, t, e), cfg.rms_norm_eps, h)
            q = q if query_index is None else _rows(q, query_index)
        else:
            q = dense(x_q, self.q_proj[...])  # [B, T, H, E]
            k = dense(x_BxTxD, self.k_proj[...])  # [B, T, K, E]
            v = dense(x_BxTxD, self.v_proj[...])
            if cfg.attention_bias:
                q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
            q = rope(self.q_norm(q), rope_q)
            k = rope(self.k_norm(k), rope_BxT)
        if kv_cache is not None:
            k_cache, v_cache = kv_cache  # k [B, K, E, S], v [B, K, S, E]: attention reads them without a transpose
            b_idx = jnp.arange(k.shape[0])[:, None]
            # [b, :, :, slot] / [b, :, slot] indexing takes values [B, T, K, E]; writes past the cache end are
            # dropped (mode='drop'): callers bound lengths on the host.
            k_cache = k_cache.at[b_idx, :, :, write_slots_BxT].set(k.astype(k_cache.dtype), mode="drop")
            v_cache = v_cache.at[b_idx, :, write_slots_BxT].set(v.astype(v_cache.dtype), mode="drop")
            kv_cache = (k_cache, v_cache)
            out = _attend_cached(cfg, q, k_cache, v_cache, mask_BxTxS, window=kv_window,
                                 n_valid_B=_query_rows_valid(n_valid_B, query_index))
        else:
            out = _attend(cfg, q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask_BxTxS)
        # As one [B*T, H*E] @ [H*E, D] GEMM: with the 3-D einsum XLA chose to contract (e, h) and copied
        # the whole o_proj weight into that order on every decode step (~0.15 ms per layer at 10M).
        b, t = out.shape[:2]
        if packed is None:
            y = dense(out.reshape(b, t, -1), self.o_proj[...].reshape(-1, cfg.hidden_size))
        else:
            y = _packed_dense(out.reshape(b, t, -1), packed["o_proj"], (cfg.hidden_size,),
                              _query_rows_valid(n_valid_B, query_index))
        if cfg.attention_bias:
            y = y + self.o_bias[...]
        return y, kv_cache


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(_normal(rngs, (d, f)), "embed", "mlp")
        self.up_proj = _param(_normal(rngs, (d, f)), "embed", "mlp")
        self.down_proj = _param(_normal(rngs, (f, d)), "mlp", "embed")

    def __call__(self, x_BxTxD, packed=None, n_valid_B=None):
        if packed is None:
            gate = dense(x_BxTxD, self.gate_proj[...])
            up = dense(x_BxTxD, self.up_proj[...])
            return dense(jax.nn.silu(gate) * up, self.down_proj[...])
        f, d = self.down_proj.shape
        if x_BxTxD.shape[1] > 1 and f % 8 == 0:  # many rows: one fused kernel call (see cpu.mlp)
            b, t = x_BxTxD.shape[:2]
            n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
            return cpu_kernels.mlp(x_BxTxD, n, packed["gate_up_proj"], packed["down_proj"]).astype(x_BxTxD.dtype)
        # decode steps: the products split over weight panels (streamed from memory once), gate and up
        # from one call on [gate | up] panels
        gate, up = jnp.split(_packed_dense(x_BxTxD, packed["gate_up_proj"], (2 * f,), n_valid_B), 2, axis=-1)
        return _packed_dense(jax.nn.silu(gate) * up, packed["down_proj"], (d,), n_valid_B)


class Block(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed")
        self.attn = Attention(cfg, rngs)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed")
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, rope_tabs, mask, kv_cache, write_slots, kv_window=None, query_index=None, packed=None,
                 n_valid_B=None):
        a, kv_cache = self.attn(self.input_norm(x), rope_tabs, mask, kv_cache, write_slots, kv_window, query_index,
                                packed, n_valid_B)
        x = (x if query_index is None else _rows(x, query_index)) + a
        return x + self.mlp(self.post_norm(x), packed, _query_rows_valid(n_valid_B, query_index)), kv_cache


class Qwen3(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.embed = _param(_normal(rngs, (cfg.vocab_size, cfg.hidden_size)), "vocab", "embed")
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed")
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(_normal(rngs, (cfg.hidden_size, cfg.vocab_size)), "embed", "vocab")
        self.cfg = cfg

    def hidden(self, tokens_BxT, positions_BxT, mask_BxTxS, cache, write_slots_BxT, kv_window=None,
               query_index=None, packed=None, n_valid_B=None):
        # Python loop over layers: on CPU, unrolled layers decode ~2x faster than lax.scan over layers.
        # With query_index only that token's output is wanted: the last layer still writes every token's
        # keys and values but runs attention queries, o_proj and the MLP for that token alone.
        x = jnp.take(self.embed[...], tokens_BxT, axis=0)
        tables = rope_tables(positions_BxT, self.cfg.head_dim, self.cfg.rope_theta)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache["k"][i], cache["v"][i])
            last = i == len(self.layers) - 1
            x, kv = layer(x, tables, mask_BxTxS, kv, write_slots_BxT, kv_window, query_index if last else None,
                          None if packed is None else packed["layers"][i], n_valid_B)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        return self.norm(x), (new_k, new_v)

    def unembed(self, h_BxTxD, packed=None, n_valid_B=None):
        if packed is not None:
            return _packed_dense(h_BxTxD, packed["lm_head"], (self.cfg.vocab_size,), n_valid_B).astype(jnp.float32)
        if self.cfg.tie_word_embeddings:
            return dense_transposed(h_BxTxD, self.embed[...], jnp.float32)
        return dense(h_BxTxD, self.lm_head[...], jnp.float32)


# ------------------------------------------------------------------ pure API
@functools.lru_cache(maxsize=32)
def _abstract(cfg: Qwen3Config):
    """(graphdef, abstract state) of the module for `cfg`; traced once per config, no arrays made."""
    return nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, nnx.Rngs(0))))


def _module(params: Params, cfg: Qwen3Config) -> Qwen3:
    graphdef, abstract_state = _abstract(cfg)
    state = jax.tree.map(lambda x: x, abstract_state)  # fresh copy: replace_by_pure_dict mutates
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def init(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32) -> Params:
    """Random weights (normal(0, 0.02) matrices, unit norms, as HF's init) as a nested dict."""
    state = nnx.state(Qwen3(cfg, nnx.Rngs(params=key)))
    return jax.tree.map(lambda x: x.astype(dtype), nnx.to_pure_dict(state))


def param_shapes(cfg: Qwen3Config) -> Params:
    """The params pytree as `jax.ShapeDtypeStruct`s (f32), without allocating."""
    return nnx.to_pure_dict(_abstract(cfg)[1])


def logical_axes(cfg: Qwen3Config) -> Params:
    """Logical axis names of every parameter (same pytree as params); the one source for shardings."""
    state = _abstract(cfg)[1]
    axes = jax.tree.map(lambda v: v.get_metadata()["logical_axes"], state,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(axes)


def untied(params: Params, cfg: Qwen3Config) -> tuple[Params, Qwen3Config]:
    """(params, cfg) with a tied LM head made explicit: lm_head = embed^T, a [D, V] copy.

    Same logits; for loops that unembed many times (decoding), where XLA:CPU's dot with the
    transposed [V, D] embedding ran ~2x slower than with a [D, V] matrix. Untied models pass through.
    """
    if not cfg.tie_word_embeddings:
        return params, cfg
    return {**params, "lm_head": params["embed"].T}, dataclasses.replace(cfg, tie_word_embeddings=False)


def init_cache(cfg: Qwen3Config, batch: int, max_len: int, dtype=jnp.float32) -> Cache:
    """An empty KV cache with `max_len` slots per row."""
    k_shape = (batch, cfg.num_key_value_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
    return {"k": [jnp.zeros(k_shape, dtype) for _ in range(cfg.num_hidden_layers)],
            "v": [jnp.zeros(v_shape, dtype) for _ in range(cfg.num_hidden_layers)],
            "length": jnp.zeros((batch,), jnp.int32)}


CACHE_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")     # values
KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_seq")  # keys, stored transposed


def cache_logical_axes(cfg: Qwen3Config) -> Cache:
    return {"k": [KEY_CACHE_AXES] * cfg.num_hidden_layers, "v": [CACHE_AXES] * cfg.num_hidden_layers,
            "length": ("batch",)}


def packed_weights(params: Params, cfg: Qwen3Config) -> Optional[Packed]:
    """The projection weights packed for the CPU GEMM kernel (`jaxagent.kernels.cpu.rows_matmul`), for
    `forward(..., packed=)`; None where it does not apply (another backend, kernels unavailable,
    weights not f32).

    Packing copies every weight once: call it outside a token loop (as `generate.decode` and the
    rollout do). Measured (in-process A/B, 2-core EPYC): XLA's Eigen path ran the 42 products of a
    10M-parameter decode step (batch 16) at ~5 GB/s of weights, re-packing them on every call; for
    the rollout's appends the kernel computes only the real tokens (no padding, no finished rows)."""
    if not cpu_kernels.available() or any(w.dtype != jnp.float32 for w in jax.tree.leaves(params)):
        return None
    pack = cpu_kernels.pack_panels
    layers = []
    for i in range(cfg.num_hidden_layers):
        attn, mlp = params["layers"][i]["attn"], params["layers"][i]["mlp"]
        qkv = [attn[name].reshape(cfg.hidden_size, -1) for name in ("q_proj", "k_proj", "v_proj")]
        layers.append({"qkv_proj": pack(*qkv), "o_proj": pack(attn["o_proj"].reshape(-1, cfg.hidden_size)),
                       "gate_up_proj": pack(mlp["gate_proj"], mlp["up_proj"]), "down_proj": pack(mlp["down_proj"])})
    head = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    return {"layers": layers, "lm_head": pack(head)}


def hidden_states(params: Params, cfg: Qwen3Config, tokens_BxT, *, positions=None, attention_mask=None,
                  cache: Optional[Cache] = None, n_valid=None,
                  kv_window: Union[int, KVWindows, None] = None, index=None, packed: Optional[Packed] = None):
    """Final-norm hidden states [B, T, D] and the updated cache (see `forward` for the arguments);
    with `index` [B], only that token's hidden state per row ([B, 1, D]); the cache gets every token."""
    model = _module(params, cfg)
    b, t = tokens_BxT.shape
    tokens_BxT = jnp.clip(tokens_BxT, 0, cfg.vocab_size - 1)  # out-of-range ids never index garbage
    if cache is None:
        slots_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        mask = slots_BxT[:, :, None] >= slots_BxT[:, None, :]
        if attention_mask is not None:
            mask = mask & attention_mask.astype(bool)[:, None, :]
        write_slots = None
    else:
        s = cache["v"][0].shape[2]
        slots_BxT = cache["length"][:, None] + jnp.arange(t, dtype=jnp.int32)
        mask = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= slots_BxT[:, :, None]
        write_slots = slots_BxT
    positions = slots_BxT if positions is None else positions
    if kv_window is not None:
        sizes = kv_window.sizes if isinstance(kv_window, KVWindows) else (kv_window,)
        if cache is None or not all(0 < w <= cache["v"][0].shape[2] for w in sizes):
            raise ValueError(f"kv_window={sizes} needs a cache with at least that many slots")
    if index is not None and t == 1:
        index = None  # one token per row already: decode steps skip the gathers
    n = jnp.full((b,), t, jnp.int32) if n_valid is None else jnp.clip(n_valid.astype(jnp.int32), 0, t)
    h, (new_k, new_v) = model.hidden(tokens_BxT, positions, mask, cache, write_slots, kv_window, index, packed,
                                     None if packed is None or cache is None else n)
    if cache is not None:
        cache = {"k": new_k, "v": new_v, "length": cache["length"] + n}
    return h, cache


def unembed(params: Params, cfg: Qwen3Config, h_BxTxD, packed: Optional[Packed] = None, n_valid_B=None):
    """Logits [B, T, V] in f32 from hidden states (with `packed` and `n_valid_B`: only each row's first
    n_valid positions; the others are 0)."""
    return _module(params, cfg).unembed(h_BxTxD, packed, n_valid_B)


def forward(params: Params, cfg: Qwen3Config, tokens_BxT, *, positions=None, attention_mask=None,
            cache: Optional[Cache] = None, n_valid=None, logits_index=None,
            kv_window: Union[int, KVWindows, None] = None, packed: Optional[Packed] = None):
    """Logits [B, T, V] (f32) and the updated cache.

    Without a cache: causal attention over the T tokens; `attention_mask` [B, T] (1 = real token)
    hides padding keys; `positions` [B, T] overrides RoPE positions (default 0..T-1), e.g. for
    left-padded batches. With a cache: the T tokens are appended at each row's `cache['length']`,
    attend to the row's history, and `length` advances by `n_valid` [B] (default T): rows of a
    right-padded batch, finished rows (n_valid 0) and multi-turn appends all take this path.
    `logits_index` [B]: return only the logits at that token index per row ([B, 1, V]); the last
    layer then computes attention queries, o_proj and the MLP for that token only.
    `kv_window` (static int, with a cache): attend only to the first kv_window slots; the caller
    guarantees length + T <= kv_window for every row whose outputs it uses (rows past it read a
    truncated history). Writes still go to the full cache. Saves attention work when the cache is
    mostly empty (prefill, early turns). A `KVWindows` (see `choose_window`) picks one of a few static
    windows at run time: a `lax.switch` around each layer's attention core.
    `packed` (`packed_weights(params, cfg)`): the projections by the CPU GEMM kernel, which (with a
    cache and `n_valid`) computes only each row's first n_valid tokens; their logits equal the XLA
    path's up to f32 rounding, the other positions' are 0. Not differentiable.
    """
    h, cache = hidden_states(params, cfg, tokens_BxT, positions=positions, attention_mask=attention_mask,
                             cache=cache, n_valid=n_valid, kv_window=kv_window, index=logits_index, packed=packed)
    rows = None  # h has all T positions per row, or one (logits_index): then 1 where any token was valid
    if packed is not None and n_valid is not None and cache is not None:
        rows = jnp.clip(n_valid.astype(jnp.int32), 0, h.shape[1])
    return unembed(params, cfg, h, packed, rows), cache


def load(path: str | os.PathLike, *, dtype=jnp.float32, mesh=None, rules=None):
    """(cfg, params) from a local HF Qwen3 checkpoint directory; see `jaxagent.models.weights`."""
    from jaxagent.models import weights
    return weights.load(path, dtype=dtype, mesh=mesh, rules=rules)


def save(path: str | os.PathLike, cfg: Qwen3Config, params: Params) -> None:
    """Writes an HF-compatible directory (config.json + model.safetensors) transformers can load."""
    from jaxagent.models import weights
    weights.save(path, cfg, params)
