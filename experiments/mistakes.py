"""What RL changed in a finished toy host study's held-out submissions: the share of solved episodes, slips of the
reference, wrong values and other mistakes, for the base and every trained policy (`jaxagent.study.host.mistakes`).

  python -m experiments.mistakes --preset sql-toy --budget 1
  python -m experiments.mistakes --preset code-toy --budget 2
  python -m experiments.mistakes --preset bfcl-toy --budget 2
"""
from __future__ import annotations

from experiments import cli
from experiments.host_study import preset_from
from jaxagent.study.preset_names import HOST


def main(argv=None):
    p = cli.Parser(prog=cli.script_prog("experiments.mistakes"), description=cli.summary(__doc__),
                   formatter_class=cli.HelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(HOST), metavar="PRESET",
                   help="the preset the run was made with (sql-toy, code-toy, bfcl-toy)")
    p.add_argument("--name", default=None, help="run name (default: the preset's, -s<N> with --seed-offset N)")
    p.add_argument("--seed-offset", type=cli.seed_int, default=0, metavar="N",
                   help="the run's --seed-offset (its seeds and run directory)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--budget", type=cli.positive_int, default=1, help="announced budget (turns), at most T_max")
    p.add_argument("--samples", type=cli.positive_int, default=4, help="episodes per held-out task")
    p.add_argument("--arms", nargs="+", default=None, help="these arms only (default: the preset's)")
    p.add_argument("--out", default=None, help="also write the table here")
    for name in ("checkpoint", "data", "iterations", "seeds"):
        p.set_defaults(**{name: None})
    p.set_defaults(rehearsal=False)
    args = p.parse_args(argv)
    from jaxagent.study.host import mistakes
    from jaxagent.study.host.run import HostRun
    from jaxagent.study.host.domains import get_domain
    preset = preset_from(args)
    env = get_domain(preset.task.domain).env
    if env not in mistakes.ENVS:
        cli.fail(f"--preset {args.preset}: its domain's env is {env!r}; this script sorts the submissions of "
                 f"{', '.join(mistakes.ENVS)}")
    if args.budget > preset.task.t_max:
        cli.fail(f"--budget {args.budget}: the preset's T_max is {preset.task.t_max}")
    with cli.clear_errors():
        run = HostRun(preset, args.root, args.name)
        text = mistakes.mistake_table(run, args.budget, args.samples, arms=args.arms)
    cli.emit(text, args.out)


if __name__ == "__main__":
    main()
