"""Prefill and decode throughput: jaxagent's KV-cache generate vs transformers' PyTorch `generate`.

    python -m experiments.bench_model --json                # CPU: ~10M Qwen3, jax vs torch, one JSON line

The measurement and its record: `jaxagent.bench.model`; the PyTorch peer: `experiments.peers.torch_model`.
"""
from __future__ import annotations

import argparse
import os
import sys

from experiments import cli
from jaxagent.bench.harness import LoadMeter, dump
from jaxagent.models.config import PRESETS


def _single_thread() -> None:
    """One compute thread for XLA; must run before jax creates its CPU client."""
    os.environ["XLA_FLAGS"] = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 "
                               + os.environ.get("XLA_FLAGS", "")).strip()


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m experiments.bench_model", description=__doc__.split("\n\n")[0],
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu (the only mode here); accelerators: python -m experiments.bench_accel")
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--preset", default="bench_10m", choices=sorted(PRESETS),
                   help="cpu mode: model shape from jaxagent.models.config.PRESETS (default: bench_10m)")
    p.add_argument("--tiny", action="store_true",
                   help="smoke test: the tiny preset with small batches/lengths")
    p.add_argument("--batch", type=int, default=16, help="cpu mode: batch size (default: 16)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per row (default: 128)")
    p.add_argument("--new-tokens", type=int, default=64, help="generated tokens per row (default: 64)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds (jax and torch alternate); medians and bests reported (default: 5)")
    p.add_argument("--matmul-n", type=int, default=2048,
                   help="cpu mode: side of the square f32 matmul that measures the peak (default: 2048)")
    p.add_argument("--threads", type=int, default=0, choices=(0, 1),
                   help="0: XLA's default CPU threading, the PyTorch peer at its best of 1..N threads; 1: both "
                        "single-threaded (XLA without its Eigen pool, the peer at 1 thread) (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and prompts (default: 0)")
    args = p.parse_args(argv)
    args.meter = LoadMeter()  # the run's load window starts here
    if args.threads == 1:
        _single_thread()
    if args.tiny:
        args.batch, args.prompt_len, args.new_tokens = min(args.batch, 4), min(args.prompt_len, 16), \
            min(args.new_tokens, 8)
        args.matmul_n = min(args.matmul_n, 256)
    for name in ("batch", "prompt_len", "new_tokens", "repeats", "matmul_n"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.device == "gpu":
        p.error("the accelerator benchmark is python -m experiments.bench_accel (GPU/TPU: roofline, PyTorch peer)")
    from experiments.peers import torch_model  # after _single_thread: both load JAX
    from jaxagent.bench import model
    print(dump(model.run_cpu(args, torch_model), args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
