"""Qwen3 model configuration: one frozen dataclass, read from and written to Hugging Face `config.json`.

A config describes the model this package computes, or is refused: every dimension an integer in
[1, MAX_DIM] (token ids and positions are int32) and at most MAX_PARAMS parameters in all (a config.json with
a dimension of 10**30 is a typo, not a model), norms' epsilon and RoPE's theta positive finite numbers, and, read
from a Hugging Face config.json, the activation SiLU (`hidden_act`), no sliding window, default RoPE. A refused
config.json is a `CheckpointError` naming the file and the field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from typing import Any

MAX_DIM = 2**31 - 1      # int32: the dtype of token ids and positions
MAX_PARAMS = 10**13      # 40x Qwen3's largest dense or MoE model (235B)
_DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "max_position_embeddings")
_ACTIVATIONS = ("silu", "swish")  # transformers' names of the one activation Qwen3's MLP uses


class CheckpointError(ValueError):
    """A checkpoint on disk (config.json, weights, tokenizer, train state) lacks a part or is not what it claims;
    the message names the file and the field, tensor or step."""


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Static shape of a dense Qwen3 (hashable: used as a static jit argument)."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    max_position_embeddings: int = 40960

    def __post_init__(self):
        for name in _DIMS:
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or not 1 <= v <= MAX_DIM:
                what = "positive" if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v < 1 else (
                    f"an integer in [1, {MAX_DIM}]")
                raise ValueError(f"Qwen3Config.{name} must be {what}, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"Qwen3Config.{name} must be a positive finite number, got {v!r}")
        for name in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Qwen3Config.{name} must be true or false, got {getattr(self, name)!r}")
        if self.num_params() > MAX_PARAMS:
            raise ValueError(f"Qwen3Config describes {self.num_params():.3g} parameters, more than any model "
                             f"(limit {MAX_PARAMS:.0e}); a dimension is likely mistyped")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def num_params(self) -> int:
        d, f, h, k, hd, v = (self.hidden_size, self.intermediate_size, self.num_attention_heads,
                             self.num_key_value_heads, self.head_dim, self.vocab_size)
        attn = d * h * hd * 2 + d * k * hd * 2 + 2 * hd
        per_layer = attn + 3 * d * f + 2 * d
        return v * d * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * per_layer + d

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "Qwen3Config":
        """Builds a config from a HF Qwen3 `config.json` dict (transformers 4.x and 5.x layouts); CheckpointError
        naming `source` and the field for anything this model does not compute (module doc)."""
        def refuse(msg: str):
            return CheckpointError(f"{source}: {msg}")

        if not isinstance(hf, dict):
            raise refuse(f"a JSON {type(hf).__name__}, not an object")
        model_type = hf.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise refuse(f"field model_type is {model_type!r}, expected 'qwen3' (MoE and other architectures "
                         "are not supported)")
        if hf.get("use_sliding_window", False):
            raise refuse("field use_sliding_window is true; sliding-window attention is not supported")
        act = hf.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise refuse(f"field hidden_act is {act!r}; this Qwen3 computes SiLU ('silu'), so a checkpoint trained "
                         "with another activation would load and compute something else")
        theta = hf.get("rope_theta")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise refuse(f"field rope_parameters/rope_scaling is {rope!r}, not an object")
        if theta is None:
            theta = rope.get("rope_theta", 10_000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in (None, "default"):
            raise refuse(f"field rope_type is {rope_type!r}; only default RoPE is supported")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in hf]
        if missing:
            raise refuse(f"lacks required keys {missing}")
        for k in _DIMS:
            v = hf.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_DIM):
                raise refuse(f"field {k} is {v!r}; it must be an integer in [1, {MAX_DIM}]")
        for k in ("rms_norm_eps", "rope_theta"):
            v = theta if k == "rope_theta" else hf.get(k, 1e-6)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) and v > 0):
                raise refuse(f"field {k} is {v!r}; it must be a positive finite number")
        heads = hf["num_attention_heads"]
        try:
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"],
                num_hidden_layers=hf["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=hf.get("num_key_value_heads", heads),
                head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                tie_word_embeddings=hf.get("tie_word_embeddings", False),
                attention_bias=hf.get("attention_bias", False),
                max_position_embeddings=hf.get("max_position_embeddings", 40960),
            )
        except ValueError as e:
            raise refuse(str(e).replace("Qwen3Config.", "field ")) from None

    def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """HF `config.json` contents that transformers' `Qwen3ForCausalLM` loads."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "max_position_embeddings": self.max_position_embeddings,
            "use_sliding_window": False,
            "torch_dtype": dtype,
            "dtype": dtype,
        }

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "Qwen3Config":
        """The config in <path>/config.json (FileNotFoundError when there is none; CheckpointError naming the file
        and the field when it is not a Qwen3 this package computes)."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"no config.json in checkpoint directory {os.fspath(path)!r}")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                hf = json.load(f)
        except (ValueError, OSError) as e:
            raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
        return cls.from_hf_dict(hf, source=cfg_path)


# Shapes used across tests, benchmarks and experiments.
PRESETS: dict[str, Qwen3Config] = {
    "tiny": Qwen3Config(),
    # ~10M parameters: the CPU benchmark shape (docs/performance.md).
    "bench_10m": Qwen3Config(vocab_size=512, hidden_size=384, intermediate_size=1024,
                             num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                             head_dim=64, tie_word_embeddings=True),
    "qwen3_0_6b": Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                              num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                              head_dim=128, tie_word_embeddings=True),
    "qwen3_4b": Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                            num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128, tie_word_embeddings=True),
    "qwen3_8b": Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                            num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128, tie_word_embeddings=False),
}
