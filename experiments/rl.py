"""Stage 'rl': train RL arms from the base policy (grpo, budgetmix, gigpo, ppo, grpo_oracle).

All arms use the same seeds, task distribution and number of updates; an interrupted arm resumes
from its last orbax checkpoint.
"""
from experiments import cli, progress
from jaxagent.study.preset_names import ARMS


def main(argv=None):
    p = cli.parser(cli.summary(__doc__), prog="experiments.rl", run_options=True)
    p.add_argument("--arm", nargs="+", default=None, choices=sorted(ARMS),
                   help="arms to train (default: the preset's arms)")
    args = p.parse_args(argv)
    from jaxagent.study.frozenlake import train
    with cli.clear_errors():
        run = cli.make_run(args)
        base = train.run_base(run, log=print, progress=progress.bars())
        train.run_all_arms(run, base, arms=args.arm, log=print, progress=progress.bars())
    print(f"policies in {run.dir}/arms")


if __name__ == "__main__":
    main()
