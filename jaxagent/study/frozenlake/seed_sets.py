"""Verdicts of one preset run on several seed sets, side by side: a verdict should not depend on the seed set.
Reads each run directory's metrics.json (written by the eval stage) and gives one markdown row per finding
(`findings.DEFAULT_FINDINGS` order, titled by `findings.finding_title`): in each run the measured difference
with its 95% CI, the verdict and why (for an underpowered row, the range of seeds that would decide it), and
whether the verdicts agree: verdict strings compared exactly, so "not reproduced" (a CI holding 0, short of E)
and "not reproduced (opposite)" (a CI on the opposite side of 0) count as different.

The pooled column is the confirmatory line: each row's estimate over every set's seeds, blocked by set
(`stats.pool_blocked`: a set's offset, from its maps or its machine's arithmetic, moves its mean but not the
interval's width), judged by the same rule with the sets' mean room and recipe inputs (`pooled_metrics`); it
says when the sets differ beyond their seeds' spread (`heterogeneity`: each set trains its own base, so a set's
seeds replicate RL, not the base). A primary row (`findings.PRIMARY`) is confirmed when every set and the pooled
line agree (`confirmation`: sign and size apart).

  python -m experiments.compare_seed_sets runs/standard runs/standard-s5 --out runs/standard-seed-sets.md
"""
from __future__ import annotations

import json
import math
import os

from jaxagent.eval import findings, report, stats


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


def pooled_metrics(runs: list[dict], f: findings.Finding) -> dict:
    """The metrics `findings.finding_verdict` reads for the pooled line of finding `f`: every number the runs
    share averaged over the runs (the room, the recipe inputs such as `<row>.moved.<arm>`), the difference's
    estimate replaced by `stats.pool_blocked` over the runs' estimates, and the seeds text naming each set."""
    shared = set.intersection(*(set(m) for m in runs))
    out = {}
    for k in shared:
        vals = [m[k] for m in runs]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[k] = float(sum(vals) / len(vals))
        elif all(v == vals[0] for v in vals):
            out[k] = vals[0]
    ests = [findings.estimate_from_metrics(m, f.diff) for m in runs]
    pooled = stats.pool_blocked([e for e in ests if e is not None])
    for name, v in pooled.as_dict().items():
        out[f"{f.diff}.{name}"] = v
    out[f"{f.diff}.seeds"] = " + ".join(str(m.get(f"{f.diff}.seeds", "?")) for m in runs)
    return out


def confirmation(f: findings.Finding, verdicts: list, pooled: str | None) -> str:
    """The confirmatory criterion of a primary row, sign and size apart as in the rule: "confirmed: <verdict>" when
    the pooled line reproduces the finding (in full or in direction) and every set's verdict is the pooled one;
    "confirmed in direction; the size differs between sets" when every set and the pooled line lie on the paper's
    side but reach E in some sets only; "both sets: <verdict>" when they agree on another verdict; "**not
    confirmed** (sets differ)" otherwise. A secondary row: "secondary"."""
    if not f.primary:
        return "secondary"
    if len(verdicts) < 2:
        return "primary: needs a second seed set"
    paper_side = (stats.REPRODUCED, stats.SMALLER)
    if pooled is not None and all(v == pooled for v in verdicts):
        return f"confirmed: {pooled}" if pooled in paper_side else f"both sets: {pooled}"
    if pooled in paper_side and all(v in paper_side for v in verdicts):
        return "confirmed in direction; the size differs between sets"
    return "**not confirmed** (sets differ)"


def heterogeneity(runs: list[dict], f: findings.Finding) -> str:
    """"; the sets differ beyond their seeds' spread (F test p = ...): this interval holds for these sets' bases"
    when `stats.between_sets_p` < 0.05, else ""."""
    ests = [e for e in (findings.estimate_from_metrics(m, f.diff) for m in runs) if e is not None]
    p = stats.between_sets_p(ests)
    if not (p < 0.05):
        return ""
    return (f"; the sets differ beyond their seeds' spread (F test p = {p:.2g}): this interval holds for these "
            "sets' bases and maps")


def table(run_dirs: list[str]) -> str:
    """The markdown table: one row per finding measured in at least one run, a column per run, the pooled line
    (two runs or more), "same verdict" (yes / **no**) and the confirmatory criterion of a primary row."""
    runs = [load_run(d) for d in run_dirs]
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    pool = len(runs) >= 2
    head = "| finding (difference) | " + " | ".join(f"`{n}`: measured [95% CI] **verdict** (why)" for n in names)
    head += " | pooled, blocked by set |" if pool else " |"
    lines = [head + " same verdict | primary row |", "|" + "---|" * (len(names) + 3 + pool)]
    for f in findings.DEFAULT_FINDINGS:
        cells = [cell(f, m) for m in runs]
        if all(v is None for _, v in cells):
            continue
        title = findings.finding_title(f, next(m for m, (_, v) in zip(runs, cells) if v is not None))
        same = "yes" if len({v for _, v in cells}) == 1 else "**no**"
        pooled_cell, pooled_v = cell(f, pooled_metrics(runs, f)) if pool else ("", None)
        if pool and pooled_v is not None:
            pooled_cell = pooled_cell[:-1] + heterogeneity(runs, f) + ")"
        confirm = confirmation(f, [v for _, v in cells], pooled_v)
        lines.append(f"| {title} ({f.diff_label}) | " + " | ".join(c for c, _ in cells)
                     + (f" | {pooled_cell}" if pool else "") + f" | {same} | {confirm} |")
    return "\n".join(lines) + "\n"
