"""Host-side markdown report: each finding's measured figures beside the paper's, a seed-aware verdict each.

Inputs: a flat mapping `metric key -> number or text` (read from the run's JSON files by `load_metrics`, or the eval
stage's dict) and a mapping `figure name -> PNG path`. Every printed number goes through one formatter that records
its source ("run:<metric key>", "paper:<PAPER_FIGURES key>", or "rule:<finding key>.effect|margin"), so
`printed_numbers` shows that each printed figure comes from the run's files, PAPER_FIGURES or the rules. The
findings themselves (rows, paper figures, effects, verdicts) are data in `findings`.

A finding's measured difference is the metric prefix `<diff>`: `.mean`, `.lo`, `.hi` (95% CI), `.lo90`, `.hi90`
(90% CI, for TOST), `.se`, `.mde`, `.df`, `.n_seeds`, `.n_units`, and the texts `.method`, `.reason`, `.seeds`, as
`stats.Estimate` writes them; `<diff>.all.*` is the same on every seed, printed as a sensitivity line. Verdicts
follow `stats.VERDICT_RULE` (`finding_verdict`, with the bound's range `<finding key>.room_lo/hi`, "bound allows");
an underpowered row gets `seeds_to_decide`, every row `Finding.falsified_by`. The seed-health table follows
`health.HEALTH_RULE` (`health.<arm>.seed<k>.status|reason|min_valid|last_valid|last_success`). The rule and the
rows: docs/study.md, "Statistics" and "What would have failed each row".
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

from jaxagent.eval import health as health_lib
from jaxagent.eval.findings import (DEFAULT_FINDINGS, PAPER_FIGURES, Finding, estimate_from_metrics, finding_title,
                                    finding_verdict, reference_effect, room_from_metrics, room_phrases, seeds_phrase,
                                    seeds_to_decide)
from jaxagent.eval.stats import VERDICT_RULE


def flatten_metrics(tree, prefix: str = "", *, keep_text: bool = False) -> dict:
    """Flatten nested dicts / named tuples of scalars into {"a.b.c": float}; other leaves are skipped, except
    strings when keep_text (the estimators' method / reason / seeds texts)."""
    out: dict = {}
    if hasattr(tree, "_asdict"):
        tree = tree._asdict()
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out.update(flatten_metrics(v, f"{prefix}.{k}" if prefix else str(k), keep_text=keep_text))
        return out
    if isinstance(tree, str):
        if keep_text and prefix:
            out[prefix] = tree
        return out
    try:
        value = float(tree)
    except (TypeError, ValueError):
        return out
    if prefix:
        out[prefix] = value
    return out


def load_metrics(paths: Sequence[str | os.PathLike], *, keep_text: bool = False) -> dict:
    """Read the run's JSON metric files into one flat mapping; a key defined twice is an error."""
    merged: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            flat = flatten_metrics(json.load(f), keep_text=keep_text)
        clash = sorted(set(flat) & set(merged))
        if clash:
            raise ValueError(f"metric keys {clash[:5]} appear in more than one file (last: {os.fspath(path)})")
        merged.update(flat)
    return merged


@dataclasses.dataclass(frozen=True)
class PrintedNumber:
    """A number as printed, the value it came from (before scaling), its source and the scale applied."""

    text: str
    value: float
    source: str
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Report:
    """The markdown text, every number it printed (in order), the verdict per finding key and its reason."""

    markdown: str
    numbers: tuple[PrintedNumber, ...]
    verdicts: dict[str, str]
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)


