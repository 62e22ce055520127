"""RL train-step throughput: jaxagent's jitted PPO-clip step vs the same step written in PyTorch.

    python -m experiments.bench_train --json                # CPU: ~10M Qwen3, jax vs torch, one JSON line

The measurement and its record: `jaxagent.bench.train`; the PyTorch peer: `experiments.peers.torch_train`.
"""
from __future__ import annotations

import argparse
import sys

from experiments import cli
from jaxagent.bench.harness import LoadMeter, dump
from jaxagent.models.config import PRESETS


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m experiments.bench_train", description=__doc__.split("\n\n")[0],
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu (the only mode here); accelerators: python -m experiments.bench_accel")
    p.add_argument("--tiny", action="store_true",
                   help="tiny model and shapes (2 x 32): a smoke test in seconds")
    p.add_argument("--preset", default=None,
                   help="model preset from jaxagent.models.config.PRESETS (default bench_10m)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default: 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default: 256)")
    p.add_argument("--prompt", type=int, default=64,
                   help="leading prompt tokens per row, outside the loss mask (default 64)")
    p.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps before timing, the first one compiles (default 2)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="gradient-accumulation micro-batches of the jax step (default 1)")
    p.add_argument("--threads", type=int, default=0,
                   help="cpu: torch intra-op threads of the PyTorch peer; 0: its best of 1..N (default 0)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch side (cpu mode)")
    p.add_argument("--matmul-n", type=int, default=1024,
                   help="size of the n x n f32 matmul that measures the peak (default 1024)")
    p.add_argument("--matmul-repeats", type=int, default=5, help="best-of repeats of that matmul")
    p.add_argument("--seed", type=int, default=0, help="weights and batch seed")
    args = p.parse_args(argv)
    args.meter = LoadMeter()  # the run's load window starts here
    if args.batch is None:
        args.batch = 8
    if args.seq is None:
        args.seq = 256
    for name in ("batch", "seq", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.device == "gpu":
        p.error("the accelerator benchmark is python -m experiments.bench_accel (GPU/TPU: roofline, PyTorch peer)")
    if args.preset is not None and args.preset not in PRESETS:
        p.error(f"unknown --preset {args.preset!r}; valid: {', '.join(PRESETS)}")
    from experiments.peers import torch_train
    from jaxagent.bench import train
    print(dump(train.run_cpu(args, None if args.no_torch else torch_train.run_peer), args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
