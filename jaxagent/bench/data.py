"""The benchmark's inputs, from numpy alone (the PyTorch peer builds the same arrays without importing JAX).

Dimension legend (CONVENTIONS.md): B rows, T tokens per row, L prompt tokens.
"""
from __future__ import annotations

import math

import numpy as np


def train_batch(vocab_size: int, rows: int, seq: int, prompt: int, seed: int = 0) -> dict:
    """A GRPO batch: random tokens [B, T], the last T - prompt positions policy tokens, normal advantages, and the
    sampler's log-probs at log(1/V) (a uniform sampler), so the PPO ratio is the policy's p x V."""
    if not 0 <= prompt < seq:
        raise ValueError(f"need 0 <= prompt < seq, got prompt={prompt}, seq={seq}")
    rng = np.random.default_rng(seed)
    return {"tokens": rng.integers(0, vocab_size, (rows, seq)).astype(np.int32),
            "policy_mask": np.ascontiguousarray(np.broadcast_to(np.arange(seq)[None] >= prompt, (rows, seq))),
            "advantages": rng.normal(size=(rows, seq)).astype(np.float32),
            "old_logprobs": np.full((rows, seq), -math.log(vocab_size), np.float32)}


def prompts(vocab_size: int, rows: int, length: int, seed: int = 0) -> np.ndarray:
    """Random prompt tokens int32 [B, L] (ids 1..V-1: 0 is the pad id the samplers write)."""
    return np.random.default_rng(seed).integers(1, vocab_size, (rows, length)).astype(np.int32)
