"""Qwen3 in JAX with no RL knowledge: its config, pure `init` / `forward` over a params pytree, the KV cache,
Hugging Face checkpoints (`load`, `save`), the tokenizer and the chat format.

    cfg, params = load("/path/to/Qwen3-0.6B")                 # a local HF directory (mesh= to shard it)
    logits_BxTxV, _ = forward(params, cfg, tokens_BxT)
"""
from jaxagent.models import chat, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.qwen3 import forward, hidden_states, init, init_cache
from jaxagent.models.tokenizer import Tokenizer, build_word_tokenizer
from jaxagent.models.weights import load, save

__all__ = ["qwen3", "chat", "Qwen3Config", "init", "forward", "hidden_states", "init_cache", "load", "save",
           "Tokenizer", "build_word_tokenizer"]
