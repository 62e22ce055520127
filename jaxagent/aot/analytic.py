"""Analytic matmul FLOPs of Qwen3 passes: the targets a compiled program's counted FLOPs are compared with.

Dense attention is counted in full (every query against every key or cache slot, the causally masked half
included): what a dense implementation computes.

Dimension legend (CONVENTIONS.md): S cache slots, V vocab, D model width, H query heads, E head dim.
"""
from __future__ import annotations

from typing import Optional


def analytic_flops(cfg, rows: int, seq: int, *, backward: bool, remat: Optional[str] = None,
                   unembed_positions: Optional[int] = None, recompute_unembed: bool = False) -> float:
    """Matmul FLOPs of a (forward or training) pass over rows x seq tokens, all chips together.

    forward = 2 N_layers tokens + dense attention 2 x 2 n_layers H E seq^2 per row (scores and p.V over every
    key, the causally masked half included: what a dense implementation computes) + 2 D V per unembedded
    position; training = 3x forward (Kaplan et al. 2020, 6N per token) + one more forward of the layers
    with remat (recomputed in the backward) and of the unembedding when it is recomputed per chunk.
    N_layers: the parameters of the decoder blocks (`Qwen3Config.num_params` without embeddings)."""
    d, v = cfg.hidden_size, cfg.vocab_size
    n_emb = v * d * (1 if cfg.tie_word_embeddings else 2)
    n_layers = cfg.num_params() - n_emb - d
    tokens = rows * seq
    attn = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * rows * seq * seq
    layers = 2 * n_layers * tokens + attn
    head = 2 * d * v * (tokens if unembed_positions is None else unembed_positions)
    if not backward:
        return layers + head
    return 3 * (layers + head) + (layers if remat else 0.0) + (head if recompute_unembed else 0.0)


def _layer_matmul_params(cfg) -> tuple[int, int]:
    """(q/k/v projection, o_proj + MLP) weights of one decoder block."""
    d, e = cfg.hidden_size, cfg.head_dim
    qkv = d * e * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    return qkv, cfg.num_attention_heads * e * d + 3 * d * cfg.intermediate_size


def cached_forward_flops(cfg, rows: int, tokens: int, slots: int) -> float:
    """One cached forward of `tokens` new tokens per row returning one position's logits (`sampling.append`):
    2 x weights per token in every layer, except the last layer's queries, o_proj and MLP (one token per row);
    dense attention 2 x 2 H E slots per query and layer; 2 D V for the one unembedded position per row."""
    qkv, rest = _layer_matmul_params(cfg)
    n_l, h, e = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    q_full = (n_l - 1) * tokens + (1 if tokens > 1 else tokens)   # queries run per layer (last layer: 1)
    kv_tokens = n_l * tokens
    q_w = cfg.hidden_size * h * e                                   # the query part of qkv
    proj = 2 * ((qkv - q_w) * kv_tokens + (q_w + rest) * q_full)
    attn = 2 * 2 * h * e * slots * q_full
    return float(rows * (proj + attn + 2 * cfg.hidden_size * cfg.vocab_size))
