"""The FrozenLake study's report: metrics.json and report.md of a run, from `evaluate.evaluate`'s results."""
from __future__ import annotations

import os

from jaxagent.eval import report, stats
from jaxagent.study import run_dir
from jaxagent.study.common.banner import report_banner
from jaxagent.study.frozenlake.measure import TASK_KEY


def write_report(run, metrics, figures, evals, bounds):
    """Writes metrics.json and report.md into the run directory (`report.build_report` plus the announced vs
    hidden budget table); returns (report.md's path, the `report.Report`)."""
    p = run.preset
    run_dir.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    meta = report_banner(p)
    meta |= {"preset": p.name, "Pass@(K,T) mode": "announced (budget in the prompt, separate rollouts per T)",
            "tasks": f"{p.eval.n_tasks} held-out {p.task.size}x{p.task.size} FrozenLake maps per RL seed (each seed "
                     f"its own maps, key fold_in({TASK_KEY}, seed)), {p.eval.n_samples} samples per task and budget; "
                     "the base is evaluated on every seed's maps and each RL - base difference is paired per seed",
            "RL": f"{len(p.seeds)} seeds x {p.iterations} iterations of {p.n_tasks} tasks x {p.group_size} rollouts",
            "budget tiers": ", ".join(str(t) for t in metrics["meta.tiers"]),
            "K": ", ".join(str(k) for k in metrics["meta.ks"]),
            "budget T_max": str(p.task.t_max),
            "statistics": f"{stats.INTERVAL_METHOD} RL arms compared with GRPO are paired by seed index; figures "
                          "average / pool the included seeds"}
    rep = report.build_report(metrics, run.dir, figures=figures, meta=meta, title=f"jaxagent toy study: {p.name}")
    extra = ["", "## Beyond the paper: announced vs hidden budget (tightest tier, largest K; included seeds)", "",
             "| policy | announced | hidden |", "|---|---|---|"]
    for k in sorted(metrics):
        if k.startswith("x_hidden.") and k.endswith(".announced_tight"):
            arm = k.split(".")[1]
            extra.append(f"| {arm} | {metrics[k]:.3f} | {metrics[f'x_hidden.{arm}.hidden_tight']:.3f} |")
    text = rep.markdown + "\n".join(extra) + "\n"
    with open(os.path.join(run.dir, "report.md"), "w") as f:
        f.write(text)
    return os.path.join(run.dir, "report.md"), rep
