"""What the AOT tests share: the tiny Qwen3 they compile and the marks for tests that need libtpu, the CUDA plugin
or cuDNN."""
import importlib.util

import pytest

from jaxagent.models.config import Qwen3Config

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu is not installed (pip install -e '.[tpu-aot]')")
HAVE_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
needs_cuda_plugin = pytest.mark.skipif(not HAVE_CUDA_PLUGIN,
                                       reason="the CUDA plugin is not installed (pip install -e '.[gpu-aot]')")


def have_cudnn() -> bool:
    """Whether cuDNN attention can be traced here (the CUDA plugin and the cuDNN wheel: the gpu-aot extra)."""
    from jaxagent.models import ops_gpu
    return ops_gpu.available()


needs_cudnn = pytest.mark.skipif(not HAVE_CUDA_PLUGIN or not have_cudnn(),
                                 reason="the CUDA plugin or cuDNN is not installed (pip install -e '.[gpu-aot]')")

# wide enough that every projection is sharded on a (1, 2, 2) mesh (D, F, H, K all divisible by 2)
CFG = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
