"""The toy host presets' RL train step on a real minibatch of a finished run's base: policy logits at a per-row bound
with the decoding programs' XLA options (the peer), at the per-row bound with the sequence programs' options, and at
the packed policy tokens (what the toy presets run); `jaxagent.bench.host_step`.

  python -m experiments.reproduce --preset bfcl-toy        # first: the run whose base/policy is read
  python -m experiments.bench_host_step --preset bfcl-toy --json
"""
from __future__ import annotations

from experiments import cli
from jaxagent.bench.harness import dump


def main(argv=None):
    p = cli.toy_base_parser("experiments.bench_host_step", cli.summary(__doc__))
    p.add_argument("--steps", type=cli.positive_int, default=3, help="timed steps per setting (median; default 3)")
    p.add_argument("--seed", type=int, default=0, help="the rollout's and the permutation's key")
    args = p.parse_args(argv)
    from jaxagent.bench.host_step import run_bench
    run = cli.toy_base_run(args)
    with cli.clear_errors():
        out = run_bench(run, args.steps, args.seed)
    print(dump(out, args.json))


if __name__ == "__main__":
    main()
