"""The model's compute seam: the operations of `qwen3` whose best implementation depends on the platform.

`qwen3` is one XLA model written against these functions: `rope_tables`, `qkv` (projections, q/k norms, RoPE),
`attention` / `causal_attention` / `attend_cached` (attention; over a sequence's own tokens; over a KV cache),
`out_proj`, `mlp` and `unembed`. Each is the plain XLA computation (`primitives`) on every platform; a program
lowered for CPU runs the CPU branch instead (`ops_cpu`: XLA:CPU tuning, and the compiled kernels where they are
built), and one lowered for an NVIDIA GPU runs attention over many queries as cuDNN's fused kernel (`ops_gpu`),
chosen by `platform_select` at LOWERING time (`jax.lax.platform_dependent`): the branches have the same shapes and
dtypes, so a program lowered for TPU contains only the XLA branch, whatever this host has built. `prepare(params,
cfg)` adds the weights' kernel layouts to the params pytree (under `PREPARED` keys that only this module reads),
and `tokens` bundles what every layer shares about the tokens (RoPE tables, valid tokens per row). Why the choice
is made at lowering time: docs/performance.md, "Optimisations".

Legend: B batch, T tokens, S cache slots, D model width, F MLP width, H query heads, K KV heads,
Q = H / K, E head dim, V vocab (CONVENTIONS.md).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from jaxagent.models import ops_cpu, ops_gpu, primitives
from jaxagent.models.primitives import (KVWindows, batched_dot, choose_window, dense, dense_transposed,  # noqa: F401
                                        rms_norm, rope, rows)

PREPARED = "prepared"  # the key of what `prepare` adds to the params pytree (and to a layer's attn / mlp)
MASK_VALUE = -1e30  # finite, so a row with every key masked gives a uniform softmax instead of NaN


def platform_select(*args, cpu, default, cuda=None):
    """cpu(*args) in a program lowered for CPU, cuda(*args) (where given) in one lowered for an NVIDIA GPU,
    default(*args) in one lowered for any other platform.

    The choice is made when the program is lowered for its target (never from the host's backend);
    the callables must return the same shapes and dtypes."""
    branches = {"cpu": cpu} if cuda is None else {"cpu": cpu, "cuda": cuda}
    return jax.lax.platform_dependent(*args, default=default, **branches)


def _f32(*arrays) -> bool:
    return all(a.dtype == jnp.float32 for a in arrays)


# ------------------------------------------------------------------ prepared weights, token-side values
def prepare(params, cfg, *, decoding: bool = False):
    """`params` plus what a CPU program reads beside the weights, for the model's functions to take in
    place of `params` (same logits); params already prepared pass through.

    f32 weights: the projections in the layout a CPU program's projections read (`ops_cpu.prepare`: the
    GEMM kernel's column panels, or row-major [q | k | v] and [gate | up] matrices where the kernels are
    not built), which then compute only each row's valid tokens of a cached append. Other platforms'
    programs build the same shapes by XLA and never read them (the compiler drops them).
    `decoding`, other dtypes: a tied head's [D, V] copy (`ops_cpu.head_copy`) for a CPU program's
    unembedding. Building copies every weight once: call it outside a token loop."""
    if PREPARED in params:
        return params
    if _f32(*jax.tree.leaves(params)):
        packed = platform_select(params, cpu=functools.partial(ops_cpu.prepare, cfg=cfg),
                                 default=functools.partial(ops_cpu.panels, cfg=cfg, pack=ops_cpu.pack_panels_xla))
        src = params["layers"]  # {i: layer} (or a list)
        new = {i: {**src[i], "attn": {**src[i]["attn"], PREPARED: {"qkv_proj": w["qkv_proj"], "o_proj": w["o_proj"]}},
                   "mlp": {**src[i]["mlp"], PREPARED: {"gate_up_proj": w["gate_up_proj"], "down_proj": w["down_proj"]}}}
               for i, w in enumerate(packed["layers"])}
        layers = new if isinstance(src, dict) else [new[i] for i in range(len(src))]
        return {**params, "layers": layers, PREPARED: {"lm_head": packed["lm_head"]}}
    head = ops_cpu.head_copy(params, cfg) if decoding else None
    return params if head is None else {**params, PREPARED: {"head_DxV": head}}


class Tokens(NamedTuple):
    """What every layer's operations share about the tokens of one forward pass (see `tokens`)."""
    rope: tuple  # (cos, sin) [B, T, 1, E] (`rope_tables`)
    n_valid: Optional[jax.Array]  # int32 [B]: tokens the CPU kernels compute per row (later ones 0); None: all


