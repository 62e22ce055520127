"""GPU targets of the AOT check (`jaxagent.aot.gpu`): the target config, the GPU topology names and the memory pool
checked against; XLA:GPU's HLO read on hand-written text (trip counts XLA proved, fusions that each name their
parameters parameter_0, cuBLAS and cuDNN attention FLOPs, dense attention scores); compiles for an H100 on this
CPU (the CUDA plugin: the test extra) and a tiny Qwen3 train step whose attention is cuDNN's fused kernel (cuDNN:
the gpu-aot extra).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent import aot
from jaxagent.aot import gpu, hlo, topology
from tests.aot_common import needs_cuda_plugin, needs_cudnn

# a gemm fusion and a second one whose parameter_0 has another shape, in a while loop of 6 trips that XLA proved
# (its condition's compare fused); a cuBLAS GEMM; cuDNN's fused attention forward and backward; a split-K GEMM
# (batched, contracting 8192) and a dense score dot (batched, contracting a head dim of 64)
GPU_HLO = """HloModule g

%gemm_a (parameter_0: bf16[64,32], parameter_1: bf16[32,16]) -> f32[64,16] {
  %parameter_0 = bf16[64,32]{1,0} parameter(0)
  %parameter_1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = f32[64,16]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%gemm_b (parameter_0: bf16[8,128], parameter_1: bf16[128,4]) -> f32[8,4] {
  %parameter_0 = bf16[8,128]{1,0} parameter(0)
  %parameter_1 = bf16[128,4]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,4]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_compare (param_0: s32[]) -> pred[] {
  %param_0 = s32[] parameter(0)
  %constant_9 = s32[] constant(6)
  ROOT %lt = pred[] compare(%param_0, %constant_9), direction=LT
}

%cond (p: (s32[], bf16[64,32])) -> pred[] {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %c = pred[] fusion(%i), kind=kLoop, calls=%fused_compare
}

%body (p: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  %x = bf16[64,32]{1,0} get-tuple-element(%p), index=1
  %w = bf16[32,16]{1,0} constant({...})
  %g = f32[64,16]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_a
  ROOT %t = (s32[], bf16[64,32]{1,0}) tuple(%i, %x)
}

ENTRY %main (a: bf16[64,32], b: bf16[8,128], q: bf16[2,256,4,64], k: bf16[2,256,2,64], s: f32[2,8192,1024], e: f32[2,8192,64]) -> f32[8,4] {
  %a = bf16[64,32]{1,0} parameter(0)
  %b = bf16[8,128]{1,0} parameter(1)
  %q = bf16[2,256,4,64]{3,2,1,0} parameter(2)
  %k = bf16[2,256,2,64]{3,2,1,0} parameter(3)
  %s = f32[2,8192,1024]{2,1,0} parameter(4)
  %e = f32[2,8192,64]{2,1,0} parameter(5)
  %w = (s32[], bf16[64,32]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"},"known_init_step":{"init":"0","step":"1"}}
  %gb = f32[8,4]{1,0} fusion(%b, %b), kind=kCustom, calls=%gemm_b
  %cb = (f32[64,16]{1,0}, s8[4194304]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %fa = (bf16[2,4,256,64]{3,1,2,0}, f32[2,4,256]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["2","4","256","256"]},"mask_type":"CAUSAL","bmm1_dot_dimension_numbers":{"lhs_contracting_dimensions":["3"],"rhs_contracting_dimensions":["3"],"lhs_batch_dimensions":["0","2"],"rhs_batch_dimensions":["0","2"]}}}
  %fb = (bf16[2,256,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmaxBackward", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["2","4","256","256"]},"bmm1_dot_dimension_numbers":{"lhs_contracting_dimensions":["3"],"rhs_contracting_dimensions":["3"],"lhs_batch_dimensions":["0","2"],"rhs_batch_dimensions":["0","2"]}}}
  %sk = f32[2,1024,1024]{2,1,0} dot(%s, %s), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %r = f32[8,4]{1,0} copy(%gb)
}
"""

ATTN = 2 * 4 * 256 * 256 * 64  # B H T S E of the fused calls


def test_gpu_hlo_flops_trip_counts_and_library_calls():
    h = hlo.hlo_summary(GPU_HLO)
    assert h["loops"][0]["trips"] == 6  # known_trip_count; the fused compare's limit is 6 too
    gemms = 6 * 2 * 64 * 16 * 32 + 2 * 8 * 4 * 128 + 2 * 64 * 16 * 32
    split_k = 2 * 2 * 1024 * 1024 * 8192
    assert h["flops"] == gemms + 4 * ATTN + 8 * ATTN + split_k
    assert h["custom_calls"] == {"__cublas$gemm": 1, "__cudnn$fmhaSoftmax": 1, "__cudnn$fmhaSoftmaxBackward": 1}
    assert h["dense_scores"] is None  # the split-K GEMM contracts 8192: not attention scores
    scores = GPU_HLO.replace("%sk = f32[2,1024,1024]{2,1,0} dot(%s, %s), lhs_batch_dims={0}, lhs_contracting_dims={1}",
                             "%sk = f32[2,8192,8192]{2,1,0} dot(%e, %e), lhs_batch_dims={0}, lhs_contracting_dims={2}")
    assert hlo.hlo_summary(scores)["dense_scores"] == {"gib": 0.5, "shape": "f32[2,8192,8192]", "operands": "f32"}
    no_known = GPU_HLO.replace('backend_config={"known_trip_count":{"n":"6"},', 'backend_config={')
    assert hlo.hlo_summary(no_known)["loops"][0]["trips"] == 6  # from the fused condition's constant


def test_gpu_verdict_fails_dense_attention_and_keeps_library_calls():
    assert aot.foreign_calls({"__cudnn$fmhaSoftmax": 2, "__cublas$gemm": 1}, "custom_call @__cudnn$fmhaSoftmax",
                             platform="gpu") == []
    assert aot.foreign_calls({"jaxagent_attention": 1}, platform="gpu") == ["jaxagent_attention"]
    assert aot.foreign_calls({"__cudnn$fmhaSoftmax": 1}, "custom_call @__cudnn$fmhaSoftmax") == ["__cudnn$fmhaSoftmax"]
    scores = {"gib": 2.0, "shape": "f32[16,4096,2048]", "operands": "bf16"}
    rec = {"hbm_fraction": 0.5, "foreign_custom_calls": [], "collectives": {}, "flops_ratio": 1.0,
           "dense_scores": scores}
    assert aot.program_verdict(rec, fraction=0.85, flops_checked=True) == "dense_attention"
    # f32 attention (the scoring on f32 params): the kernel takes bf16 / f16 only; recorded, not failed
    assert aot.program_verdict({**rec, "dense_scores": {**scores, "operands": "f32"}}, fraction=0.85, flops_checked=True) == "ok"
    assert aot.program_verdict({**rec, "dense_scores": None}, fraction=0.85, flops_checked=True) == "ok"


def test_gpu_topologies_target_config_and_memory_pool():
    text = gpu.target_config("h200")
    assert "device_memory_size: 151397597184" in text and "memory_bandwidth: 4800000000000" in text
    assert 'device_description_str: "NVIDIA H200 141GB HBM3e"' in text and "major: 9 minor: 0" in text
    assert gpu.gpu_count("h100:1x1x8") == 8 and gpu.is_gpu("h100:1x1x1") and not gpu.is_gpu("v5p:2x2x1")
    for bad in ("h100:8", "h100:2x1x4", "h100:1x1x0"):
        with pytest.raises(ValueError, match="one host of N cards"):
            gpu.gpu_count(bad)
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu.card("a100:1x1x1")
    limit, note = topology.hbm_limit("h100:1x1x1")
    assert limit == 0.75 * 84_942_979_072 and "preallocates" in note
    assert topology.hbm_limit("h100:1x1x1", gpu_mem_fraction=0.9)[0] == 0.9 * 84_942_979_072
    assert topology.hbm_limit("v5p:1x1x1", 80)[0] == 80 * 2 ** 30  # a TPU proxy: min(chip, GPU)
    assert aot.chip_specs("h200:1x1x1")["flops"] == 989e12 and aot.chip_specs("h100:1x1x1")["platform"] == "gpu"


@needs_cuda_plugin
def test_compiles_for_h100_on_this_cpu_and_gates_memory_itself():
    """A matmul compiled for one H100 and an all-reduce over eight: FLOPs from the HLO (cost_analysis gives none),
    memory against the pool; a program over the pool compiles (XLA:GPU only logs) and the verdict says over_hbm."""
    devices = aot.topology_devices("h100:1x1x8")
    assert len(devices) == 8 and {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"}
    mesh = Mesh(np.array(devices[:1]), ("x",))
    x = jax.ShapeDtypeStruct((1024, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((2048, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    rec = aot.analyze(jax.jit(lambda x, w: x @ w), x, w, topology="h100:1x1x1", analytic_flops=2 * 1024 * 2048 * 512)
    assert rec["status"] == "ok" and rec["platform"] == "gpu" and rec["flops_ratio"] == 1.0
    assert rec["hbm_gib"] == round(0.75 * 84_942_979_072 / 2 ** 30, 2) and rec["fused_attention_calls"] == 0
    big = jax.ShapeDtypeStruct((64, 2 ** 30), jnp.int8, sharding=NamedSharding(mesh, P()))  # 64 GiB > 59.3 GiB
    assert aot.analyze(jax.jit(lambda b: b + 1), big, topology="h100:1x1x1")["status"] == "over_hbm"
    mesh8 = Mesh(np.array(devices), ("x",))
    y = jax.ShapeDtypeStruct((8, 1024), jnp.float32, sharding=NamedSharding(mesh8, P("x")))
    rec8 = aot.analyze(jax.jit(lambda y: y.sum(0)), y, topology="h100:1x1x8")
    assert rec8["chips"] == 8 and "all-reduce" in rec8["collectives"]


@needs_cudnn
def test_tiny_train_step_attention_is_cudnn_fused_on_h100():
    """A tiny Qwen3's forward and backward at 256 tokens, compiled for an H100: bf16 attention is cuDNN's fused
    kernel (forward and backward calls, FLOPs within 10% of the analytic count, no dense scores); the same in f32
    keeps the dense attention (the kernel takes bf16 / f16)."""
    from jaxagent.aot.analytic import analytic_flops
    from jaxagent.models import qwen3
    from tests.aot_common import CFG
    mesh = Mesh(np.array(aot.topology_devices("h100:1x1x1")), ("x",))
    rows, seq = 2, 256

    def loss(p, toks):
        return -jax.nn.log_softmax(qwen3.forward(p, CFG, toks)[0].astype(jnp.float32))[..., 0].mean()
    toks = jax.ShapeDtypeStruct((rows, seq), jnp.int32, sharding=NamedSharding(mesh, P()))
    recs = {}
    for dtype in (jnp.bfloat16, jnp.float32):
        params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype, sharding=NamedSharding(mesh, P())),
                              qwen3.param_shapes(CFG))
        recs[dtype] = aot.analyze(jax.jit(jax.grad(loss)), params, toks, topology="h100:1x1x1",
                                  analytic_flops=analytic_flops(CFG, rows, seq, backward=True))
    bf = recs[jnp.bfloat16]
    assert bf["custom_calls"]["__cudnn$fmhaSoftmax"] == CFG.num_hidden_layers
    assert bf["custom_calls"]["__cudnn$fmhaSoftmaxBackward"] == CFG.num_hidden_layers
    assert bf["status"] == "ok" and 0.9 < bf["flops_ratio"] <= 1.1 and bf["dense_scores"] is None
    assert recs[jnp.float32]["fused_attention_calls"] == 0
