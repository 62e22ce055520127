"""The accelerator benchmark's arithmetic: the device table, analytic FLOPs and bytes (hand-computed for the tiny
shape), roofline fractions, the estimate tables, and the Qwen3 shapes by the study's names."""
import math

import pytest

from jaxagent.bench import estimates, roofline
from jaxagent.bench.devices import DEVICES, custom_spec, device_spec
from jaxagent.bench.models import MODELS, model_config
from jaxagent.models.config import PRESETS

TINY = PRESETS["tiny"]  # V 512, D 64, F 128, L 2, H 4, K 2, E 16, tied
N_LAYERS = 2 * (2 * 64 * 4 * 16 + 2 * 64 * 2 * 16 + 3 * 64 * 128)  # 73,728
N_MM = N_LAYERS + 512 * 64  # 106,496
NORMS = 2 * (2 * 64 + 2 * 16) + 64  # 384


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("TPU v5 lite", "TPU v5e"),
    ("TPU v5e", "TPU v5e"), ("TPU v5p", "TPU v5p"), ("TPU v5", "TPU v5p"), ("TPU v6 lite", "TPU v6e"),
    ("TPU v6e", "TPU v6e"), ("cpu", None), ("NVIDIA GeForce RTX 4090", None), ("TPU v4", None)])
def test_device_table_by_kind(kind, name):
    spec = device_spec(kind)
    assert (spec.name if spec else None) == name


def test_device_figures_are_the_vendor_dense_bf16_ones():
    h200, h100, a100 = DEVICES["H200 SXM"], DEVICES["H100 SXM"], DEVICES["A100 SXM 80GB"]
    assert (h200.peak_flops, h200.hbm_bytes_per_s, h200.hbm_bytes) == (989e12, 4.8e12, 141e9)
    assert (h100.peak_flops, h100.hbm_bytes_per_s) == (989e12, 3.35e12)
    assert (a100.peak_flops, a100.hbm_bytes_per_s) == (312e12, 2.039e12)
    assert (DEVICES["TPU v5p"].peak_flops, DEVICES["TPU v5e"].hbm_bytes_per_s) == (459e12, 0.819e12)
    assert DEVICES["TPU v6e"].peak_flops == 918e12
    assert custom_spec(2, 50).fields()["hbm_gbps"] == 50
    with pytest.raises(ValueError, match="peak_tflops"):
        custom_spec(0, 50)


