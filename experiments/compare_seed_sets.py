"""Verdicts of one preset run on several seed sets, side by side (issue 16: a verdict must not depend on the
seed set). Reads each run directory's metrics.json (written by the eval stage) and prints one markdown row
per finding: the measured difference with its 95% CI and the verdict in each run, and whether they agree.

  python -m experiments.compare_seed_sets runs/standard runs/standard-s5 --out runs/standard-seed-sets.md
"""
from __future__ import annotations

import argparse
import json
import math
import os

from jaxagent.eval import report


def _cell(f: report.Finding, metrics: dict) -> tuple[str, str]:
    est = report.estimate_from_metrics(metrics, f.diff)
    verdict, _ = report.finding_verdict(f, metrics)
    if est is None or not math.isfinite(est.mean):
        return "—", verdict
    s, fmt = f.diff_scale, f.diff_fmt
    ci = (f" [{est.lo * s:{fmt}}, {est.hi * s:{fmt}}]" if math.isfinite(est.lo) and math.isfinite(est.hi)
          else " (no CI)")
    return f"{est.mean * s:+{fmt}}{ci}", verdict


def table(run_dirs: list[str]) -> str:
    runs = []
    for d in run_dirs:
        path = os.path.join(d, "metrics.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist: run the eval stage of {d} first")
        with open(path) as fh:
            runs.append(report.flatten_metrics(json.load(fh), keep_text=True))
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    head = "| finding | difference | " + " | ".join(f"{n}: measured [95% CI] | {n}: verdict" for n in names)
    lines = [head + " | same verdict |", "|" + "---|" * (2 + 2 * len(names) + 1)]
    for f in report.DEFAULT_FINDINGS:
        cells = [_cell(f, m) for m in runs]
        if all(c[0] == "—" for c in cells):
            continue
        same = "yes" if len({c[1] for c in cells}) == 1 else "**no**"
        row = " | ".join(f"{v} | {verdict}" for v, verdict in cells)
        lines.append(f"| {f.title} | {f.diff_label} | {row} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", help="run directories of the same preset (e.g. runs/standard runs/standard-s5)")
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)
    text = table(args.run_dirs)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
