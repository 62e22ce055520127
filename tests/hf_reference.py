"""Tiny random transformers-PyTorch Qwen3 checkpoints for parity tests (torch is a test dependency)."""
from __future__ import annotations

import os

import numpy as np


def make_hf_qwen3(out_dir: str, *, seed: int = 0, tie: bool = True, rope_theta: float = 12345.0,
                  vocab: int = 101, hidden: int = 48, inter: int = 96, layers: int = 2, heads: int = 4,
                  kv_heads: int = 2, head_dim: int = 16, std: float = 0.2, legacy_rope_key: bool = False):
    """Saves a random HF Qwen3ForCausalLM to out_dir (every weight random, norms included); returns it.

    std is larger than HF's 0.02 so greedy decoding of the random model is not one repeated token.
    """
    import json

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      rope_theta=rope_theta, tie_word_embeddings=tie, max_position_embeddings=512)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))
    model.save_pretrained(out_dir)
    if legacy_rope_key:  # transformers 4.x layout: top-level rope_theta, no rope_parameters
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            hf = json.load(f)
        hf.pop("rope_parameters", None)
        hf["rope_theta"] = rope_theta
        with open(path, "w") as f:
            json.dump(hf, f)
    return model


def hf_logits(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None,
              position_ids: np.ndarray | None = None) -> np.ndarray:
    import torch

    kw = {}
    if attention_mask is not None:
        kw["attention_mask"] = torch.tensor(np.asarray(attention_mask, np.int64))
    if position_ids is not None:
        kw["position_ids"] = torch.tensor(np.asarray(position_ids, np.int64))
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens, np.int64)), **kw).logits.float().numpy()
