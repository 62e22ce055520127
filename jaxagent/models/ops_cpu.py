"""The CPU branch of the compute seam (`ops`): what a program lowered for CPU runs instead of the plain
XLA operations, and nothing any other platform's program contains.

Two kinds of CPU-only code live here: XLA:CPU tuning (the same math arranged as XLA:CPU runs it
fastest: decode attention as blocked multiply-adds, RoPE tables computed once, the unembedding's head
in a [D, V] layout) and the operations on prepared weights (`prepare`), by the compiled C++ kernels
(`jaxagent.kernels.cpu`) where they are built and by XLA:CPU otherwise. `kernels_built()` is asked
only here, while a CPU branch is traced, and both answers read the same values: it never shapes a
program lowered for another platform.

Legend: B batch, T tokens, S cache slots, D model width, F MLP width, H query heads, K KV heads,
E head dim, V vocab (CONVENTIONS.md).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.kernels import cpu as cpu_kernels
from jaxagent.models.primitives import dense, rms_norm, rope, rows

Panels = dict[str, Any]
FEW_QUERIES = 8  # at most this many query rows per KV head: decode-style attention (see `decode_sums`)
SUM_BLOCK = 16  # reduction block of decode attention's multiply-adds (see `sum_products`)
SUM_MAX_SLOTS = 512  # decode's p.V as multiply-adds up to this many slots (32 blocks); past it a dot


def kernels_built() -> bool:
    """Whether the CPU kernels are built and registered on this host (they run only in CPU programs)."""
    return cpu_kernels.available()


# ------------------------------------------------------------------ XLA:CPU tuning
def rope_tables_once(tables, positions_BxT):
    """`tables(positions)` inside a conditional (a buffer XLA cannot fuse into its consumers), so that
    they are computed once: XLA:CPU otherwise fused cos and sin into every layer's q and k rotation.
    Both branches are `tables`: the result never depends on the predicate."""
    return jax.lax.cond(jnp.any(positions_BxT != 0), tables, tables, positions_BxT)


def decode_sums(query_rows: int, slots: int | None = None) -> bool:
    """Whether decode attention with `query_rows` query rows per KV head (and, for p.V, `slots` cache
    slots) runs as blocked multiply-adds: XLA:CPU runs decode's tiny batched dots at a few GFLOP/s."""
    return query_rows <= FEW_QUERIES and (slots is None or slots <= SUM_MAX_SLOTS)


def sum_products(a, b):
    """sum over axis -2 of a * b (broadcast), as a sum of blocks of `SUM_BLOCK` along that axis.

    XLA:CPU fuses each block's multiply with its reduction (vectorised along the last axis)."""
    n = a.shape[-2]
    return sum(jnp.sum(a[..., i:i + SUM_BLOCK, :] * b[..., i:i + SUM_BLOCK, :], axis=-2)
               for i in range(0, n, SUM_BLOCK))


def scores_sum(q_BxKxQxTxE, kt_BxKxExS):
    """Attention scores [B, K, Q, T, S] as multiply-adds over E, S the vector axis (keys stored [.., E, S])."""
    return sum_products(q_BxKxQxTxE.astype(jnp.float32)[..., None], kt_BxKxExS[:, :, None, None].astype(jnp.float32))


def pv_sum(p_BxKxQxTxS, v_BxKxSxE):
    """p.V [B, K, Q, T, E] as multiply-adds over S, E the vector axis (values stored [.., S, E])."""
    return sum_products(p_BxKxQxTxS[..., None], v_BxKxSxE[:, :, None, None].astype(jnp.float32))


def head_copy(params, cfg):
    """A tied head's [D, V] copy, which XLA:CPU's unembedding reads ~2x faster than the transposed
    [V, D] embedding; None for an untied model."""
    if not cfg.tie_word_embeddings:
        return None
    return params["embed"].T


def unembed_head(h_BxTxD, head_DxV):
    """Logits [B, T, V] in f32 from a [D, V] head (`head_copy`)."""
    return dense(h_BxTxD, head_DxV, jnp.float32)


# ------------------------------------------------------------------ prepared weights
def panels(params, cfg, pack) -> Panels:
    """The projection weights as `pack` lays them out ({"layers": [per layer qkv_proj, o_proj,
    gate_up_proj, down_proj], "lm_head"}), each a flat f32 vector of the weight's size."""
    layers = []
    for i in range(cfg.num_hidden_layers):
        attn, mlp_p = params["layers"][i]["attn"], params["layers"][i]["mlp"]
        qkv_w = [attn[name].reshape(cfg.hidden_size, -1) for name in ("q_proj", "k_proj", "v_proj")]
        layers.append({"qkv_proj": pack(*qkv_w), "o_proj": pack(attn["o_proj"].reshape(-1, cfg.hidden_size)),
                       "gate_up_proj": pack(mlp_p["gate_proj"], mlp_p["up_proj"]),
                       "down_proj": pack(mlp_p["down_proj"])})
    head = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    return {"layers": layers, "lm_head": pack(head)}


