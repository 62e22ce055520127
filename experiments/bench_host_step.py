"""The toy host presets' RL train step on a real minibatch of a finished run's base: policy logits at a per-row bound
with the decoding programs' XLA options (the peer), at the per-row bound with the sequence programs' options, and at
the packed policy tokens (what the toy presets run); `jaxagent.bench.host_step`.

  python -m experiments.reproduce --preset bfcl-toy        # first: the run whose base/policy is read
  python -m experiments.bench_host_step --preset bfcl-toy --json
"""
from __future__ import annotations

import os

from experiments import cli
from jaxagent.bench.harness import dump
from jaxagent.bench.host_step import run_bench
from jaxagent.study import run_dir
from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent.study.host.run import HostRun


def main(argv=None):
    p = cli.Parser(prog=cli.script_prog("experiments.bench_host_step"), description=__doc__.splitlines()[0],
                   formatter_class=cli.HelpFormatter)
    p.add_argument("--preset", default="bfcl-toy", choices=sorted(n for n, q in HOST_PRESETS.items() if q.sft),
                   metavar="PRESET", help="a toy preset whose run has finished its base stage (default bfcl-toy)")
    p.add_argument("--name", default=None, help="run name (default: the preset's)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--steps", type=cli.positive_int, default=3, help="timed steps per setting (median; default 3)")
    p.add_argument("--seed", type=int, default=0, help="the rollout's and the permutation's key")
    p.add_argument("--json", action="store_true", help="print exactly one JSON line")
    args = p.parse_args(argv)
    base = os.path.join(args.root, args.name or args.preset, "base")
    if not run_dir.done(base):  # before HostRun, which would make the run directory
        cli.fail(f"{base}: no finished base stage; run python -m experiments.reproduce --preset {args.preset} first")
    with cli.clear_errors():
        out = run_bench(HostRun(HOST_PRESETS[args.preset], args.root, args.name), args.steps, args.seed)
    print(dump(out, args.json))


if __name__ == "__main__":
    main()