def tokens(params, rope_tables_BxT, n_valid_B=None) -> Tokens:
    """The token-side value of a forward over `params`: `n_valid_B` (the valid tokens per row of a cached
    append, or None) is kept only where prepared weights let the CPU kernels skip the rest."""
    layers = params["layers"]
    return Tokens(rope_tables_BxT, n_valid_B if layers and PREPARED in layers[0]["attn"] else None)


def at_query(tok: Tokens, query_index) -> Tokens:
    """`tok` after `rows(x, query_index)` kept one token per row: 1 valid where any was valid."""
    if tok.n_valid is None or query_index is None:
        return tok
    return tok._replace(n_valid=(tok.n_valid > 0).astype(jnp.int32))


# ------------------------------------------------------------------ the seam's operations
def rope_tables(positions_BxT, head_dim, theta):
    """(cos, sin) [B, T, 1, E] (`primitives.rope_tables`), computed once per forward and shared by every
    layer (a CPU program: `ops_cpu.rope_tables_once`)."""
    tables = functools.partial(primitives.rope_tables, head_dim=head_dim, theta=theta)
    return platform_select(positions_BxT, cpu=functools.partial(ops_cpu.rope_tables_once, tables), default=tables)


def attention(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window: Optional[int] = None, traced_window=None):
    """softmax(q k^T / sqrt(E) + mask) v over the first `window` slots of keys kt [B, K, E, S] and values
    v [B, K, S, E]; returns [B, T, H, E]. With `window`, the caller guarantees every live slot lies below it.
    `traced_window` (int32 scalar): the same over the first `traced_window` slots without slicing (slots
    past it weigh exactly 0, even in a row whose every slot is masked): the CPU kernel's gradient.

    Scores and p.V are `dot_general`s; decode-shaped attention (`ops_cpu.decode_sums`) in a program
    lowered for CPU computes them as blocked multiply-adds instead (`ops_cpu.scores_sum`, `pv_sum`)."""
    if window is not None:
        kt_all, v_all, mask_BxTxS = kt_all[..., :window], v_all[:, :, :window], mask_BxTxS[..., :window]
    q = q_BxTxHxE
    kt_all, v_all = kt_all.astype(q.dtype), v_all.astype(q.dtype)
    b, t = q.shape[:2]
    k, g, e = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
    q = q.reshape(b, t, k, g, e).transpose(0, 2, 3, 1, 4)  # [B, K, Q, T, E]

    def scores_dot(q, kt):
        return batched_dot(q.reshape(b, k, g * t, e), kt).reshape(b, k, g, t, -1)

    if ops_cpu.decode_sums(t * g):
        scores = platform_select(q, kt_all, cpu=ops_cpu.scores_sum, default=scores_dot)
    else:
        scores = scores_dot(q, kt_all)
    scores = scores * (e ** -0.5)
    scores = jnp.where(mask_BxTxS[:, None, None], scores, MASK_VALUE)
    if traced_window is not None:  # below every masked score: exp(-2e30 - max) = 0 whatever the row's max
        scores = jnp.where(jnp.arange(scores.shape[-1]) < traced_window, scores, 2 * MASK_VALUE)
    # softmax(scores) @ V with the normalisation after the product: the division touches [T, E] per
    # head instead of [T, S]. The shift only keeps exp in range (its gradient is exactly 0).
    unnorm = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    denom = jnp.sum(unnorm, axis=-1)  # [B, K, Q, T]

    def pv_dot(p, v):
        return batched_dot(p.astype(v.dtype).reshape(b, k, g * t, -1), v).reshape(b, k, g, t, e)

    if ops_cpu.decode_sums(t * g, v_all.shape[2]):
        out = platform_select(unnorm, v_all, cpu=ops_cpu.pv_sum, default=pv_dot)
    else:
        out = pv_dot(unnorm, v_all)
    out = out.transpose(0, 3, 1, 2, 4)
    out = (out / denom.transpose(0, 3, 1, 2)[..., None]).astype(v_all.dtype)
    return out.reshape(b, t, cfg.num_attention_heads, e)


CAUSAL_BLOCK = 128  # queries per block of `causal_attention`'s CPU branch


