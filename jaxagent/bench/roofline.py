"""Analytic FLOP and byte counts of Qwen3 programs, and the roofline fractions the benchmarks report.

Dimension legend (CONVENTIONS.md): B batch rows, T new tokens per row, S context slots already in the cache,
L layers (`n_layers`), D width, F MLP width, H query heads, K key/value heads, E head dim, V vocab.
Conventions (one per figure; the functions' docstrings say which):
  - matmul weights N_mm = L (2 D H E + 2 D K E + 3 D F) + V D, the unembedding included (lookups are not matmuls);
  - a forward pass costs 2 N_layers per token (N_layers = N_mm - V D), 2 V D per position whose logits are
    computed, and causal attention 4 L H E per (query, key) pair (scores and p.V), pairs = T S + T (T + 1) / 2;
  - a prefill (`prefill_flops`) counts what `sampling.append` computes: the last layer projects keys and values of
    all T tokens but runs the query, attention, o_proj and MLP for the last token only; one position unembedded;
  - a train step costs 6 N_mm per token + 12 L H E T per token (PaLM's model-FLOPs convention, Chowdhery et al.
    2022, App. B: backward twice the forward, attention over all T keys, remat's recompute not counted);
  - a decode step reads every weight once (N_mm + the norms, in the weights' dtype) and the cached keys and
    values of its context (2 L K E bytes-per-element per token of each row).
MFU = model FLOPs / time / peak FLOP/s; the HBM fraction = bytes read / time / HBM bytes/s.
"""
from __future__ import annotations

from typing import Optional

from jaxagent.models.config import Qwen3Config


def layer_matmul_params(cfg: Qwen3Config) -> int:
    """N_layers: the decoder blocks' matmul weights, L (2 D H E + 2 D K E + 3 D F)."""
    d, f, h, k, e = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                     cfg.num_key_value_heads, cfg.head_dim)
    return cfg.num_hidden_layers * (2 * d * h * e + 2 * d * k * e + 3 * d * f)


def matmul_params(cfg: Qwen3Config) -> int:
    """N_mm = N_layers + V D (the unembedding, tied or not)."""
    return layer_matmul_params(cfg) + cfg.vocab_size * cfg.hidden_size


def norm_params(cfg: Qwen3Config) -> int:
    """RMSNorm weights: two per layer of width D, q/k norms of width E per layer, the final norm."""
    return cfg.num_hidden_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size


def attention_pairs(new_tokens: int, context: int) -> int:
    """(query, key) pairs of T new tokens attending causally after S cached ones: T S + T (T + 1) / 2."""
    return new_tokens * context + new_tokens * (new_tokens + 1) // 2


def forward_flops(cfg: Qwen3Config, batch: int, new_tokens: int, context: int = 0,
                  logit_tokens: Optional[int] = None) -> float:
    """B x (2 N_layers T + 2 V D logit_tokens + 4 L H E pairs(T, S)); `logit_tokens` per row defaults to T
    (every position unembedded; a prefill that keeps only the last position's logits passes 1)."""
    logit_tokens = new_tokens if logit_tokens is None else logit_tokens
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * attention_pairs(new_tokens, context)
    return float(batch) * (2.0 * layer_matmul_params(cfg) * new_tokens
                           + 2.0 * cfg.vocab_size * cfg.hidden_size * logit_tokens + attn)


def prefill_flops(cfg: Qwen3Config, batch: int, tokens: int) -> float:
    """A prefill of B rows x T tokens into an empty cache, the last token's logits per row, as the program computes
    it (`qwen3.hidden_states(index=)`): B x (2 N_layer (L - 1) T + 2 W_kv T + 2 (W_q + W_o + W_mlp) + 2 V D
    + 4 H E ((L - 1) T (T + 1) / 2 + T)), per layer N_layer = W_q + W_kv + W_o + W_mlp with W_q = W_o = D H E,
    W_kv = 2 D K E, W_mlp = 3 D F. Counting all T tokens through the last layer (`forward_flops` with
    logit_tokens=1) overstates it by the last layer's other T - 1 queries: 2.7% for Qwen3-8B at T = 2048."""
    d, f, h, k, e, n_l = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                          cfg.head_dim, cfg.num_hidden_layers)
    w_kv, w_rest = 2 * d * k * e, 2 * d * h * e + 3 * d * f
    per_layer = w_kv + w_rest
    attn = 4 * h * e * ((n_l - 1) * attention_pairs(tokens, 0) + tokens)
    return float(batch) * (2.0 * per_layer * (n_l - 1) * tokens + 2.0 * w_kv * tokens + 2.0 * w_rest
                           + 2.0 * cfg.vocab_size * d + attn)


def train_flops(cfg: Qwen3Config, batch: int, seq: int) -> float:
    """6 N_mm B T + 12 L H E T B T (PaLM, Chowdhery et al. 2022, App. B; recompute not counted)."""
    tokens = batch * seq
    return (6.0 * matmul_params(cfg) * tokens
            + 12.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq * tokens)


def kv_bytes_per_token(cfg: Qwen3Config, itemsize: int) -> int:
    """Cached keys and values of one token of one row, all layers: 2 L K E itemsize."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def decode_step_bytes(cfg: Qwen3Config, batch: int, context: float, weight_itemsize: int,
                      kv_itemsize: int) -> dict:
    """HBM bytes one decode step must read at least: every matmul weight and norm once, and each row's cached
    keys and values over `context` tokens. {'weight_bytes', 'kv_bytes', 'bytes'}."""
    w = (matmul_params(cfg) + norm_params(cfg)) * weight_itemsize
    kv = batch * context * kv_bytes_per_token(cfg, kv_itemsize)
    return {"weight_bytes": float(w), "kv_bytes": float(kv), "bytes": float(w + kv)}


def decode_step_flops(cfg: Qwen3Config, batch: int, context: float) -> float:
    """One new token per row after `context` cached ones, its logits computed."""
    return forward_flops(cfg, batch, 1, int(round(context)), logit_tokens=1)


def fraction(work: float, seconds: float, peak_per_s: Optional[float]) -> Optional[float]:
    """work / seconds / peak (MFU for FLOPs, the HBM fraction for bytes); None without a peak."""
    if peak_per_s is None:
        return None
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return work / seconds / peak_per_s


def roofline_seconds(flops: float, nbytes: float, peak_flops: float, bytes_per_s: float) -> dict:
    """The roofline bound max(FLOPs / peak, bytes / bandwidth) and which side binds."""
    compute, memory = flops / peak_flops, nbytes / bytes_per_s
    return {"roofline_s": max(compute, memory), "compute_s": compute, "memory_s": memory,
            "bound": "compute" if compute >= memory else "memory"}
