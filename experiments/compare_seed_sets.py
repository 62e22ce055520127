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


def _cell(f: report.Finding, metrics: dict, prefix: str | None = None) -> tuple[str, str]:
    est = report.estimate_from_metrics(metrics, prefix or f.diff)
    verdict, _ = report.finding_verdict(f, metrics, prefix)
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
    head = "| finding (difference) | " + " | ".join(f"`{n}`: measured [95% CI], verdict" for n in names)
    lines = [head + " | same verdict |", "|" + "---|" * (len(names) + 2)]
    # finding 1 at K=1 too: the held-out full-budget Pass@1 gain that the RL recipe is judged by
    rows = [(f, None, f"{f.title} ({f.diff_label})") for f in report.DEFAULT_FINDINGS]
    f1 = next(f for f in report.DEFAULT_FINDINGS if f.key == "f1_breadth")
    rows.insert(0, (f1, "f1_breadth.k1", "1. RL stays above base at full budget, K=1 (RL - base Pass@1 (points))"))
    for f, prefix, title in rows:
        cells = [_cell(f, m, prefix) for m in runs]
        if all(c[0] == "—" for c in cells):
            continue
        same = "yes" if len({c[1] for c in cells}) == 1 else "**no**"
        row = " | ".join(f"{v} {verdict}" for v, verdict in cells)
        lines.append(f"| {title} | {row} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.compare_seed_sets", description=__doc__.splitlines()[0])
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
