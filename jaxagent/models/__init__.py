"""Qwen3 in JAX with no RL knowledge: its config, pure `init` / `forward` over a params pytree, the KV cache,
Hugging Face checkpoints (`load`, `save`), the tokenizer and the chat format.

    cfg, params = load("/path/to/Qwen3-0.6B")                 # a local HF directory (mesh= to shard it)
    logits_BxTxV, _ = forward(params, cfg, tokens_BxT)

The names below load their module on first use: `jaxagent.models.config` (the shapes, stdlib only) imports
without JAX or Flax, so a command line that only reads model shapes starts in milliseconds."""
import importlib

_EXPORTS = {
    "qwen3": ("forward", "hidden_states", "init", "init_cache"),
    "config": ("Qwen3Config",),
    "tokenizer": ("Tokenizer", "build_word_tokenizer"),
    "weights": ("load", "save"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = ("chat", "qwen3")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxagent.models.{name}")
    if name in _WHERE:
        return getattr(importlib.import_module(f"jaxagent.models.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'jaxagent.models' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_WHERE) + list(_SUBMODULES))


__all__ = sorted(list(_WHERE) + list(_SUBMODULES))
