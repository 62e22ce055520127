"""The train step's memory arithmetic (`jaxagent.bench.train_memory`): the bytes per parameter, the model that
--train-model auto picks on an H100 and an H200 pool, and the state's bytes against a compiled step's
`memory_analysis()` on this CPU at depth 1 and 2."""
import dataclasses

import pytest

from jaxagent.bench import train_memory
from jaxagent.bench.models import model_config
from jaxagent.models.config import Qwen3Config

SHAPE = dict(rows=16, seq=2048, micro_batches=4)
H100_POOL, H200_POOL = 0.90 * 84_942_979_072, 0.90 * 151_397_597_184  # XLA_PYTHON_CLIENT_MEM_FRACTION x CUDA's total


def test_bytes_per_parameter_and_activations_by_hand():
    cfg = model_config("qwen3-4b")
    got = train_memory.step_bytes(cfg, **SHAPE)
    n = cfg.num_params()
    assert got["state"] == 12 * n and got["temporaries"] == 6 * n
    assert round((got["state"] + got["temporaries"]) / 1e9, 1) == 72.4  # 18 B x 4.02e9
    r = 4  # 16 rows / 4 micro-batches
    act = 36 * r * 2048 * 2560 * 2 + 2 * r * 32 * 2048 ** 2 * 4 + 3 * r * 2048 * 9728 * 4 + 3 * 512 * r * 151936 * 4
    assert got["activations"] == act and got["total"] == 18 * n + act


@pytest.mark.parametrize("pool, name", [(H100_POOL, "qwen3-1.7b"), (0.75 * 84_942_979_072, "qwen3-1.7b"),
                                        (H200_POOL, "qwen3-4b"), (0.75 * 151_397_597_184, "qwen3-4b"),
                                        (20e9, "qwen3-0.6b"), (None, "qwen3-0.6b")])
def test_auto_picks_the_largest_step_that_fits(pool, name):
    got, why = train_memory.pick("auto", pool, **SHAPE)
    assert got == name, why
    if pool:
        assert why["need_gb"] * 1e9 <= train_memory.HEADROOM * pool


def test_a_named_model_is_kept():
    assert train_memory.pick("qwen3-8b", H100_POOL, **SHAPE)[0] == "qwen3-8b"


@pytest.fixture(scope="module")
def compiled():
    """The GRPO step of a small Qwen3 compiled on this CPU at depth 1 and 2 (abstract inputs: nothing allocated)."""
    base = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    return {d: (cfg := dataclasses.replace(base, num_hidden_layers=d),
                train_memory.compiled_step_bytes(cfg, rows=4, seq=64, micro_batches=2)) for d in (1, 2)}


@pytest.mark.slow
def test_compiled_state_is_12_bytes_per_parameter(compiled):
    """The program's arguments are the state (12 B per parameter, plus the step counter, the rng and the data
    position) and the batch; the state is donated (aliased to the output)."""
    batch = 4 * 64 * (4 + 1 + 4 + 4)  # tokens int32, policy_mask bool, advantages and old log-probs f32
    for cfg, m in compiled.values():
        est = train_memory.step_bytes(cfg, rows=4, seq=64, micro_batches=2)["state"]
        assert 0 <= m["argument"] - batch - est < 1024, (m, est)
        assert 0 <= m["alias"] - est < 1024 and m["output"] >= m["alias"]
    (c1, m1), (c2, m2) = compiled[1], compiled[2]
    assert m2["argument"] - m1["argument"] == 12 * (c2.num_params() - c1.num_params())
