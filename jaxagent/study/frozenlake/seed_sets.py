"""Verdicts of one preset run on several seed sets, side by side: a verdict should not depend on the seed set.
Reads each run directory's metrics.json (written by the eval stage) and gives one markdown row per finding
(`findings.DEFAULT_FINDINGS` order, titled by `findings.finding_title`): in each run the measured difference
with its 95% CI, the verdict and why (for an underpowered row, the range of seeds that would decide it), and
whether the verdicts agree: verdict strings compared exactly, so "not reproduced" (a CI holding 0, short of E)
and "not reproduced (opposite)" (a CI on the opposite side of 0) count as different.

  python -m experiments.compare_seed_sets runs/standard runs/standard-s5 --out runs/standard-seed-sets.md
"""
from __future__ import annotations

import json
import math
import os

from jaxagent.eval import findings, report


def cell(f: findings.Finding, metrics: dict, prefix: str | None = None) -> tuple[str, str | None]:
    """("value [lo, hi] **verdict** (why; about N-M seeds would decide it)", verdict) of one run, values times
    the finding's scale; ("—", None) when the run did not measure the finding."""
    est = findings.estimate_from_metrics(metrics, prefix or f.diff)
    if est is None or not math.isfinite(est.mean):
        return "—", None
    verdict, why = findings.finding_verdict(f, metrics, prefix)
    why = report.why_text(f, metrics, why, prefix)
    s, fmt = f.diff_scale, f.diff_fmt
    ci = (f" [{est.lo * s:{fmt}}, {est.hi * s:{fmt}}]" if math.isfinite(est.lo) and math.isfinite(est.hi)
          else " (no CI)")
    return f"{est.mean * s:+{fmt}}{ci} **{verdict}** ({why.replace('|', '/')})", verdict


def load_run(run_dir: str) -> dict:
    """The flat metrics of a run directory's metrics.json; FileNotFoundError naming it when there is none."""
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: run the eval stage of {run_dir} first")
    with open(path) as fh:
        return report.flatten_metrics(json.load(fh), keep_text=True)


def table(run_dirs: list[str]) -> str:
    """The markdown table: one row per finding measured in at least one run, a column per run, and "same
    verdict" (yes / **no**)."""
    runs = [load_run(d) for d in run_dirs]
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    head = "| finding (difference) | " + " | ".join(f"`{n}`: measured [95% CI] **verdict** (why)" for n in names)
    lines = [head + " | same verdict |", "|" + "---|" * (len(names) + 2)]
    for f in findings.DEFAULT_FINDINGS:
        cells = [cell(f, m) for m in runs]
        if all(v is None for _, v in cells):
            continue
        title = findings.finding_title(f, next(m for m, (_, v) in zip(runs, cells) if v is not None))
        same = "yes" if len({v for _, v in cells}) == 1 else "**no**"
        lines.append(f"| {title} ({f.diff_label}) | " + " | ".join(c for c, _ in cells) + f" | {same} |")
    return "\n".join(lines) + "\n"
