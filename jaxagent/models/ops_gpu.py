"""The CUDA branch of the compute seam (`ops`): attention over many queries as cuDNN's fused (flash) kernel.

A program lowered for an NVIDIA GPU runs `ops.causal_attention` and `ops.attend_cached` over at least
`FUSED_MIN_QUERIES` queries as `jax.nn.dot_product_attention(implementation="cudnn")`: one `__cudnn$fmha*` custom
call per layer (forward, and backward under `jax.grad`) that never writes the [B, H, T, S] scores to memory, which
the dense `ops.attention` materialises in f32. The kernel's own causal mask serves a plain causal mask; any other
mask (a cached append's per-row history, padding) becomes its additive bias, [B, 1, T, S] in the compute dtype.
The dense branch stays for what the kernel does not take: f32 operands (it runs bf16 / f16), head dims above 128 or
not a multiple of 8, and fewer than `FUSED_MIN_QUERIES` queries (a decode step). jax traces every platform's branch,
and tracing the kernel needs the CUDA plugin and cuDNN on the lowering host: without them (`available()` False) a
GPU program runs the dense branch (the GPU preflight says so). The bytes of each form, and why a decode step stays
dense: docs/aot.md, "GPU targets" (Fused attention).

Legend: B batch, T queries, S key slots, H query heads, K KV heads, E head dim (CONVENTIONS.md).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Fewest queries per row for the fused kernel. Dense scores take H x T x 4 bytes per key slot and row; the slot-major
# key copy the kernel needs takes K x E x 2: equal at T = E K / (2 H) (32 for Qwen3's E 128, H = 2 K), so from 128
# queries the dense scores are at least 4x the copy and grow with T while the copy does not.
FUSED_MIN_QUERIES = 128
MAX_HEAD_DIM = 128  # jax checks the head dim against 128 unless it sees a Hopper device (none on a compiling host)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process can trace cuDNN attention (the CUDA plugin and a cuDNN library are installed: jax asks
    cuDNN its version while tracing). Says nothing about a GPU being present."""
    q = jax.ShapeDtypeStruct((1, FUSED_MIN_QUERIES, 1, 8), jnp.bfloat16)
    try:
        jax.eval_shape(lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation="cudnn"), q)
    except Exception:  # noqa: BLE001 - any failure means the kernel cannot be built here
        return False
    return True


def fusable(q_BxTxHxE, slots: int) -> bool:
    """Whether attention of these queries (static shape and dtype) over `slots` key slots goes to the fused kernel
    in a CUDA program."""
    t, e = q_BxTxHxE.shape[1], q_BxTxHxE.shape[-1]
    return (q_BxTxHxE.dtype in (jnp.bfloat16, jnp.float16) and t >= FUSED_MIN_QUERIES and e % 8 == 0
            and e <= MAX_HEAD_DIM and slots >= 1 and available())


def kernel_args(q_BxTxHxE, kt_BxKxExS, v_BxKxSxE, mask_BxTxS, causal_only: bool):
    """The arguments of `jax.nn.dot_product_attention` for the model's layout: (query [B, T', H, E], key and value
    [B, S', K, E] in the query's dtype, mask [B, 1, T', S'] or None, is_causal). `causal_only`: `mask_BxTxS` is
    exactly key slot <= query index (T = S), the kernel's own causal mask (T' = T, S' = S). Otherwise the mask is
    the kernel's bias, whose backward takes even lengths only: an odd T gets one more query (every key masked:
    its output is dropped), an odd S one more key slot (masked for every query: weight exactly 0)."""
    dt = q_BxTxHxE.dtype
    k = kt_BxKxExS.astype(dt).transpose(0, 3, 1, 2)
    v = v_BxKxSxE.astype(dt).transpose(0, 2, 1, 3)
    if causal_only:
        return q_BxTxHxE, k, v, None, True
    t, s = q_BxTxHxE.shape[1] % 2, k.shape[1] % 2
    q = jnp.pad(q_BxTxHxE, ((0, 0), (0, t), (0, 0), (0, 0)))
    k, v = (jnp.pad(x, ((0, 0), (0, s), (0, 0), (0, 0))) for x in (k, v))
    mask = jnp.pad(mask_BxTxS.astype(bool), ((0, 0), (0, t), (0, s)))
    return q, k, v, mask[:, None], False


def attention(q_BxTxHxE, kt_BxKxExS, v_BxKxSxE, mask_BxTxS, *, causal_only: bool = False,
              implementation: str = "cudnn"):
    """softmax(q k^T / sqrt(E) + mask) v as `ops.attention` computes it, by `jax.nn.dot_product_attention`
    (`implementation` 'cudnn': the fused kernel; 'xla': jax's own, the same arguments on any platform). Query
    head h reads KV head h // (H / K) in both. Returns [B, T, H, E] in the query's dtype."""
    q, k, v, mask, causal = kernel_args(q_BxTxHxE, kt_BxKxExS, v_BxKxSxE, mask_BxTxS, causal_only)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal, implementation=implementation)
    return out[:, :q_BxTxHxE.shape[1]]
