"""Host-side markdown report: each finding's measured figures beside the paper's, a verdict per finding.

Inputs are a flat mapping `metric key -> number` (read from the run's JSON files by `load_metrics`) and a
mapping `figure name -> PNG path`. Every number the report prints goes through one formatter that records
its source ("run:<metric key>" or "paper:<PAPER_FIGURES key>"), so `printed_numbers` can show that each
printed figure comes from the run's files or from PAPER_FIGURES.

Verdict rule (`verdict`), on the CI [lo, hi] of the measured difference (metric keys `<diff>.lo`, `<diff>.hi`):
- paper direction +1 / -1: reproduced if the CI excludes 0 on the paper's side, not reproduced if it excludes
  0 on the other side, inconclusive otherwise or when no CI was measured;
- paper direction 0 (the paper reports parity): reproduced if the CI contains 0, else not reproduced.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
VERDICT_RULE = ("on the CI of the measured difference: reproduced if it excludes zero on the paper's side, "
                "not reproduced if it excludes zero on the other side, inconclusive otherwise or without a CI; "
                "where the paper reports parity: reproduced if the CI contains zero, else not reproduced.")

_PCT = "%"
_PAPER_ROWS = (  # (key, value, unit, description), from /work/shared/PAPER.md
    # Finding 2: budget dependence at K=8, 25% of T_max.
    ("f2_bfcl_4b_t25_base", 3.0, _PCT, "BFCL-v3, Qwen3-4B, 25% budget, K=8: base model"),
    ("f2_bfcl_4b_t25_grpo", 2.5, _PCT, "BFCL-v3, Qwen3-4B, 25% budget, K=8: full-budget GRPO"),
    ("f2_frozenlake_t25_base", 30.3, _PCT, "FrozenLake, 25% budget, K=8: base model"),
    ("f2_frozenlake_t25_grpo", 28.7, _PCT, "FrozenLake, 25% budget, K=8: full-budget GRPO"),
    # Finding 3: step quality on matched states (G=16, exact Q* with discount 0.95 on FrozenLake).
    ("f3_deepcoder_rl_better", 46.8, _PCT,
     "DeepCoder-MT: share of matched states where RL's mean action quality is higher"),
    ("f3_frozenlake_rl_better", 42.8, _PCT,
     "FrozenLake: share of matched states where RL's mean action quality is higher"),
    # Finding 4: error states (a wrong action injected at the previous step).
    ("f4_frozenlake_error_rl_better", 65.7, _PCT, "FrozenLake: share of error states where RL picks the better action"),
    ("f4_deepcoder_error_rl_better", 67.3, _PCT,
     "DeepCoder-MT: share of error states where RL picks the better action"),
    ("f4_frozenlake_cont_rl", 51.3, _PCT, "FrozenLake: success continuing from error states, RL"),
    ("f4_frozenlake_cont_base", 38.6, _PCT, "FrozenLake: success continuing from error states, base"),
    ("f4_deepcoder_cont_rl", 38.5, _PCT, "DeepCoder-MT: success continuing from error states, RL"),
    ("f4_deepcoder_cont_base", 22.9, _PCT, "DeepCoder-MT: success continuing from error states, base"),
    ("f4_bfcl_correction_rl", 41.4, _PCT, "BFCL case study: correction rate of RL on tool-call-error prefixes"),
    ("f4_bfcl_correction_base", 27.2, _PCT, "BFCL case study: correction rate of base on tool-call-error prefixes"),
    ("f4_bfcl_prefixes", 191, "count", "BFCL case study: prefixes with a tool-call error (91 from RL, 100 from base)"),
    ("f4_bfcl_prefixes_rl", 91, "count", "BFCL case study: error prefixes drawn from RL trajectories"),
    ("f4_bfcl_prefixes_base", 100, "count", "BFCL case study: error prefixes drawn from base trajectories"),
    # Finding 5: likelihood under the base policy.
    ("f5_nll_rl_actions", 12.2, "nats", "mean per-action NLL under base of RL actions"),
    ("f5_nll_base_actions", 10.25, "nats", "mean per-action NLL under base of base actions"),
    ("f5_llr_success_rl", 228.0, "nats", "cumulative LLR log pi_RL - log pi_base, successful RL trajectories (about)"),
    ("f5_llr_success_base", 26.0, "nats",
     "cumulative LLR log pi_RL - log pi_base, successful base trajectories (about)"),
    ("f5_matched_terminal_diff", 185.9, "nats",
     "Terminal: length-matched mean LLR difference RL - base (95% CI above 0)"),
    ("f5_matched_terminal_pairs", 193, "count", "Terminal: length-matched pairs"),
    ("f5_matched_terminal_tasks", 89, "count", "Terminal: tasks among length-matched pairs"),
    ("f5_matched_bfcl_diff", 805.8, "nats", "BFCL: length-matched mean LLR difference RL - base (95% CI above 0)"),
    ("f5_matched_bfcl_pairs", 283, "count", "BFCL: length-matched pairs"),
    ("f5_matched_bfcl_tasks", 146, "count", "BFCL: tasks among length-matched pairs"),
    # Finding 6: training dynamics on DeepCoder-MT.
    ("f6_r_multi_delta", 0.331, "reward", "DeepCoder-MT: rise of trajectory reward R_multi over training"),
    ("f6_r_single_delta", -0.097, "reward", "DeepCoder-MT: change (fall) of single-step reward R_single over training"),
    # Finding 8: BudgetMix gains over full-budget RL (points), by budget tier.
    ("f8_gain_t25", 7.5, "points", "BudgetMix minus full-budget RL at 25% of T_max"),
    ("f8_gain_t50", 5.3, "points", "BudgetMix minus full-budget RL at 50% of T_max"),
    ("f8_gain_t75", 4.0, "points", "BudgetMix minus full-budget RL at 75% of T_max"),
    ("f8_gain_t100", 0.0, "points", "BudgetMix minus full-budget RL at 100% of T_max (parity)"),
    ("f8_gain_t25_model_a", 6.6, "points", "25% tier gain, one of the two models (summaries do not say which)"),
    ("f8_gain_t25_model_b", 8.35, "points", "25% tier gain, the other model (6.6 and 8.35 average to 7.475)"),
)
PAPER_FIGURES: dict[str, dict] = {k: {"value": v, "unit": u, "description": d} for k, v, u, d in _PAPER_ROWS}


@dataclasses.dataclass(frozen=True)
class Row:
    """One table row: a measured metric key (printed times `scale`) beside a PAPER_FIGURES key."""

    label: str
    measured: str | None
    paper: str | None = None
    scale: float = 1.0
    fmt: str = ".1f"


@dataclasses.dataclass(frozen=True)
class Finding:
    """A finding: rows, the metric key prefix of the measured difference (`<diff>.mean/.lo/.hi`), and the
    sign of the paper's effect (+1, -1, or 0 for parity)."""

    key: str
    title: str
    rows: tuple[Row, ...]
    diff: str
    diff_label: str
    direction: int
    diff_paper: str | None = None
    diff_scale: float = 1.0
    diff_fmt: str = ".1f"
    figures: tuple[str, ...] = ()