class Printer:
    """Formats numbers and records where each came from."""

    def __init__(self, metrics: Mapping):
        self.metrics, self.numbers = metrics, []

    def run(self, key: str | None, scale: float = 1.0, fmt: str = ".1f") -> str:
        value = None if key is None else self.metrics.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return "—"
        text = format(value * scale, fmt)
        self.numbers.append(PrintedNumber(text, float(value), f"run:{key}", scale))
        return text

    def paper(self, key: str | None) -> str:
        if key is None:
            return "—"
        value = PAPER_FIGURES[key]["value"]
        text = format(value, "g")  # the paper's own digits
        self.numbers.append(PrintedNumber(text, float(value), f"paper:{key}"))
        return text

    def rule(self, key: str, value: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
        if value is None or not math.isfinite(value):
            return "—"
        text = format(value * scale, fmt)
        self.numbers.append(PrintedNumber(text, float(value), f"rule:{key}", scale))
        return text

    def text(self, key: str, default: str = "—") -> str:
        value = self.metrics.get(key)
        return value.replace("|", "/") if isinstance(value, str) and value else default


_DIRECTION_WORDS = {1: "positive", -1: "negative", 0: "parity"}


def ci_text(f: Finding, p: Printer, prefix: str) -> str:
    est = estimate_from_metrics(p.metrics, prefix)
    if est is None:
        return "—"
    if not est.available:
        return f"n/a ({est.reason})"
    return (f"[{p.run(f'{prefix}.lo', f.diff_scale, f.diff_fmt)}, "
            f"{p.run(f'{prefix}.hi', f.diff_scale, f.diff_fmt)}]")


def _mde_text(f: Finding, p: Printer, prefix: str) -> str:
    mde = p.run(f"{prefix}.mde", f.diff_scale, f.diff_fmt)
    if f.direction == 0:
        ref = f"margin ±{p.rule(f'{f.key}.margin', f.margin, f.diff_scale, f.diff_fmt)}"
    else:
        ref = f"E {p.rule(f'{f.key}.effect', reference_effect(f, p.metrics), f.diff_scale, f.diff_fmt)}"
    return f"{mde} ({ref})"


def _paper_text(f: Finding, p: Printer) -> str:
    return p.paper(f.diff_paper) if f.diff_paper else _DIRECTION_WORDS[f.direction]


def room_text(f: Finding, p: Printer) -> str:
    """"[lo, hi]" of the difference the structural bound allows (scaled as the difference), or "—" (no bound)."""
    if room_from_metrics(f, p.metrics) is None:
        return "—"
    return (f"[{p.run(f'{f.key}.room_lo', f.diff_scale, f.diff_fmt)}, "
            f"{p.run(f'{f.key}.room_hi', f.diff_scale, f.diff_fmt)}]")


def why_text(f: Finding, metrics: Mapping, reason: str, prefix: str | None = None) -> str:
    """The verdict's reason, plus for an underpowered row the range of seeds that would decide it ("about 3-90
    seeds would decide it", `seeds_to_decide`, `seeds_phrase`)."""
    phrase = seeds_phrase(seeds_to_decide(f, metrics, prefix))
    return reason + (f"; {phrase}" if phrase else "")


def _summary_table(findings, p: Printer, verdicts, reasons) -> list[str]:
    lines = ["## Summary: one row per finding", ""]
    primary = [f"*{finding_title(f, p.metrics)}*" for f in findings if f.primary and f.key in verdicts]
    if primary:
        lines += [f"Primary rows (the confirmatory claims, declared before any run; two seed sets confirm them, "
                  f"`python -m experiments.compare_seed_sets`): {'; '.join(primary)}. Every other row is "
                  "secondary.", ""]
    lines += ["| finding | measured | paper | 95% CI | MDE (reference) | bound allows | verdict | why | seeds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for f in findings:
        if f.key not in verdicts:
            continue
        why = why_text(f, p.metrics, reasons[f.key]).replace("|", "/")
        lines.append(f"| {finding_title(f, p.metrics)} | {p.run(f'{f.diff}.mean', f.diff_scale, f.diff_fmt)} | "
                     f"{_paper_text(f, p)} | {ci_text(f, p, f.diff)} | {_mde_text(f, p, f.diff)} | "
                     f"{room_text(f, p)} | {verdicts[f.key]} | {why} | {p.text(f'{f.diff}.seeds')} |")
    return lines + [""]


def _finding_section(f: Finding, p: Printer, figures: Mapping[str, str], report_dir: str) -> list[str]:
    lines = [f"## {finding_title(f, p.metrics)}", "", "| quantity | measured | paper |", "|---|---|---|"]
    for row in f.rows:
        if row.optional and row.measured not in p.metrics:
            continue
        lines.append(f"| {row.label} | {p.run(row.measured, row.scale, row.fmt)} | {p.paper(row.paper)} |")
    mean = p.run(f"{f.diff}.mean", f.diff_scale, f.diff_fmt)
    lines.append(f"| {f.diff_label}, 95% CI | {mean} {ci_text(f, p, f.diff)} | {_paper_text(f, p)} |")
    lines.append(f"| minimum detectable effect (80% power) | {p.run(f'{f.diff}.mde', f.diff_scale, f.diff_fmt)} | — |")
    if room_from_metrics(f, p.metrics) is not None:
        lines.append(f"| {room_phrases(f)[0]} | {room_text(f, p)} | — |")
    result, reason = finding_verdict(f, p.metrics)
    method = p.text(f"{f.diff}.method", "as given in the metrics")
    ref = (f"Equivalence margin ±{p.rule(f'{f.key}.margin', f.margin, f.diff_scale, f.diff_fmt)}"
           if f.direction == 0 else
           f"Reference effect E = {p.rule(f'{f.key}.effect', reference_effect(f, p.metrics), f.diff_scale, f.diff_fmt)}")
    lines += ["", f"**Verdict: {result}**: {why_text(f, p.metrics, reason)}. "
                  f"Seeds: {p.text(f'{f.diff}.seeds', 'not recorded')}. "
                  f"Interval: {method}. {ref} ({f.effect_source or 'none stated'}); "
                  f"paper's direction: {_DIRECTION_WORDS[f.direction]}.", ""]
    if room_from_metrics(f, p.metrics) is not None:
        lines += [f"{room_phrases(f)[1]} {room_text(f, p)}"
                  f"{' (points)' if f.diff_scale == 100.0 else ''}: whatever the policies do, the difference "
                  "cannot leave this range.", ""]
    elif f.room:
        lines += ["The structural bound of this row was not measured in this run.", ""]
    if f.falsified_by:
        lines += [f"Would have been not reproduced with: {f.falsified_by}.", ""]
    if f"{f.diff}.all.mean" in p.metrics:
        all_result, _ = finding_verdict(f, p.metrics, f"{f.diff}.all")
        lines += [f"Sensitivity, every seed (collapsed and diverged included; {p.text(f'{f.diff}.all.seeds')}): "
                  f"{p.run(f'{f.diff}.all.mean', f.diff_scale, f.diff_fmt)} {ci_text(f, p, f'{f.diff}.all')}, "
                  f"MDE {p.run(f'{f.diff}.all.mde', f.diff_scale, f.diff_fmt)}: {all_result}.", ""]
    if f.note:
        lines += [f.note, ""]
    for name in f.figures:
        if name in figures:
            rel = os.path.relpath(os.path.abspath(figures[name]), os.path.abspath(report_dir))
            lines += [f"![{name}]({rel.replace(os.sep, '/')})", ""]
    return lines


def _health_section(p: Printer, figures: Mapping[str, str], report_dir: str) -> list[str]:
    def order(prefix):
        _, arm, seed = prefix.split(".", 2)
        return arm, int(seed.removeprefix("seed")) if seed.removeprefix("seed").isdigit() else 0, seed

    seeds = sorted({k.rsplit(".", 1)[0] for k in p.metrics if k.startswith("health.") and k.endswith(".status")},
                   key=order)
    if not seeds:
        return []
    lines = ["## Seed health", "", f"Rule: {health_lib.HEALTH_RULE}", "",
             "| arm | seed | status | reason | min valid-action rate | last valid-action rate | last success |",
             "|---|---|---|---|---|---|---|"]
    for prefix in seeds:
        _, arm, seed = prefix.split(".", 2)
        lines.append(f"| {arm} | {seed.removeprefix('seed')} | {p.text(prefix + '.status')} | "
                     f"{p.text(prefix + '.reason')} | {p.run(prefix + '.min_valid', 1.0, '.2f')} | "
                     f"{p.run(prefix + '.last_valid', 1.0, '.2f')} | {p.run(prefix + '.last_success', 1.0, '.2f')} |")
    bad = [f"{prefix.split('.')[1]} seed {prefix.split('.')[2].removeprefix('seed')} ({p.text(prefix + '.status')})"
           for prefix in seeds if p.text(prefix + ".status") in (health_lib.COLLAPSED, health_lib.DIVERGED)]
    lines += ["", ("Excluded from the primary verdicts: " + ", ".join(bad) + ".") if bad
              else "No seed collapsed or diverged.", ""]
    for name in sorted(figures):
        if name.startswith("learning_"):
            rel = os.path.relpath(os.path.abspath(figures[name]), os.path.abspath(report_dir))
            lines += [f"![{name}]({rel.replace(os.sep, '/')})", ""]
    return lines


def build_report(metrics: Mapping, report_dir: str | os.PathLike, *, figures: Mapping[str, str] | None = None,
                 findings: Sequence[Finding] = DEFAULT_FINDINGS, meta: Mapping[str, str] | None = None,
                 title: str = "jaxagent evaluation report") -> Report:
    """Markdown report: meta, the verdict rule, a summary table (one row per finding: measured, paper, CI, MDE,
    the range the bound allows, verdict, why, seeds), the seed-health table with the learning curves
    (figures `learning_<arm>`), then one
    section per finding that has at least one measured metric; figures are embedded by paths relative to
    report_dir; meta (e.g. {"Pass@(K,T) mode": "truncated"}) is listed verbatim."""
    figures, meta = dict(figures or {}), dict(meta or {})
    p = Printer(metrics)
    verdicts, reasons, missing, measured = {}, {}, [], []
    for f in findings:
        keys = [r.measured for r in f.rows if r.measured] + [f"{f.diff}.mean"]
        if not any(k in metrics for k in keys):
            missing.append(finding_title(f, metrics))
            continue
        measured.append(f)
        verdicts[f.key], reasons[f.key] = finding_verdict(f, metrics)
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", f"Verdict rule: {VERDICT_RULE}", ""]
    lines += _summary_table(measured, p, verdicts, reasons)
    lines += _health_section(p, figures, os.fspath(report_dir))
    for f in measured:
        lines += _finding_section(f, p, figures, os.fspath(report_dir))
    if missing:
        lines += ["## Not measured in this run", ""] + [f"- {t}" for t in missing] + [""]
    return Report("\n".join(lines), tuple(p.numbers), verdicts, reasons)


def printed_numbers(report: Report) -> list[tuple[str, float, str]]:
    """Every number the report printed as (text, source value, source key) with source key "run:<metric>",
    "paper:<PAPER_FIGURES key>" or "rule:<finding key>.effect|margin"."""
    return [(n.text, n.value, n.source) for n in report.numbers]


def write_report(report: Report, path: str | os.PathLike) -> str:
    """Write the markdown to path (creating its directory) and return the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(report.markdown)
    return path
