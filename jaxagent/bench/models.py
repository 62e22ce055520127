"""The model shapes the accelerator benchmark runs, by the study's names (`jaxagent/study/frozenlake/presets.py` and
`jaxagent/study/host/presets.py` call them qwen3-0.6b, qwen3-4b, qwen3-8b; 1.7B is the size between), and `tiny`
for smoke tests. Architectures as the Qwen3 checkpoints' config.json: widths, layers, query and key/value heads of
128 dims, the 151,936-token vocabulary; the embeddings are tied except at 8B."""
from __future__ import annotations

from jaxagent.models.config import PRESETS, Qwen3Config

MODELS: dict[str, Qwen3Config] = {
    "tiny": PRESETS["tiny"],
    "qwen3-0.6b": PRESETS["qwen3_0_6b"],
    "qwen3-1.7b": Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": PRESETS["qwen3_4b"],
    "qwen3-8b": PRESETS["qwen3_8b"],
}
# the study's presets name their architecture by a models.config.PRESETS key (`aot_model`)
CONFIG_NAMES = {"qwen3_0_6b": "qwen3-0.6b", "qwen3_4b": "qwen3-4b", "qwen3_8b": "qwen3-8b"}


def model_config(name: str) -> Qwen3Config:
    """The shape called `name`; ValueError listing the valid names otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return MODELS[name]