def _pair(key, title, base_paper, rl_paper, direction, figures=(), rl="RL", base="base", what="(%)",
          diff_paper=None, scale=100.0, fmt=".1f") -> Finding:
    """A finding comparing RL with base on one metric: rows <key>.base, <key>.rl, difference <key>.diff."""
    rows = (Row(f"{base} {what}", f"{key}.base", base_paper, scale, fmt),
            Row(f"{rl} {what}", f"{key}.rl", rl_paper, scale, fmt))
    return Finding(key, title, rows, f"{key}.diff", f"{rl} - {base}", direction, diff_paper, scale, fmt, figures)


def _error(key, title, better_paper, rl_paper, base_paper) -> Finding:
    rows = (Row("RL better at error states (%)", f"{key}.share_rl_better", better_paper, 100.0),
            Row("continuation success RL (%)", f"{key}.success_rl", rl_paper, 100.0),
            Row("continuation success base (%)", f"{key}.success_base", base_paper, 100.0))
    return Finding(key, title, rows, f"{key}.diff", "success RL - base (points)", +1, None, 100.0, ".1f",
                   ("error_depth",))


def _step(key, title, better_paper) -> Finding:
    rows = (Row("RL better (%)", f"{key}.share_rl_better", better_paper, 100.0),
            Row("tie (%)", f"{key}.share_equal", None, 100.0),
            Row("RL worse (%)", f"{key}.share_rl_worse", None, 100.0),
            Row("mean Q* base", f"{key}.mean_q_base", None, 1.0, ".3f"),
            Row("mean Q* RL", f"{key}.mean_q_rl", None, 1.0, ".3f"))
    return Finding(key, title, rows, f"{key}.diff", "mean Q* RL - base", -1, None, 1.0, ".3f", ("step_quality_depth",))


def _matched(key, title, pairs_paper, tasks_paper, diff_paper) -> Finding:
    rows = (Row("pairs", f"{key}.n_pairs", pairs_paper, 1.0, ".0f"),
            Row("tasks", f"{key}.n_tasks", tasks_paper, 1.0, ".0f"))
    return Finding(key, title, rows, f"{key}.diff", "LLR RL - base (nats)", +1, diff_paper, 1.0, ".1f", ("llr_hist",))


