"""The verdict on one compiled program's record: does it fit, run on the chip, keep the FSDP pattern, keep
attention fused on a GPU and compute no more than the analytic FLOPs?"""
from __future__ import annotations

import re
from typing import Optional

# XLA:TPU's own custom calls (buffer allocation, gather/scatter index handling); a call the program itself
# brings (an FFI kernel such as jaxagent_*, a host callback) cannot run on the chip and is reported as foreign.
# The compiler inserts calls of its own too (e.g. PrepareAsyncCallStart/Done around an async call): a target
# only the compiled program has, absent from the lowered module, is XLA:TPU's by construction (`foreign_calls`).
BENIGN_CUSTOM_CALLS = {"AllocateBuffer", "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked", "ZeroCrop"}
# On a GPU: the libraries XLA:GPU calls (cuBLAS GEMMs, cuDNN's fused attention, which jax's
# `dot_product_attention(implementation="cudnn")` brings as a custom call of its own).
GPU_LIBRARY_PREFIXES = ("__cublas$", "__cudnn$")
# Per-chip FLOPs may exceed the analytic count by at most this factor (more is duplicated compute).
FLOPS_TOLERANCE = 1.1
HALF = ("bf16", "f16")  # the operand dtypes cuDNN's fused attention takes
HBM_FRACTION = 0.85  # the most of a chip's HBM a program and what the run holds beside it may use


def foreign_calls(targets, lowered_text: Optional[str] = None, platform: str = "tpu") -> list[str]:
    """The custom-call targets of a compiled program (`targets`) that the chip cannot run: not XLA:TPU's own
    (`BENIGN_CUSTOM_CALLS`; on a GPU, `platform` 'gpu': not a cuBLAS or cuDNN call) and either brought by the
    program (in its lowered module `lowered_text`, e.g. a `jaxagent_*` kernel selected for the wrong platform) or,
    without the lowered text, any other."""
    brought = None if lowered_text is None else set(re.findall(r"custom_call @([\w$.]+)", lowered_text))
    own = (lambda t: t.startswith(GPU_LIBRARY_PREFIXES)) if platform == "gpu" else BENIGN_CUSTOM_CALLS.__contains__
    return sorted(t for t in targets if not own(t) and (brought is None or t in brought or t.startswith("jaxagent")))


def program_verdict(rec: dict, *, fraction: float, flops_checked: bool,
                    flops_tolerance: float = FLOPS_TOLERANCE) -> str:
    """'ok', or the first check a compiled program fails: over_hbm (more than `fraction` of HBM),
    custom_calls (a call the chip cannot run), dense_attention (a GPU program writes attention scores of at least
    1024 x 1024 computed from bf16 / f16 operands to memory, `hlo.dense_scores`: attention cuDNN's fused kernel
    would take; f32 attention, which it does not take, is only recorded), all_to_all (activations resharded:
    not the FSDP pattern), flops_over (more than `flops_tolerance` x the analytic FLOPs: duplicated compute)."""
    if rec["hbm_fraction"] > fraction:
        return "over_hbm"
    if rec["foreign_custom_calls"]:
        return "custom_calls"
    if (rec.get("dense_scores") or {}).get("operands") in HALF:
        return "dense_attention"
    if "all-to-all" in rec["collectives"]:
        return "all_to_all"
    if flops_checked and rec["flops_ratio"] is not None and rec["flops_ratio"] > flops_tolerance:
        return "flops_over"
    return "ok"
