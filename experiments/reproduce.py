"""The whole study in order: base -> every RL arm x seed -> eval -> runs/<name>/report.md.

Resumable: a rerun skips finished stages and resumes an interrupted RL arm from its checkpoint; a rerun
with other settings in the same run directory refuses (naming them) unless --force. --seed-offset N runs
the same preset on seeds shifted by N, in runs/<preset>-s<N>. A host-domain preset (ci-sql, ...) runs
experiments.host_study with the same command line.
"""
import time

from experiments import cli, host_study, progress

PROG = "experiments.reproduce"


def main(argv=None):
    if host_study.wants(argv, PROG):  # a host-env domain preset (jaxagent/study/host/presets.py)
        return host_study.main(argv, prog=PROG)
    args = cli.parser(cli.summary(__doc__), prog=PROG, run_options=True, host_presets=True).parse_args(argv)
    from jaxagent.study import run_dir
    from jaxagent.study.frozenlake import evaluate, report, train
    t0 = time.time()
    with cli.clear_errors():
        run = cli.make_run(args)
        clock = progress.Pipeline(progress.study_stages(run.preset))  # the ETA over base, RL and eval
        base = train.run_base(run, log=print, progress=clock.bars("base"))
        t_base = time.time()
        policies = train.run_all_arms(run, base, log=print, progress=clock.bars("RL"))
        t_rl = time.time()
        metrics, figures, evals, bound = evaluate.evaluate(run, base, policies, progress=clock.bars("eval"))
        path, rep = report.write_report(run, metrics, figures, evals, bound)
    t_end = time.time()
    timing = {"base_s": t_base - t0, "rl_s": t_rl - t_base, "eval_s": t_end - t_rl, "total_s": t_end - t0}
    run_dir.write_json(f"{run.dir}/timing.json", timing)
    print(f"report: {path}")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in rep.verdicts.items()))
    print("wall time (s): " + ", ".join(f"{k}={v:.0f}" for k, v in timing.items()))


if __name__ == "__main__":
    main()