def _dyn(key, title, direction, diff_paper) -> Finding:
    rows = (Row("first logged value", f"{key}.first", None, 1.0, ".3f"),
            Row("last logged value", f"{key}.last", None, 1.0, ".3f"))
    return Finding(key, title, rows, f"{key}.diff", "last - first", direction, diff_paper, 1.0, ".3f", ("dynamics",))


def _mix(tier, direction) -> Finding:
    key = f"f8_budgetmix_t{tier}"
    return _pair(key, f"8. BudgetMix vs full-budget RL at {tier}% of T_max (largest K here; paper: K=8)", None, None,
                 direction, ("pass_at_t",),
                 rl="BudgetMix", base="full-budget RL", diff_paper=f"f8_gain_t{tier}")


DEFAULT_FINDINGS: tuple[Finding, ...] = (
    _pair("f1_breadth", "1. Pass@K at full budget, largest K: RL above base", None, None, +1,
          ("pass_at_k", "pass_kt_heatmap")),
    _pair("f2_full_frozenlake", "2. FrozenLake, full budget (largest K here; paper: K=8): RL advantage", None, None, +1,
          ("pass_at_t",)),
    _pair("f2_tight_frozenlake", "2. FrozenLake, 25% budget (largest K here; paper: K=8): advantage shrinks or inverts",
          "f2_frozenlake_t25_base", "f2_frozenlake_t25_grpo", -1, ("pass_at_t",)),
    _pair("f2_tight_bfcl", "2. BFCL, 25% budget (largest K here; paper: K=8): advantage shrinks or inverts",
          "f2_bfcl_4b_t25_base", "f2_bfcl_4b_t25_grpo", -1, ("pass_at_t",)),
    _step("f3_step_frozenlake", "3. Step quality on matched states, FrozenLake", "f3_frozenlake_rl_better"),
    _step("f3_step_deepcoder", "3. Step quality on matched states, DeepCoder-MT", "f3_deepcoder_rl_better"),
    _error("f4_error_frozenlake", "4. Error recovery, FrozenLake", "f4_frozenlake_error_rl_better",
           "f4_frozenlake_cont_rl", "f4_frozenlake_cont_base"),
    _error("f4_error_deepcoder", "4. Error recovery, DeepCoder-MT", "f4_deepcoder_error_rl_better",
           "f4_deepcoder_cont_rl", "f4_deepcoder_cont_base"),
    _pair("f4_correction_bfcl", "4. BFCL tool-call error correction rate", "f4_bfcl_correction_base",
          "f4_bfcl_correction_rl", +1),
    Finding("f4_depth", "4. RL's error-state advantage grows with normalised depth",
            (Row("RL better, first depth bin (%)", "f4_depth.first_bin", None, 100.0),
             Row("RL better, last depth bin (%)", "f4_depth.last_bin", None, 100.0)),
            "f4_depth.diff", "last bin - first bin (points)", +1, None, 100.0, ".1f", ("error_depth",)),
    _pair("f5_nll", "5. Per-action NLL under base", "f5_nll_base_actions", "f5_nll_rl_actions", +1, ("nll_hist",),
          rl="RL actions", base="base actions", what="(nats)", scale=1.0, fmt=".2f"),
    _pair("f5_llr_success", "5. Cumulative LLR of successful trajectories", "f5_llr_success_base", "f5_llr_success_rl",
          +1, ("llr_hist",), what="(nats)", scale=1.0),
    _matched("f5_matched_terminal", "5. Length-matched LLR control, Terminal", "f5_matched_terminal_pairs",
             "f5_matched_terminal_tasks", "f5_matched_terminal_diff"),
    _matched("f5_matched_bfcl", "5. Length-matched LLR control, BFCL", "f5_matched_bfcl_pairs",
             "f5_matched_bfcl_tasks", "f5_matched_bfcl_diff"),
    _dyn("f6_r_multi", "6. Trajectory reward R_multi over training", +1, "f6_r_multi_delta"),
    _dyn("f6_r_single", "6. Single-step reward R_single over training", -1, "f6_r_single_delta"),
    _pair("f7_process_frozenlake", "7. Oracle process reward vs GRPO, FrozenLake, 25% budget", None, None, +1,
          rl="GRPO + process reward", base="GRPO"),
    _pair("f7_gigpo_bfcl", "7. GiGPO vs GRPO, BFCL, 25% budget (paper: no gain)", None, None, 0,
          rl="GiGPO", base="GRPO"),
    _mix(25, +1), _mix(50, +1), _mix(75, +1), _mix(100, 0),
)