def test_flop_and_byte_counts_by_hand():
    assert roofline.layer_matmul_params(TINY) == N_LAYERS and roofline.matmul_params(TINY) == N_MM
    assert roofline.norm_params(TINY) == NORMS
    # prefill of 3 rows x 16 tokens, one position's logits per row: 2 N_layers T + 2 V D + 4 L H E T(T+1)/2
    attn = 4 * 2 * 4 * 16 * (16 * 17 // 2)
    assert roofline.forward_flops(TINY, 3, 16, 0, logit_tokens=1) == 3 * (2 * N_LAYERS * 16 + 2 * 512 * 64 + attn)
    # one decode token after 10 cached: pairs = 10 + 1
    assert roofline.decode_step_flops(TINY, 2, 10) == 2 * (2 * N_LAYERS + 2 * 512 * 64 + 4 * 2 * 4 * 16 * 11)
    # train: 6 N_mm per token + 12 L H E T per token (PaLM)
    assert roofline.train_flops(TINY, 2, 32) == 6 * N_MM * 64 + 12 * 2 * 4 * 16 * 32 * 64
    b = roofline.decode_step_bytes(TINY, 4, 20.5, 2, 2)
    assert b["weight_bytes"] == (N_MM + NORMS) * 2 and b["kv_bytes"] == 4 * 20.5 * (2 * 2 * 2 * 16 * 2)
    assert b["bytes"] == b["weight_bytes"] + b["kv_bytes"]


def test_prefill_flops_count_what_the_program_computes():
    """`sampling.append` of T tokens (`qwen3.hidden_states(index=)`): every layer projects keys and values of all T
    tokens; layers 0..L-2 run queries, o_proj, the MLP and T(T+1)/2 causal pairs for all T; the last layer runs them
    for the last token only (T key pairs); one position unembedded."""
    w_kv, w_rest = 2 * 64 * 2 * 16, 2 * 64 * 4 * 16 + 3 * 64 * 128  # D K E x (k, v); q + o + the MLP
    assert w_kv + w_rest == N_LAYERS // 2
    t = 16
    per_row = (2 * (w_kv + w_rest) * t            # layer 0: every token
               + 2 * w_kv * t + 2 * w_rest         # layer 1 (last): k, v of every token; the rest of one
               + 2 * 512 * 64                      # one position's logits
               + 4 * 4 * 16 * (t * (t + 1) // 2 + t))  # causal pairs of layer 0, the last query's T of layer 1
    assert roofline.prefill_flops(TINY, 3, t) == 3 * per_row
    # all T tokens through the last layer (forward_flops) would count (T - 1) more queries there
    over = roofline.forward_flops(TINY, 3, t, 0, logit_tokens=1) - roofline.prefill_flops(TINY, 3, t)
    assert over == 3 * ((t - 1) * 2 * w_rest + 4 * 4 * 16 * (t * (t + 1) // 2 - t))
    q8 = MODELS["qwen3-8b"]
    assert 0.026 < roofline.forward_flops(q8, 1, 2048, 0, logit_tokens=1) / roofline.prefill_flops(q8, 1, 2048) - 1 < 0.028


def test_fractions_and_roofline_bound():
    assert roofline.fraction(100.0, 2.0, 100.0) == 0.5 and roofline.fraction(1.0, 1.0, None) is None
    with pytest.raises(ValueError, match="seconds"):
        roofline.fraction(1.0, 0.0, 1.0)
    r = roofline.roofline_seconds(10.0, 5.0, peak_flops=100.0, bytes_per_s=10.0)
    assert r == {"roofline_s": 0.5, "compute_s": 0.1, "memory_s": 0.5, "bound": "memory"}


def test_qwen3_8b_decode_roofline_matches_the_issues_target():
    """Batch 1 on an H200: ~15.3 GB of bf16 matmul weights read per token -> ~314 tokens/s at the roofline, 75% of it
    ~235 tokens/s (the decode target's 'about 220')."""
    rows = estimates.model_rows("qwen3-8b", MODELS["qwen3-8b"], DEVICES["H200 SXM"], decode_batches=(1,))
    dec = next(r for r in rows if r["bench"] == "decode")
    assert dec["bound"] == "memory" and 300 < dec["roofline_tokens_per_s"] < 330
    assert math.isclose(dec["bytes_per_step_gb"], roofline.decode_step_bytes(
        MODELS["qwen3-8b"], 1, 1024 + 31 / 2, 2, 2)["bytes"] / 1e9)


def test_preset_row_from_a_record():
    rec = {"preset": "p", "program": "train_step_grpo", "flops_per_chip": 989e12, "hbm_fraction": 0.3, "shapes": "x"}
    assert estimates.train_record([rec, {"preset": "p", "program": "generate", "flops_per_chip": 1.0}], "p") is rec
    row = estimates.preset_row("p", TINY, DEVICES["H200 SXM"], rec, episodes=8, t_max=2, reply_tokens=3, context=64,
                               mesh=(2, 1, 2))
    assert row["train_roofline_s"] == 1.0 and row["train_at_target_s"] == 2.5
    per_chip = roofline.decode_step_bytes(TINY, 4, 32, 2, 2)  # 8 rows over data 2 -> 4, heads over tensor 2
    assert math.isclose(row["rollout_roofline_s"], 6 * (per_chip["bytes"] / 2) / 4.8e12)
    assert estimates.markdown([row], [("preset", "preset", ""), ("s", "train_roofline_s", ".1f"),
                                                     ("none", "absent", "")]).splitlines()[2] == "| p | 1.0 | - |"


def test_model_names_are_the_studys():
    assert list(MODELS) == ["tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"]
    assert model_config("qwen3-4b") == PRESETS["qwen3_4b"]
    assert abs(MODELS["qwen3-1.7b"].num_params() / 1e9 - 1.72) < 0.01
    with pytest.raises(ValueError, match="valid: tiny, qwen3-0.6b"):
        model_config("qwen3_9b")


def test_host_presets_reference_turns_come_from_their_world():
    """The long-tail table's reference turns: the host world's train split (SQL: 1 turn for each of its 554 tasks);
    a broken import here was reported as a table note, not raised."""
    from jaxagent.study.host.presets import HOST_PRESETS
    memo = {}
    m = estimates.min_turns(HOST_PRESETS["qwen3-0.6b-1gpu-sql"], memo)
    assert len(m) == 554 and (m == 1).all() and len(memo) == 1
