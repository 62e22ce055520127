"""What the AOT tests share: the tiny Qwen3 they compile and the mark for tests that need libtpu."""
import importlib.util

import pytest

from jaxagent.models.config import Qwen3Config

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu is not installed (pip install -e '.[tpu-aot]')")

# wide enough that every projection is sharded on a (1, 2, 2) mesh (D, F, H, K all divisible by 2)
CFG = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