def pack_panels_xla(*ws_KxN):
    """`cpu.pack_panels` in XLA ops (the same flat layout): the panels of a program for another platform,
    where nothing reads them (the compiler drops them)."""
    w = jnp.concatenate([x.astype(jnp.float32) for x in ws_KxN], axis=1)
    k, n = w.shape
    p = cpu_kernels.PANEL
    full = n // p * p
    panels_ = w[:, :full].reshape(k, full // p, p).transpose(1, 0, 2).reshape(-1)
    return jnp.concatenate([panels_, w[:, full:].reshape(-1)])


def pack_rows(*ws_KxN):
    """[w_1 | w_2 | ...] ([K, N], row-major) as a flat f32 vector: the prepared layout without the kernels
    (one GEMM for q, k, v and one for gate, up; a tied head as [D, V], see `head_copy`)."""
    return jnp.concatenate([x.astype(jnp.float32) for x in ws_KxN], axis=1).reshape(-1)


def prepare(params, cfg) -> Panels:
    """The CPU branch of `ops.prepare`: the kernels' panels where they are built, else `pack_rows`."""
    return panels(params, cfg, cpu_kernels.pack_panels if kernels_built() else pack_rows)


# ------------------------------------------------------------------ operations on prepared weights
# With the kernels: the compiled kernels. Without: the same results by XLA:CPU from `pack_rows`' layout,
# so the CPU branch reads the same values either way (and a program for another platform, which holds
# them without reading them, is the same whether or not this host built the kernels).
def zero_past(y_BxTx_, n_valid_B):
    """y with each row's tokens past its first n_valid set to 0 (the kernels' output there); None: y."""
    if n_valid_B is None:
        return y_BxTx_
    live = jnp.arange(y_BxTx_.shape[1])[None, :] < n_valid_B[:, None]
    return jnp.where(live.reshape(live.shape + (1,) * (y_BxTx_.ndim - 2)), y_BxTx_, 0)


def matmul(x_BxTxI, packed_w, out_dims: tuple[int, ...], n_valid_B=None):
    """x @ w for a prepared weight over each row's first n_valid tokens (later ones 0): [B, T, *out_dims]."""
    b, t = x_BxTxI.shape[:2]
    if not kernels_built():
        y = dense(x_BxTxI, packed_w.reshape(x_BxTxI.shape[-1], -1)).reshape((b, t) + tuple(out_dims))
        return zero_past(y, n_valid_B).astype(x_BxTxI.dtype)
    n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
    y = cpu_kernels.rows_matmul(x_BxTxI, n, packed_w, int(np.prod(out_dims)))
    return y.reshape((b, t) + tuple(out_dims)).astype(x_BxTxI.dtype)


def qkv(cfg, p_attn, prep, x_BxTxD, tables, query_index, n_valid_B):
    """q, k, v by one GEMM on the [q | k | v] weight and, with the kernels, the q/k norms and rotation in
    one kernel pass, for each row's first n_valid tokens only (later ones are 0); see `ops.qkv`."""
    h, kv, e, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    norm = lambda x, name: rms_norm(x, p_attn[name]["weight"].astype(x.dtype), eps)  # noqa: E731
    fused = matmul(x_BxTxD, prep["qkv_proj"], (h + 2 * kv, e), n_valid_B)
    q, k, v = jnp.split(fused, (h, h + kv), axis=2)
    if cfg.attention_bias:
        q, k, v = q + p_attn["q_bias"], k + p_attn["k_bias"], v + p_attn["v_bias"]
    if cfg.attention_bias or not kernels_built():
        q, k = rope(norm(q, "q_norm"), tables), rope(norm(k, "k_norm"), tables)
    else:  # q/k norms and rotation in one kernel pass (five XLA fusions per layer otherwise)
        b, t = fused.shape[:2]
        q, k = cpu_kernels.norm_rope(
            fused, jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B,
            p_attn["q_norm"]["weight"], p_attn["k_norm"]["weight"], tables[0].reshape(b, t, e),
            tables[1].reshape(b, t, e), eps, h)
    q = q if query_index is None else rows(q, query_index)
    return q.astype(x_BxTxD.dtype), k.astype(x_BxTxD.dtype), v.astype(x_BxTxD.dtype)


def attend(q_BxTxHxE, kt_all, v_all, mask_BxTxS, size, reference, n_valid_B, xla):
    """Cache attention over the first `size` slots (static or traced) by the fused kernel (scores,
    softmax and values in one pass per (row, KV head); `reference(q, kt, v, mask, traced_window=)` is
    the XLA attention its gradient runs), else `xla(q, kt, v, mask)`; each row's queries past n_valid
    give 0."""
    if not kernels_built():
        return zero_past(xla(q_BxTxHxE, kt_all, v_all, mask_BxTxS), n_valid_B)
    return cpu_kernels.attention(q_BxTxHxE, kt_all, v_all, mask_BxTxS, size, reference, n_valid_B)


def mlp(prep, x_BxTxD, down_shape, n_valid_B):
    """SwiGLU on prepared weights: with the kernels, one fused call for many rows (the [rows, 2F]
    intermediate stays in cache); decode steps and XLA:CPU: two products on [gate | up] and down."""
    f, d = down_shape
    b, t = x_BxTxD.shape[:2]
    if t > 1 and f % 8 == 0 and kernels_built():
        n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else n_valid_B
        return cpu_kernels.mlp(x_BxTxD, n, prep["gate_up_proj"], prep["down_proj"]).astype(x_BxTxD.dtype)
    gate, up = jnp.split(matmul(x_BxTxD, prep["gate_up_proj"], (2 * f,), n_valid_B), 2, axis=-1)
    return matmul(jax.nn.silu(gate) * up, prep["down_proj"], (d,), n_valid_B)
