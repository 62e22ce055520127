"""Rollout throughput: jaxagent's jitted FrozenLake env and multi-turn rollout vs gymnasium + transformers.

    python -m experiments.bench_rollout --json             # one JSON line, both sides measured in this run
    python -m experiments.bench_rollout --json --profile   # + where the JAX rollout's time goes

The measurement and its record: `jaxagent.bench.rollout` (its docstring is this command's --help epilog); the
PyTorch + gymnasium peer: `experiments.peers.torch_rollout`.
"""
from __future__ import annotations

import argparse
import sys

from experiments import cli
from jaxagent.bench.harness import LoadMeter, dump


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m experiments.bench_rollout", description=__doc__.split("\n\n")[0],
                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=cli.module_doc("jaxagent.bench.rollout"))
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--batch", type=int, default=64, help="episodes per rollout batch (default: 64)")
    p.add_argument("--t-max", type=int, default=0,
                   help="turns per episode (budget = T_max); 0: the quick preset's T_max (default: 0)")
    p.add_argument("--max-context", type=int, default=0,
                   help="KV-cache slots per episode; 0: the quick preset's (enough for --t-max <= 6), or "
                        "system + T_max x (chunk + reply) rounded up to 64 for a larger --t-max (default: 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--shapes", default="default,1m",
                   help="comma-separated model shapes: 'default' (quick preset model, toy vocab) and/or '1m' "
                        "(hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32) (default: default,1m)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed repeats per side (the peer's at each setting); medians reported (default: 3)")
    p.add_argument("--env-batch", type=int, default=4096, help="JAX env bench: maps stepped at once (default: 4096)")
    p.add_argument("--env-steps", type=int, default=200, help="JAX env bench: scan length (default: 200)")
    p.add_argument("--gym-envs", type=int, default=1024,
                   help="gymnasium env bench: sub-envs of the SyncVectorEnv, the first maps of --env-batch "
                        "(default: 1024)")
    p.add_argument("--gym-steps", type=int, default=20, help="gymnasium env bench: vector steps (default: 20)")
    p.add_argument("--matmul-n", type=int, default=1024,
                   help="side of the square f32 matmul measuring the peak (default: 1024)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch.set_num_threads of the PyTorch peer; 0: its best of 1..N (default: 0)")
    p.add_argument("--skip-env", action="store_true", help="skip the env-stepping benchmark")
    p.add_argument("--profile", action="store_true",
                   help="also time the JAX rollout without the model (scripted expert) and with twice the cache "
                        "slots, per shape")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, maps and sampling (default: 0)")
    args = p.parse_args(argv)
    meter = LoadMeter()  # the run's load window starts here
    for name in ("batch", "repeats", "env_batch", "env_steps", "gym_envs", "gym_steps", "matmul_n"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.torch_threads < 0:
        p.error("--torch-threads must be >= 0")
    if args.t_max < 0 or args.max_context < 0:
        p.error("--t-max and --max-context must be >= 0")
    if args.gym_envs > args.env_batch:
        p.error("--gym-envs must be <= --env-batch (the gymnasium envs use the first maps of the JAX batch)")
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in ("default", "1m")]
    if bad or not shapes:
        p.error(f"--shapes takes 'default' and/or '1m', got {args.shapes!r}")

    from experiments.peers import torch_rollout
    from jaxagent.bench import rollout
    from jaxagent.study.frozenlake.presets import PRESETS
    print(dump(rollout.run(args, PRESETS["quick"], torch_rollout, meter), args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
