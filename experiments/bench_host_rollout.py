"""A toy host preset's training rollout of a finished run's base, with every row stepping until a group's longest
reply ends (the peer) and with compacted decoding (what the presets run); `jaxagent.bench.host_rollout`.

  python -m experiments.reproduce --preset bfcl-toy        # first: the run whose base/policy is read
  python -m experiments.bench_host_rollout --preset bfcl-toy --json
"""
from __future__ import annotations

from experiments import cli
from jaxagent.bench.harness import dump


def main(argv=None):
    p = cli.toy_base_parser("experiments.bench_host_rollout", cli.summary(__doc__))
    p.add_argument("--rollouts", type=cli.positive_int, default=16, help="timed rollouts per setting (default 16)")
    p.add_argument("--seed", type=int, default=1000, help="rollout i's key is seed + i (default 1000)")
    args = p.parse_args(argv)
    from jaxagent.bench.host_rollout import run_bench
    run = cli.toy_base_run(args)
    with cli.clear_errors():
        out = run_bench(run, args.rollouts, args.seed)
    print(dump(out, args.json))


if __name__ == "__main__":
    main()
