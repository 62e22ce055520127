"""XLA compiler options that jaxagent's jitted programs are compiled with.

`COMPILER_OPTIONS` goes to `jax.jit(..., compiler_options=...)` at every jit boundary that runs the
model (generation, rollouts, train steps, evaluation drivers), so no process-wide flag or environment
variable is needed and research code that jits its own functions can pass the same dict.

Why each option (measured on the 2-core AMD EPYC CI machine, jaxlib 0.10.2, f32):
- ``xla_cpu_experimental_ynn_fusion_type = ""``: XLA:CPU routes dots through YNNPACK by default. For the
  small-batch shapes of decoding (e.g. [16, 384] x [384, 1024]) with weights that do not fit in cache,
  that path ran at ~3 GB/s of weight traffic (1.0 ms per call in a 6-layer decode loop) where XLA's
  Eigen path runs the same dot in ~0.25-0.4 ms; a 10M-parameter Qwen3 decode step fell from 22 ms to
  15 ms and a one-token forward from 13 ms to 7.5 ms; large (prefill-sized) dots are as fast or faster
  (2048x384x1024: 127 vs 122 GFLOP/s). An empty list disables the YNN fusion pass. The field belongs to
  XLA's backend-independent DebugOptions, so GPU and TPU compiles accept and ignore it.
Reproduce: `python -m experiments.bench_model --json` (reports both settings' matmul peaks).
"""
from __future__ import annotations

COMPILER_OPTIONS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(extra: dict | None = None) -> dict:
    """A fresh copy of `COMPILER_OPTIONS`, updated with `extra` (which wins on conflicts)."""
    return {**COMPILER_OPTIONS, **(extra or {})}