def verdict(lo: float | None, hi: float | None, direction: int) -> str:
    """The module's rule on the CI [lo, hi] of the measured difference and the paper's direction."""
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return INCONCLUSIVE
    if direction == 0:
        return REPRODUCED if lo <= 0.0 <= hi else NOT_REPRODUCED
    lo_s, hi_s = sorted((direction * lo, direction * hi))
    if lo_s > 0.0:
        return REPRODUCED
    if hi_s < 0.0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def flatten_metrics(tree, prefix: str = "") -> dict[str, float]:
    """Flatten nested dicts / named tuples of scalars into {"a.b.c": float}; non-scalars are skipped."""
    out: dict[str, float] = {}
    if hasattr(tree, "_asdict"):
        tree = tree._asdict()
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out.update(flatten_metrics(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    try:
        value = float(tree)
    except (TypeError, ValueError):
        return out
    if prefix:
        out[prefix] = value
    return out


def load_metrics(paths: Sequence[str | os.PathLike]) -> dict[str, float]:
    """Read the run's JSON metric files into one flat mapping; a key defined twice is an error."""
    merged: dict[str, float] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            flat = flatten_metrics(json.load(f))
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
    """The markdown text, every number it printed (in order) and the verdict per finding key."""

    markdown: str
    numbers: tuple[PrintedNumber, ...]
    verdicts: dict[str, str]


class _Printer:
    """Formats numbers and records where each came from."""

    def __init__(self, metrics: Mapping[str, float]):
        self.metrics, self.numbers = metrics, []

    def run(self, key: str | None, scale: float = 1.0, fmt: str = ".1f") -> str:
        value = None if key is None else self.metrics.get(key)
        if value is None or not math.isfinite(value):
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


_DIRECTION_WORDS = {1: "positive", -1: "negative", 0: "parity"}


def _finding_section(f: Finding, p: _Printer, figures: Mapping[str, str], report_dir: str) -> tuple[list[str], str]:
    lines = [f"## {f.title}", "", "| quantity | measured | paper |", "|---|---|---|"]
    for row in f.rows:
        lines.append(f"| {row.label} | {p.run(row.measured, row.scale, row.fmt)} | {p.paper(row.paper)} |")
    mean = p.run(f"{f.diff}.mean", f.diff_scale, f.diff_fmt)
    lo, hi = (p.metrics.get(f"{f.diff}.{b}") for b in ("lo", "hi"))
    ci = " (no CI)" if mean != "—" else ""
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        ci = f" [{p.run(f'{f.diff}.lo', f.diff_scale, f.diff_fmt)}, {p.run(f'{f.diff}.hi', f.diff_scale, f.diff_fmt)}]"
    paper_diff = p.paper(f.diff_paper) if f.diff_paper else _DIRECTION_WORDS[f.direction]
    lines.append(f"| {f.diff_label} (CI) | {mean}{ci} | {paper_diff} |")
    result = verdict(lo, hi, f.direction)
    lines += ["", f"**Verdict: {result}** (paper's direction of the difference: {_DIRECTION_WORDS[f.direction]})", ""]
    for name in f.figures:
        if name in figures:
            rel = os.path.relpath(os.path.abspath(figures[name]), os.path.abspath(report_dir))
            lines += [f"![{name}]({rel.replace(os.sep, '/')})", ""]
    return lines, result


def build_report(metrics: Mapping[str, float], report_dir: str | os.PathLike, *,
                 figures: Mapping[str, str] | None = None,
                 findings: Sequence[Finding] = DEFAULT_FINDINGS, meta: Mapping[str, str] | None = None,
                 title: str = "jaxagent evaluation report") -> Report:
    """Markdown report over the findings that have at least one measured metric; figures are embedded by
    paths relative to report_dir; meta (e.g. {"Pass@(K,T) mode": "truncated"}) is listed verbatim."""
    figures, meta = dict(figures or {}), dict(meta or {})
    p = _Printer(metrics)
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", f"Verdict rule, {VERDICT_RULE}", ""]
    verdicts, missing = {}, []
    for f in findings:
        keys = [r.measured for r in f.rows if r.measured] + [f"{f.diff}.mean"]
        if not any(k in metrics for k in keys):
            missing.append(f.title)
            continue
        section, verdicts[f.key] = _finding_section(f, p, figures, os.fspath(report_dir))
        lines += section
    if missing:
        lines += ["## Not measured in this run", ""] + [f"- {t}" for t in missing] + [""]
    return Report("\n".join(lines), tuple(p.numbers), verdicts)


def printed_numbers(report: Report) -> list[tuple[str, float, str]]:
    """Every number the report printed as (text, source value, source key) with source key "run:<metric>"
    or "paper:<PAPER_FIGURES key>"."""
    return [(n.text, n.value, n.source) for n in report.numbers]


def write_report(report: Report, path: str | os.PathLike) -> str:
    """Write the markdown to path (creating its directory) and return the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(report.markdown)
    return path