def causal_attention(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxT, causal_only: bool = False):
    """`attention` of T queries over the same T tokens (keys kt [B, K, E, T], values v [B, K, T, E]) whose mask
    is causal: query t sees no key after t (`mask_BxTxT` may hide more, e.g. padding; `causal_only`: it hides
    nothing more). Returns [B, T, H, E].

    A program lowered for CPU runs the queries in blocks of `CAUSAL_BLOCK`, each over the keys up to its block's
    end only: every later key is masked for the whole block, so its weight is exactly 0 in the dense softmax and
    leaving it out changes only the f32 rounding of the sums. The score tensors (and their exp, max and sum, the
    backward's too, which XLA:CPU streams through memory) shrink from T x T to about T x (T + CAUSAL_BLOCK) / 2
    per head. A program lowered for an NVIDIA GPU runs cuDNN's fused kernel where it takes the shapes
    (`ops_gpu.fusable`; its own causal mask with `causal_only`, else `mask_BxTxT` as its bias). Other platforms'
    programs run the dense `attention`."""
    t = q_BxTxHxE.shape[1]
    dense_fn = functools.partial(attention, cfg)
    if t <= CAUSAL_BLOCK:
        return dense_fn(q_BxTxHxE, kt_all, v_all, mask_BxTxT)
    fused = functools.partial(ops_gpu.attention, causal_only=causal_only)

    def blocked(q, kt, v, mask):
        return jnp.concatenate([attention(cfg, q[:, s:s + CAUSAL_BLOCK], kt[..., :s + CAUSAL_BLOCK],
                                          v[:, :, :s + CAUSAL_BLOCK], mask[:, s:s + CAUSAL_BLOCK, :s + CAUSAL_BLOCK])
                                for s in range(0, t, CAUSAL_BLOCK)], axis=1)

    return platform_select(q_BxTxHxE, kt_all, v_all, mask_BxTxT, cpu=blocked, default=dense_fn,
                           cuda=fused if ops_gpu.fusable(q_BxTxHxE, t) else None)


def qkv(cfg, p_attn, x_BxTxD, tok: Tokens, query_index=None):
    """(q [B, Tq, H, E], k [B, T, K, E], v [B, T, K, E]): the projections (and biases), the q/k RMS norms
    and RoPE (`tok.rope`); Tq = 1 with `query_index` [B] (that token per row), else T. With prepared
    weights (`prepare`), a CPU program runs `ops_cpu.qkv` (one GEMM; later tokens 0)."""
    eps = cfg.rms_norm_eps
    norm = lambda x, name: rms_norm(x, p_attn[name]["weight"].astype(x.dtype), eps)  # noqa: E731

    def xla(x, tables):
        x_q, tables_q = x, tables
        if query_index is not None:
            x_q, tables_q = rows(x, query_index), tuple(rows(r, query_index) for r in tables)
        q, k, v = dense(x_q, p_attn["q_proj"]), dense(x, p_attn["k_proj"]), dense(x, p_attn["v_proj"])
        if cfg.attention_bias:
            q, k, v = q + p_attn["q_bias"], k + p_attn["k_bias"], v + p_attn["v_bias"]
        return rope(norm(q, "q_norm"), tables_q), rope(norm(k, "k_norm"), tables), v

    prep = p_attn.get(PREPARED)
    if prep is None:
        return xla(x_BxTxD, tok.rope)
    cpu = lambda x, tables: ops_cpu.qkv(cfg, p_attn, prep, x, tables, query_index, tok.n_valid)  # noqa: E731
    return platform_select(x_BxTxD, tok.rope, cpu=cpu, default=xla)


