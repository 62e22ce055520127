"""The model's compute seam: the operations of `qwen3` whose best implementation depends on the platform.

`qwen3` is one XLA model written against these functions: `qkv` (projections, q/k norms, RoPE),
`attend_cached` (attention over a KV cache), `project`, `mlp` and `unembed`. Given weights prepared
for the CPU kernels (`packed_weights`), each also has a CPU implementation (`jaxagent.kernels.cpu`),
and `platform_select` picks one at LOWERING time (`jax.lax.platform_dependent`): both branches have
the same shapes and dtypes, so a program lowered for TPU or GPU (on a CPU host or not) contains only
the XLA branch and no `jaxagent_*` custom call. Nothing here asks which backend the host runs.

Legend: B batch, T tokens, S cache slots, D model width, F MLP width, H query heads, K KV heads,
Q = H / K, E head dim, V vocab (CONVENTIONS.md); `rope` takes any head count (`x_BxTxhxE`, h heads).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.kernels import cpu as cpu_kernels

Packed = dict[str, Any]
_FEW_QUERIES = 8  # at most this many query rows per KV head: decode-style attention (see attention)
_SUM_BLOCK = 16  # reduction block of XLA:CPU decode attention's multiply-adds (see _sum_products)
SUM_MAX_SLOTS = 512  # XLA:CPU decode's p.V as multiply-adds up to this many slots (32 blocks)
_MASK_VALUE = -1e30  # finite, so a row with every key masked gives a uniform softmax instead of NaN


def platform_select(*args, cpu, default):
    """cpu(*args) in a program lowered for CPU, default(*args) in one lowered for any other platform.

    The choice is made when the program is lowered for its target (never from the host's backend);
    both callables must return the same shapes and dtypes."""
    return jax.lax.platform_dependent(*args, cpu=cpu, default=default)


# ------------------------------------------------------------------ XLA primitives (every platform)
def rms_norm(x, weight, eps):
    """y = w * x / sqrt(mean(x^2) + eps), statistics in f32 (as HF Qwen3RMSNorm)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def rope_tables(positions_BxT, head_dim, theta):
    """(cos, sin) [B, T, 1, E] of the rotary angles pos * theta^(-2i/E), in f32 (as HF computes them);
    computed once per forward and shared by every layer.

    On CPU inside a conditional (a buffer XLA cannot fuse into its consumers), so that they are
    computed once: XLA:CPU otherwise fused cos and sin into every layer's q and k rotation."""
    def tables(positions):
        inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
        ang_BxTxE2 = positions.astype(jnp.float32)[..., None] * inv_freq
        ang = jnp.concatenate([ang_BxTxE2, ang_BxTxE2], axis=-1)[:, :, None, :]
        return jnp.cos(ang), jnp.sin(ang)

    def cpu(positions):  # both branches are `tables`: the result never depends on the predicate
        return jax.lax.cond(jnp.any(positions != 0), tables, tables, positions)
    return platform_select(positions_BxT, cpu=cpu, default=tables)


def rope(x_BxTxhxE, tables):
    """Rotary embedding, half-split layout (HF `rotate_half`): x cos + rotate_half(x) sin."""
    cos, sin = (t.astype(x_BxTxhxE.dtype) for t in tables)
    x1, x2 = jnp.split(x_BxTxhxE, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BxTxhxE * cos + rotated * sin


def _dot_f32(a, b, dims):
    """dot_general in the promoted dtype of a and b, accumulated and returned in f32."""
    dt = jnp.promote_types(a.dtype, b.dtype)
    return jax.lax.dot_general(a.astype(dt), b.astype(dt), (dims, ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x, w, out_dtype=None):
    """y[..., o...] = sum_i x[..., i] w[i, o...]: a projection (w's first axis contracts x's last).

    The same product as `jnp.einsum`; only the backward is written out, as two plain GEMMs over the
    flattened tokens (dx = dy w^T, dw = x^T dy): autodiff's transpose of the einsum made XLA:CPU copy
    every activation gradient into a transposed layout for the weight-gradient dot."""
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


def _sum_products(a, b):
    """sum over axis -2 of a * b (broadcast), as a sum of blocks of `_SUM_BLOCK` along that axis.

    XLA:CPU fuses each block's multiply with its reduction (vectorised along the last axis), where it
    runs decode's tiny batched dots at a few GFLOP/s. CPU programs only: elsewhere `dot_general`."""
    n = a.shape[-2]
    return sum(jnp.sum(a[..., i:i + _SUM_BLOCK, :] * b[..., i:i + _SUM_BLOCK, :], axis=-2)
               for i in range(0, n, _SUM_BLOCK))


def _batched_dot(a_BxKxMxC, b_BxKxCxN):
    """[B, K, M, C] @ [B, K, C, N] -> [B, K, M, N], accumulated in f32 (one GEMM per row and KV head)."""
    return jax.lax.dot_general(a_BxKxMxC, b_BxKxCxN, (((3,), (2,)), ((0, 1), (0, 1))),
                               preferred_element_type=jnp.float32)


def attention(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window: Optional[int] = None, traced_window=None):
    """softmax(q k^T / sqrt(E) + mask) v over the first `window` slots of keys kt [B, K, E, S] and values
    v [B, K, S, E]; returns [B, T, H, E]. With `window`, the caller guarantees every live slot lies below it.
    `traced_window` (int32 scalar): the same over the first `traced_window` slots without slicing (slots
    past it weigh exactly 0, even in a row whose every slot is masked): the CPU kernel's gradient.

    Scores and p.V are `dot_general`s; with at most `_FEW_QUERIES` query rows per KV head (decoding), a
    program lowered for CPU computes them as blocked multiply-adds instead (`_sum_products`)."""
    if window is not None:
        kt_all, v_all, mask_BxTxS = kt_all[..., :window], v_all[:, :, :window], mask_BxTxS[..., :window]
    q = q_BxTxHxE
    kt_all, v_all = kt_all.astype(q.dtype), v_all.astype(q.dtype)
    b, t = q.shape[:2]
    k, g, e = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
    q = q.reshape(b, t, k, g, e).transpose(0, 2, 3, 1, 4)  # [B, K, Q, T, E]
    few = t * g <= _FEW_QUERIES

    def scores_dot(q, kt):
        return _batched_dot(q.reshape(b, k, g * t, e), kt).reshape(b, k, g, t, -1)

    def scores_sum(q, kt):  # multiply-adds over E with S as the vector axis (keys stored [.., E, S])
        return _sum_products(q.astype(jnp.float32)[..., None], kt[:, :, None, None].astype(jnp.float32))

    scores = platform_select(q, kt_all, cpu=scores_sum, default=scores_dot) if few else scores_dot(q, kt_all)
    scores = scores * (e ** -0.5)
    scores = jnp.where(mask_BxTxS[:, None, None], scores, _MASK_VALUE)
    if traced_window is not None:  # below every masked score: exp(-2e30 - max) = 0 whatever the row's max
        scores = jnp.where(jnp.arange(scores.shape[-1]) < traced_window, scores, 2 * _MASK_VALUE)
    # softmax(scores) @ V with the normalisation after the product: the division touches [T, E] per
    # head instead of [T, S]. The shift only keeps exp in range (its gradient is exactly 0).
    unnorm = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    denom = jnp.sum(unnorm, axis=-1)  # [B, K, Q, T]

    def pv_dot(p, v):
        return _batched_dot(p.astype(v.dtype).reshape(b, k, g * t, -1), v).reshape(b, k, g, t, e)

    def pv_sum(p, v):  # multiply-adds over S, E the vector axis (values stored [.., S, E])
        return _sum_products(p[..., None], v[:, :, None, None].astype(jnp.float32))

    if few and v_all.shape[2] <= SUM_MAX_SLOTS:  # past a few hundred slots the program grows: a dot
        out = platform_select(unnorm, v_all, cpu=pv_sum, default=pv_dot)
    else:
        out = pv_dot(unnorm, v_all)
    out = out.transpose(0, 3, 1, 2, 4)
    out = (out / denom.transpose(0, 3, 1, 2)[..., None]).astype(v_all.dtype)
    return out.reshape(b, t, cfg.num_attention_heads, e)


# ------------------------------------------------------------------ the seam: XLA or the CPU kernels
def kernels_built() -> bool:
    """Whether the CPU kernels are built and registered on this host (they run only in CPU programs)."""
    return cpu_kernels.available()


def _f32(*arrays) -> bool:
    return all(a.dtype == jnp.float32 for a in arrays)


def packed_weights(params, cfg) -> Optional[Packed]:
    """The projection weights as column panels for the CPU GEMM kernel (`cpu.rows_matmul`), for
    `qwen3.forward(..., packed=)`; None where the kernels are not built or the weights are not f32.

    The same shapes on every platform: the panels by the packing kernel in a CPU program, by XLA
    elsewhere (where nothing reads them, so the compiler drops them). Packing copies every weight
    once: call it outside a token loop (as `generate.decode` and the rollout do)."""
    if not kernels_built() or not _f32(*jax.tree.leaves(params)):
        return None

    def build(pack, params):
        layers = []
        for i in range(cfg.num_hidden_layers):
            attn, mlp_p = params["layers"][i]["attn"], params["layers"][i]["mlp"]
            qkv_w = [attn[name].reshape(cfg.hidden_size, -1) for name in ("q_proj", "k_proj", "v_proj")]
            layers.append({"qkv_proj": pack(*qkv_w), "o_proj": pack(attn["o_proj"].reshape(-1, cfg.hidden_size)),
                           "gate_up_proj": pack(mlp_p["gate_proj"], mlp_p["up_proj"]),
                           "down_proj": pack(mlp_p["down_proj"])})
        head = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
        return {"layers": layers, "lm_head": pack(head)}
    return platform_select(params, cpu=functools.partial(build, cpu_kernels.pack_panels),
                           default=functools.partial(build, pack_panels_xla))


def pack_panels_xla(*ws_KxN):
    """`cpu.pack_panels` in XLA ops (the same flat layout): the non-CPU branch of `packed_weights`."""
    w = jnp.concatenate([x.astype(jnp.float32) for x in ws_KxN], axis=1)
    k, n = w.shape
    p = cpu_kernels.PANEL
    full = n // p * p
    panels = w[:, :full].reshape(k, full // p, p).transpose(1, 0, 2).reshape(-1)
    return jnp.concatenate([panels, w[:, full:].reshape(-1)])


def head_copy(params, cfg) -> Optional[Packed]:
    """For decoding without packed weights: a tied head's [D, V] copy, which a CPU program's unembedding
    reads (XLA:CPU's dot with the transposed [V, D] embedding ran ~2x slower); other programs read the
    embedding and drop the copy. None for an untied model."""
    if not cfg.tie_word_embeddings:
        return None
    return {"head_DxV": params["embed"].T}


def _rows_matmul(x_BxTxI, packed_w, out_dims: tuple[int, ...], n_valid_B=None):
    """x @ w by the CPU GEMM kernel over each row's first n_valid tokens (others 0): [B, T, *out_dims]."""
    b, t = x_BxTxI.shape[:2]
    n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
    y = cpu_kernels.rows_matmul(x_BxTxI, n, packed_w, int(np.prod(out_dims)))
    return y.reshape((b, t) + tuple(out_dims)).astype(x_BxTxI.dtype)


def qkv(cfg, p_attn, x_BxTxD, tables, query_index=None, prep=None, n_valid_B=None):
    """(q [B, Tq, H, E], k [B, T, K, E], v [B, T, K, E]): the projections (and biases), the q/k RMS norms
    and RoPE; Tq = 1 with `query_index` [B] (that token per row), else T. With `prep` (a layer of
    `packed_weights`), a CPU program computes q, k, v in one kernel call on [q | k | v] panels and the
    norms and rotation in one pass, for each row's first n_valid tokens only (later ones are 0)."""
    h, kv, e, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    norm = lambda x, name: rms_norm(x, p_attn[name]["weight"].astype(x.dtype), eps)  # noqa: E731

    def biased(q, k, v):
        if not cfg.attention_bias:
            return q, k, v
        return q + p_attn["q_bias"], k + p_attn["k_bias"], v + p_attn["v_bias"]

    def xla(x, tables):
        x_q, tables_q = x, tables
        if query_index is not None:
            x_q, tables_q = rows(x, query_index), tuple(rows(r, query_index) for r in tables)
        q, k, v = biased(dense(x_q, p_attn["q_proj"]), dense(x, p_attn["k_proj"]), dense(x, p_attn["v_proj"]))
        return rope(norm(q, "q_norm"), tables_q), rope(norm(k, "k_norm"), tables), v

    if prep is None:
        return xla(x_BxTxD, tables)

    def cpu(x, tables):
        fused = _rows_matmul(x, prep["qkv_proj"], (h + 2 * kv, e), n_valid_B)
        q, k, v = biased(*jnp.split(fused, (h, h + kv), axis=2))
        if cfg.attention_bias:
            q, k = rope(norm(q, "q_norm"), tables), rope(norm(k, "k_norm"), tables)
        else:  # q/k norms and rotation in one kernel pass (five XLA fusions per layer otherwise)
            b, t = fused.shape[:2]
            q, k = cpu_kernels.norm_rope(
                fused, jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B,
                p_attn["q_norm"]["weight"], p_attn["k_norm"]["weight"], tables[0].reshape(b, t, e),
                tables[1].reshape(b, t, e), eps, h)
        q = q if query_index is None else rows(q, query_index)
        return q.astype(x.dtype), k.astype(x.dtype), v.astype(x.dtype)
    return platform_select(x_BxTxD, tables, cpu=cpu, default=xla)


def attend_cached(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window: Union[int, KVWindows, None] = None,
                  n_valid_B=None):
    """`attention` over a KV cache, over its first `window` slots (a static size or a `KVWindows` choice).

    XLA: a `lax.switch` over a `KVWindows`' sizes (the branches only read the cache, updated by the
    caller outside the switch). A CPU program with the kernels built and f32 operands runs the fused
    kernel instead (`cpu.attention`: scores, softmax and values in one pass per (row, KV head); it reads
    the window at run time, so it needs no branch per size; with `n_valid_B` it skips each row's
    padded queries, whose outputs are 0)."""
    def xla(q, kt, v, mask):
        if isinstance(window, KVWindows):
            branches = [functools.partial(attention, cfg, window=w) for w in window.sizes]
            return jax.lax.switch(window.index, branches, q, kt, v, mask)
        return attention(cfg, q, kt, v, mask, window)

    if not (kernels_built() and q_BxTxHxE.shape[-1] % 8 == 0 and _f32(q_BxTxHxE, kt_all, v_all)):
        return xla(q_BxTxHxE, kt_all, v_all, mask_BxTxS)

    def cpu(q, kt, v, mask):
        if isinstance(window, KVWindows):
            size = jnp.asarray(window.sizes, jnp.int32)[window.index]
        else:
            size = kt.shape[-1] if window is None else window
        return cpu_kernels.attention(q, kt, v, mask, size, functools.partial(attention, cfg), n_valid_B)
    return platform_select(q_BxTxHxE, kt_all, v_all, mask_BxTxS, cpu=cpu, default=xla)


def project(x_BxTxI, w, prep_w=None, n_valid_B=None):
    """x @ w (w [I, *out]) -> [B, T, *out]; with `prep_w` (w's panels) a CPU program uses the GEMM
    kernel over each row's first n_valid tokens (later ones are 0)."""
    if prep_w is None:
        return dense(x_BxTxI, w)
    return platform_select(x_BxTxI, cpu=lambda x: _rows_matmul(x, prep_w, w.shape[1:], n_valid_B),
                           default=lambda x: dense(x, w))


def mlp(p_mlp, x_BxTxD, prep=None, n_valid_B=None):
    """SwiGLU: (silu(x @ gate) * (x @ up)) @ down. With `prep`, a CPU program uses the kernels: one fused
    call for many rows (the [rows, 2F] intermediate stays in cache), two panel products for decode steps."""
    def xla(x):
        return dense(jax.nn.silu(dense(x, p_mlp["gate_proj"])) * dense(x, p_mlp["up_proj"]), p_mlp["down_proj"])

    if prep is None:
        return xla(x_BxTxD)
    f, d = p_mlp["down_proj"].shape

    def cpu(x):
        b, t = x.shape[:2]
        if t > 1 and f % 8 == 0:
            n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
            return cpu_kernels.mlp(x, n, prep["gate_up_proj"], prep["down_proj"]).astype(x.dtype)
        gate, up = jnp.split(_rows_matmul(x, prep["gate_up_proj"], (2 * f,), n_valid_B), 2, axis=-1)
        return _rows_matmul(jax.nn.silu(gate) * up, prep["down_proj"], (d,), n_valid_B)
    return platform_select(x_BxTxD, cpu=cpu, default=xla)


def unembed(cfg, params, h_BxTxD, prep=None, n_valid_B=None):
    """Logits [B, T, V] in f32. With `prep` holding the head's panels (`packed_weights`) or a tied
    head's [D, V] copy (`head_copy`), a CPU program reads those instead of the weights."""
    def xla(h):
        if cfg.tie_word_embeddings:
            return dense_transposed(h, params["embed"], jnp.float32)
        return dense(h, params["lm_head"], jnp.float32)

    if prep is not None and "lm_head" in prep:
        cpu = lambda h: _rows_matmul(h, prep["lm_head"], (cfg.vocab_size,), n_valid_B).astype(jnp.float32)  # noqa: E731
    elif prep is not None and "head_DxV" in prep:
        cpu = lambda h: dense(h, prep["head_DxV"], jnp.float32)  # noqa: E731
    else:
        return xla(h_BxTxD)
    return platform_select(h_BxTxD, cpu=cpu, default=xla)
