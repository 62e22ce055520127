"""Presets of the host-domain study (`experiments.host_study`): one per domain and scale.

A new domain is a `jaxagent.study.host_stages.DOMAINS` entry plus presets here (e.g. `ci-bfcl`,
`qwen3-0.6b-1gpu-bfcl` with `HostTaskSettings(domain='bfcl', ...)`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from jaxagent.models.config import Qwen3Config
from jaxagent.study.host_stages import HOST_ARMS, HostTaskSettings


@dataclasses.dataclass(frozen=True)
class HostEvalSettings:
    n_samples: int = 16               # rollouts per held-out task and budget tier (n of the pass@k estimator)
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    n_boot: int = 1000
    batch_size: int = 64              # episodes per evaluation rollout batch


@dataclasses.dataclass(frozen=True)
class HostPreset:
    name: str
    task: HostTaskSettings
    eval: HostEvalSettings = HostEvalSettings()
    checkpoint: Optional[str] = None  # a local HF Qwen3 directory (with its tokenizer): the base policy
    tiny_model: Optional[Qwen3Config] = None  # CI: a random Qwen3 with the real Qwen3 tokenizer (no checkpoint)
    arms: tuple[str, ...] = HOST_ARMS
    seeds: tuple[int, ...] = (0, 1, 2)
    iterations: int = 100
    n_tasks: int = 8                  # tasks per RL iteration
    group_size: int = 8               # rollouts per task (GRPO group)
    lr: float = 1e-6
    epochs: int = 1
    minibatches: int = 1
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    compute_dtype: str = "float32"
    micro_batches: int = 1
    remat: Optional[str] = None


HOST_PRESETS: dict[str, HostPreset] = {
    # Seconds-scale plumbing check: a 1-layer width-32 random Qwen3 with the real tokenizer's 151,936-row
    # vocabulary, 2 turns of 4-token replies, 4 train tasks, all 5 held-out tasks. Tool output capped at 24 tokens
    # so that the cap is exercised (the SQL env's format-error message is longer).
    "ci-sql": HostPreset(
        name="ci-sql",
        task=HostTaskSettings(domain="sql", t_max=2, max_action_tokens=4, max_context=448, max_obs_tokens=24,
                              max_train_tasks=4, workers=2),
        eval=HostEvalSettings(n_samples=2, ks=(1, 2), fractions=(0.5, 1.0), n_boot=50, batch_size=20),
        tiny_model=Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16),
        seeds=(0, 1), iterations=2, n_tasks=1, group_size=2, lr=1e-4),
    # One 80 GB GPU, Qwen3-0.6B from --checkpoint: 10 turns (InterCode-SQL's limit), 256-token replies, tool
    # output capped at 512 tokens, 64 episodes per iteration (KV cache 64 x 4096 slots, as the FrozenLake 0.6B
    # preset's 128 x 2048), bf16 forward passes, 16 micro-batches with full remat in the train step.
    "qwen3-0.6b-1gpu-sql": HostPreset(
        name="qwen3-0.6b-1gpu-sql",
        task=HostTaskSettings(domain="sql", t_max=10, max_action_tokens=256, max_context=4096, max_obs_tokens=512,
                              workers=8),
        eval=HostEvalSettings(n_samples=16, ks=(1, 2, 4, 8, 16), batch_size=64),
        seeds=(0, 1, 2), iterations=100, n_tasks=8, group_size=8, lr=1e-6, compute_dtype="bfloat16",
        micro_batches=16, remat="full"),
}
