"""Stage 'eval': every diagnostic of the study on the base and each trained policy, then the report.

The diagnostics, their caches under runs/<name>/eval/ and the report: `jaxagent.study.frozenlake.evaluate`
(module doc) and `jaxagent.study.frozenlake.report`.
"""
import os

from experiments import cli, progress


def main(argv=None):
    args = cli.parser(cli.summary(__doc__), run_options=True).parse_args(argv)
    from jaxagent.study.frozenlake import evaluate, measure, report
    with cli.clear_errors():
        run = cli.make_run(args)
        base = run.load_policy(os.path.join(run.dir, "base"))
        metrics, figures, evals, bounds = evaluate.evaluate(run, base, measure.collect_policies(run),
                                                            progress=progress.bars())
        path, _ = report.write_report(run, metrics, figures, evals, bounds)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
