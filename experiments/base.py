"""Stage 'base': the toy base model (a tiny Qwen3 trained from scratch by SFT on a noisy expert).

Why this stands in for a pretrained base: the study asks what RL changes in a policy that already
knows the task's format and plays it imperfectly. Supervised learning on an epsilon-noisy,
budget-aware optimal FrozenLake player gives exactly such a policy: valid answers, sensible moves,
mistakes at a controlled rate and recoveries from them, and the budget text in every prompt.
"""
from experiments import cli, progress


def main(argv=None):
    args = cli.parser(cli.summary(__doc__), prog="experiments.base", run_options=True).parse_args(argv)
    from jaxagent.study.frozenlake import train
    with cli.clear_errors():
        run = cli.make_run(args)
        train.run_base(run, log=print, progress=progress.bars())
    print(f"base policy in {run.dir}/base/policy")


if __name__ == "__main__":
    main()