def attend_cached(cfg, q_BxTxHxE, kt_all, v_all, mask_BxTxS, window: Union[int, KVWindows, None] = None,
                  tok: Optional[Tokens] = None):
    """`attention` over a KV cache, over its first `window` slots (a static size or a `KVWindows` choice).

    XLA: a `lax.switch` over a `KVWindows`' sizes (the branches only read the cache, updated by the
    caller outside the switch). A CPU program with f32 operands runs `ops_cpu.attend` instead (the fused
    kernel where built: it reads the window at run time, so it needs no branch per size; with
    `tok.n_valid` each row's padded queries give 0). A program lowered for an NVIDIA GPU runs cuDNN's
    fused kernel over each window where it takes the shapes (`ops_gpu.fusable`: bf16 / f16 and at least
    `ops_gpu.FUSED_MIN_QUERIES` queries, so never a decode step), the mask as its bias."""
    def windowed(attend):  # `attend` over the first w slots of a static window, or each of a KVWindows' sizes
        def over(w):
            return lambda q, kt, v, mask: attend(q, kt[..., :w], v[:, :, :w], mask[..., :w])

        def run(q, kt, v, mask):
            if isinstance(window, KVWindows):
                return jax.lax.switch(window.index, [over(w) for w in window.sizes], q, kt, v, mask)
            return attend(q, kt, v, mask) if window is None else over(window)(q, kt, v, mask)
        return run

    xla = windowed(functools.partial(attention, cfg))
    sizes = window.sizes if isinstance(window, KVWindows) else (kt_all.shape[-1] if window is None else window,)
    fused = all(ops_gpu.fusable(q_BxTxHxE, s) for s in sizes)
    if not (q_BxTxHxE.shape[-1] % 8 == 0 and _f32(q_BxTxHxE, kt_all, v_all)):
        if fused:
            return platform_select(q_BxTxHxE, kt_all, v_all, mask_BxTxS, cpu=xla, default=xla,
                                   cuda=windowed(ops_gpu.attention))
        return xla(q_BxTxHxE, kt_all, v_all, mask_BxTxS)
    n_valid = None if tok is None else tok.n_valid

    def cpu(q, kt, v, mask):
        if isinstance(window, KVWindows):
            size = jnp.asarray(window.sizes, jnp.int32)[window.index]
        else:
            size = kt.shape[-1] if window is None else window
        return ops_cpu.attend(q, kt, v, mask, size, functools.partial(attention, cfg), n_valid, xla)
    return platform_select(q_BxTxHxE, kt_all, v_all, mask_BxTxS, cpu=cpu, default=xla)


def out_proj(cfg, p_attn, x_BxTxI, tok: Tokens):
    """The attention output projection x @ o_proj ([H*E, D], one GEMM) -> [B, T, D]; with prepared
    weights a CPU program reads them (`ops_cpu.matmul`: `tok.n_valid` tokens per row)."""
    w = p_attn["o_proj"].reshape(-1, cfg.hidden_size)
    prep = p_attn.get(PREPARED)
    if prep is None:
        return dense(x_BxTxI, w)
    xla = lambda x: dense(x, w)  # noqa: E731
    cpu = lambda x: ops_cpu.matmul(x, prep["o_proj"], w.shape[1:], tok.n_valid)  # noqa: E731
    return platform_select(x_BxTxI, cpu=cpu, default=xla)


def mlp(p_mlp, x_BxTxD, tok: Tokens):
    """SwiGLU: (silu(x @ gate) * (x @ up)) @ down. With prepared weights, a CPU program reads them
    (`ops_cpu.mlp`)."""
    def xla(x):
        return dense(jax.nn.silu(dense(x, p_mlp["gate_proj"])) * dense(x, p_mlp["up_proj"]), p_mlp["down_proj"])

    prep = p_mlp.get(PREPARED)
    if prep is None:
        return xla(x_BxTxD)
    cpu = lambda x: ops_cpu.mlp(prep, x, p_mlp["down_proj"].shape, tok.n_valid)  # noqa: E731
    return platform_select(x_BxTxD, cpu=cpu, default=xla)


def unembed(cfg, params, h_BxTxD, n_valid_B=None):
    """Logits [B, T, V] in f32. With prepared params a CPU program reads the prepared head instead
    (`ops_cpu.matmul`: only each row's first `n_valid_B` positions, others 0), or a tied head's [D, V] copy."""
    def xla(h):
        if cfg.tie_word_embeddings:
            return dense_transposed(h, params["embed"], jnp.float32)
        return dense(h, params["lm_head"], jnp.float32)

    prep = params.get(PREPARED)
    if prep is None:
        return xla(h_BxTxD)
    n_rows = None if n_valid_B is None else jnp.clip(n_valid_B.astype(jnp.int32), 0, h_BxTxD.shape[1])
    if "lm_head" in prep:
        cpu = lambda h: ops_cpu.matmul(h, prep["lm_head"], (cfg.vocab_size,), n_rows).astype(jnp.float32)  # noqa: E731
    else:
        cpu = lambda h: ops_cpu.unembed_head(h, prep["head_DxV"])  # noqa: E731
    return platform_select(h_BxTxD, cpu=cpu, default=xla)
