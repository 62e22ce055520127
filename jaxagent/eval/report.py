"""Host-side markdown report: each finding's measured figures beside the paper's, a seed-aware verdict each.

Inputs are a flat mapping `metric key -> number or text` (read from the run's JSON files by `load_metrics`, or
the eval stage's dict) and a mapping `figure name -> PNG path`. Every number the report prints goes through
one formatter that records its source ("run:<metric key>", "paper:<PAPER_FIGURES key>", or
"rule:<finding key>.effect|margin" for the reference effect / equivalence margin a finding states), so
`printed_numbers` shows that each printed figure comes from the run's files, PAPER_FIGURES or the rules.

A finding's measured difference is the metric prefix `<diff>`: `.mean`, `.lo`, `.hi` (95% CI), `.lo90`, `.hi90`
(90% CI, for TOST), `.se`, `.mde`, `.df`, `.n_seeds`, `.n_units`, and the texts `.method`, `.reason`, `.seeds`
(the seeds used and excluded), as `jaxagent.eval.stats.Estimate` writes them; `<diff>.all.*` is the same on
every seed (collapsed and diverged ones included), printed as a sensitivity line. Verdicts follow
`stats.VERDICT_RULE` (`finding_verdict`); the seed-health table follows `health.HEALTH_RULE` (metric keys
`health.<arm>.seed<k>.status|reason|min_valid|last_valid|last_success`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

from jaxagent.eval import health as health_lib
from jaxagent.eval import stats
from jaxagent.eval.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED  # noqa: F401

VERDICT_RULE = stats.VERDICT_RULE
SEI = "jaxagent's smallest effect of interest"
_PCT = "%"
_PAPER_ROWS = (  # (key, value, unit, description), from /work/shared/docs/study.md
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
    """One table row: a measured metric key (printed times `scale`) beside a PAPER_FIGURES key; an optional
    row is left out when the run did not write its metric."""

    label: str
    measured: str | None
    paper: str | None = None
    scale: float = 1.0
    fmt: str = ".1f"
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class Finding:
    """A finding: rows, the metric prefix of the measured difference (`<diff>.mean/.lo/.hi/...`), the sign of
    the paper's effect (+1, -1, or 0 for parity), the reference effect E for the power rule (in the
    difference's units, times metrics[effect_rel] when set) with its source, and the equivalence margin of a
    parity finding."""

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
    effect: float | None = None
    effect_source: str = ""
    effect_rel: str | None = None
    margin: float | None = None
    note: str = ""
    at_bound: tuple[str, ...] = ()   # (policy value keys..., upper-bound key): say when every policy sits on it


def reference_effect(f: Finding, metrics: Mapping) -> float | None:
    """E of a finding: f.effect, times metrics[f.effect_rel] when the effect is relative (None if absent)."""
    if f.effect is None:
        return None
    if f.effect_rel is None:
        return abs(f.effect)
    base = metrics.get(f.effect_rel)
    if not isinstance(base, (int, float)) or not math.isfinite(base):
        return None
    return abs(f.effect * base)


def _num(metrics: Mapping, key: str) -> float:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def estimate_from_metrics(metrics: Mapping, prefix: str) -> stats.Estimate | None:
    """The `stats.Estimate` stored under `<prefix>.*` (None when `<prefix>.mean` is absent); an entry with
    only mean / lo / hi (no method) reads as an interval without MDE or 90% CI."""
    if f"{prefix}.mean" not in metrics:
        return None
    g = lambda name: _num(metrics, f"{prefix}.{name}")  # noqa: E731
    method = metrics.get(f"{prefix}.method")
    if not isinstance(method, str):
        method = stats.NOT_AVAILABLE if not (math.isfinite(g("lo")) and math.isfinite(g("hi"))) else "given"
    n_seeds, n_units = g("n_seeds"), g("n_units")
    reason = str(metrics.get(f"{prefix}.reason", "") or "")
    if method == stats.NOT_AVAILABLE and not reason:
        reason = "no CI was measured"
    return stats.Estimate(g("mean"), g("lo"), g("hi"), g("lo90"), g("hi90"), g("se"), g("mde"), g("df"),
                          int(n_seeds) if math.isfinite(n_seeds) else 0, int(n_units) if math.isfinite(n_units) else 0,
                          method, reason)


def finding_verdict(f: Finding, metrics: Mapping, prefix: str | None = None) -> tuple[str, str]:
    """`stats.decide` on the finding's stored estimate (prefix default f.diff), direction, E and margin."""
    est = estimate_from_metrics(metrics, prefix or f.diff)
    return stats.decide(est, f.direction, reference_effect(f, metrics), f.margin)


def _pair(key, title, base_paper, rl_paper, direction, figures=(), rl="RL", base="base", what="(%)",
          diff_paper=None, scale=100.0, fmt=".1f", effect=None, effect_source="", margin=None, effect_rel=None,
          note="") -> Finding:
    """A finding comparing RL with base on one metric: rows <key>.base, <key>.rl, difference <key>.diff."""
    rows = (Row(f"{base} {what}", f"{key}.base", base_paper, scale, fmt),
            Row(f"{rl} {what}", f"{key}.rl", rl_paper, scale, fmt))
    return Finding(key, title, rows, f"{key}.diff", f"{rl} - {base}", direction, diff_paper, scale, fmt, figures,
                   effect, effect_source, effect_rel, margin, note)


def _matched(key, title, pairs_paper, tasks_paper, diff_paper, effect, effect_source) -> Finding:
    rows = (Row("pairs", f"{key}.n_pairs", pairs_paper, 1.0, ".0f"),
            Row("tasks", f"{key}.n_tasks", tasks_paper, 1.0, ".0f"))
    return Finding(key, title, rows, f"{key}.diff", "LLR RL - base (nats)", +1, diff_paper, 1.0, ".1f", ("llr_hist",),
                   effect, effect_source)


def _dyn(key, title, direction, diff_paper) -> Finding:
    rows = (Row("first logged value (mean over seeds)", f"{key}.first", None, 1.0, ".3f"),
            Row("last logged value (mean over seeds)", f"{key}.last", None, 1.0, ".3f"))
    return Finding(key, title, rows, f"{key}.diff", "last - first", direction, diff_paper, 1.0, ".3f", ("dynamics",),
                   abs(PAPER_FIGURES[diff_paper]["value"]), f"the paper's DeepCoder-MT change ({diff_paper})")


def _mix(tier, direction) -> Finding:
    key = f"f8_budgetmix_t{tier}"
    paper = f"f8_gain_t{tier}"
    if direction == 0:
        kw = dict(margin=0.04, effect_source="equivalence margin 4 points: the paper's smallest BudgetMix gain "
                                             "(75% tier)")
    else:
        kw = dict(effect=PAPER_FIGURES[paper]["value"] / 100, effect_source=f"the paper's gain ({paper})")
    return _pair(key, f"8. BudgetMix vs full-budget RL at {tier}% of T_max (largest K here; paper: K=8)", None, None,
                 direction, ("pass_at_t",), rl="BudgetMix", base="full-budget RL", diff_paper=paper, **kw)


def _ks_rows(key):
    return tuple(Row(f"RL - base at K={k} (points)", f"{key}.gap_k{k}", None, 100.0, ".1f", optional=True)
                 for k in (1, 2, 4, 8, 16, 32))


_PASS_SEI = dict(effect=0.10, effect_source=f"{SEI}: 10 points (the paper gives no FrozenLake number)")
DEFAULT_FINDINGS: tuple[Finding, ...] = (
    Finding("f1_breadth", "1. Pass@K at full budget as K grows: RL stays above base",
            _ks_rows("f1_breadth") + (Row("base at the largest K (%)", "f1_breadth.base", None, 100.0),
                                      Row("RL at the largest K (%)", "f1_breadth.rl", None, 100.0)),
            "f1_breadth.diff", "RL - base at the largest K (points)", +1, None, 100.0, ".1f",
            ("pass_at_k", "pass_kt_heatmap"), **_PASS_SEI),
    Finding("f2_shrink_frozenlake", "2. FrozenLake: the RL advantage shrinks from full to tight budget (largest K)",
            (Row("base, full budget (%)", "f2_shrink_frozenlake.base_full", None, 100.0),
             Row("RL, full budget (%)", "f2_shrink_frozenlake.rl_full", None, 100.0),
             Row("base, tightest tier (%)", "f2_shrink_frozenlake.base_tight", "f2_frozenlake_t25_base", 100.0),
             Row("RL, tightest tier (%)", "f2_shrink_frozenlake.rl_tight", "f2_frozenlake_t25_grpo", 100.0),
             Row("RL - base, full budget (points)", "f2_shrink_frozenlake.gap_full", None, 100.0),
             Row("RL - base, tightest tier (points)", "f2_shrink_frozenlake.gap_tight", None, 100.0),
             Row("tightest-tier tasks solvable (upper bound > 0, %)", "f2_shrink_frozenlake.solvable_tight", None,
                 100.0),
             Row("tightest tier (turns)", "f2_shrink_frozenlake.tight_turns", None, 1.0, ".0f")),
            "f2_shrink_frozenlake.diff", "gap(tight) - gap(full) (points)", -1, None, 100.0, ".1f", ("pass_at_t",),
            at_bound=("f2_shrink_frozenlake.base_tight", "f2_shrink_frozenlake.rl_tight",
                      "f2_shrink_frozenlake.solvable_tight"),
            **_PASS_SEI),
    _pair("f2_tight_bfcl", "2. BFCL, 25% budget (paper: K=8): advantage shrinks or inverts",
          "f2_bfcl_4b_t25_base", "f2_bfcl_4b_t25_grpo", -1, ("pass_at_t",), effect=0.005,
          effect_source="the paper's 25% gap (2.5 - 3.0)"),
    Finding("f3_step_frozenlake", "3. Step quality on matched states, FrozenLake (G sampled actions per policy)",
            (Row("matched states", "f3_step_frozenlake.n_states", None, 1.0, ".0f"),
             Row("G (sampled actions per policy and state)", "f3_step_frozenlake.g", None, 1.0, ".0f"),
             Row("RL better (%)", "f3_step_frozenlake.share_rl_better", "f3_frozenlake_rl_better", 100.0),
             Row("tie (%)", "f3_step_frozenlake.share_equal", None, 100.0),
             Row("RL worse (%)", "f3_step_frozenlake.share_rl_worse", None, 100.0),
             Row("mean Q* base", "f3_step_frozenlake.mean_q_base", None, 1.0, ".3f"),
             Row("mean Q* RL", "f3_step_frozenlake.mean_q_rl", None, 1.0, ".3f"),
             Row("invalid replies among the draws, base (%)", "f3_step_frozenlake.invalid_base", None, 100.0),
             Row("invalid replies among the draws, RL (%)", "f3_step_frozenlake.invalid_rl", None, 100.0),
             Row("exact expectation: RL better (%)", "f3_step_frozenlake.exact_share_rl_better", None, 100.0),
             Row("exact expectation: tie (%)", "f3_step_frozenlake.exact_share_equal", None, 100.0),
             Row("exact expectation: mean Q* RL - base", "f3_step_frozenlake.exact_diff", None, 1.0, ".3f")),
            "f3_step_frozenlake.diff", "mean Q* RL - base (G sampled)", -1, None, 1.0, ".3f", ("step_quality_depth",),
            0.05, f"{SEI}: 0.05 Q* (the paper says 'slightly below' without a FrozenLake number)",
            note="An invalid reply is scored as invalid (Q* = 0, a failed episode), not as staying put."),
    Finding("f3_step_deepcoder", "3. Step quality on matched states, DeepCoder-MT",
            (Row("RL better (%)", "f3_step_deepcoder.share_rl_better", "f3_deepcoder_rl_better", 100.0),
             Row("tie (%)", "f3_step_deepcoder.share_equal", None, 100.0)),
            "f3_step_deepcoder.diff", "mean quality RL - base", -1, None, 1.0, ".3f", (), 0.05,
            f"{SEI}: 0.05 (unit-test pass rate)"),
    Finding("f4_error_frozenlake", "4. Error recovery, FrozenLake (error states with the goal reachable, V* > 0)",
            (Row("error states with V* > 0", "f4_error_frozenlake.n_states", None, 1.0, ".0f"),
             Row("error states dropped (goal unreachable, V* = 0)", "f4_error_frozenlake.n_unreachable", None, 1.0,
                 ".0f"),
             Row("RL better at error states (%, G sampled)", "f4_error_frozenlake.share_rl_better",
                 "f4_frozenlake_error_rl_better", 100.0),
             Row("tie (%)", "f4_error_frozenlake.share_equal", None, 100.0),
             Row("RL worse (%)", "f4_error_frozenlake.share_rl_worse", None, 100.0),
             Row("exact expectation: RL better (%)", "f4_error_frozenlake.exact_share_rl_better", None, 100.0),
             Row("continuation success RL (%)", "f4_error_frozenlake.success_rl", "f4_frozenlake_cont_rl", 100.0),
             Row("continuation success base (%)", "f4_error_frozenlake.success_base", "f4_frozenlake_cont_base",
                 100.0)),
            "f4_error_frozenlake.diff", "continuation success RL - base (points)", +1, None, 100.0, ".1f",
            ("error_depth",), 0.127, "the paper's continuation gap (51.3 - 38.6 points)",
            note="An invalid reply is scored as invalid (Q* = 0), not as staying put."),
    Finding("f4_error_deepcoder", "4. Error recovery, DeepCoder-MT",
            (Row("continuation success RL (%)", "f4_error_deepcoder.success_rl", "f4_deepcoder_cont_rl", 100.0),
             Row("continuation success base (%)", "f4_error_deepcoder.success_base", "f4_deepcoder_cont_base", 100.0)),
            "f4_error_deepcoder.diff", "continuation success RL - base (points)", +1, None, 100.0, ".1f", (),
            0.156, "the paper's continuation gap (38.5 - 22.9 points)"),
    _pair("f4_correction_bfcl", "4. BFCL tool-call error correction rate", "f4_bfcl_correction_base",
          "f4_bfcl_correction_rl", +1, effect=0.142, effect_source="the paper's gap (41.4 - 27.2 points)"),
    Finding("f4_depth", "4. RL's error-state advantage grows with normalised depth (reachable error states only)",
            (Row("depth split (normalised depth, median)", "f4_depth.split", None, 1.0, ".2f"),
             Row("RL better, shallow half (%)", "f4_depth.first_bin", None, 100.0),
             Row("RL better, deep half (%)", "f4_depth.last_bin", None, 100.0)),
            "f4_depth.diff", "deep - shallow (points)", +1, None, 100.0, ".1f", ("error_depth",), **_PASS_SEI),
    _pair("f5_nll", "5. Per-action NLL under base (per seed: RL actions - base actions)", "f5_nll_base_actions",
          "f5_nll_rl_actions", +1, ("nll_hist",), rl="RL actions", base="base actions", what="(nats)", scale=1.0,
          fmt=".2f", effect=(12.20 - 10.25) / 10.25, effect_rel="f5_nll.base",
          effect_source="the paper's relative gap (12.20 - 10.25) / 10.25 = 19% of base's NLL"),
    _pair("f5_llr_success", "5. Cumulative LLR of successful trajectories", "f5_llr_success_base",
          "f5_llr_success_rl", +1, ("llr_hist",), what="(nats)", scale=1.0, effect=1.0,
          effect_source=f"{SEI}: 1 nat", note=(
              "By construction the expected LLR of RL's own trajectories is +KL(pi_RL || pi_base) >= 0 and that of "
              "base's is -KL(pi_base || pi_RL) <= 0, so this contrast is positive for any RL policy that moved; "
              "the length-matched control below is the informative test.")),
    _matched("f5_matched_frozenlake", "5. Length-matched LLR control, FrozenLake (both successful, same task, "
             "policy-token counts within 10%)", None, None, None, 1.0, f"{SEI}: 1 nat"),
    _matched("f5_matched_terminal", "5. Length-matched LLR control, Terminal", "f5_matched_terminal_pairs",
             "f5_matched_terminal_tasks", "f5_matched_terminal_diff", 185.9, "the paper's Terminal difference"),
    _matched("f5_matched_bfcl", "5. Length-matched LLR control, BFCL", "f5_matched_bfcl_pairs",
             "f5_matched_bfcl_tasks", "f5_matched_bfcl_diff", 805.8, "the paper's BFCL difference"),
    _dyn("f6_r_multi", "6. Trajectory reward R_multi over training", +1, "f6_r_multi_delta"),
    _dyn("f6_r_single", "6. Single-step reward R_single over training", -1, "f6_r_single_delta"),
    _pair("f7_process_frozenlake", "7. Oracle process reward vs GRPO, FrozenLake, tightest tier", None, None, +1,
          rl="GRPO + process reward", base="GRPO", **_PASS_SEI),
    _pair("f7_gigpo_bfcl", "7. GiGPO vs GRPO, BFCL, 25% budget (paper: no gain)", None, None, 0,
          rl="GiGPO", base="GRPO", margin=0.05, effect_source="equivalence margin 5 points (jaxagent's choice)"),
    _mix(25, +1), _mix(50, +1), _mix(75, +1), _mix(100, 0),
)


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


class _Printer:
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


def _ci_text(f: Finding, p: _Printer, prefix: str) -> str:
    est = estimate_from_metrics(p.metrics, prefix)
    if est is None:
        return "—"
    if not est.available:
        return f"n/a ({est.reason})"
    return (f"[{p.run(f'{prefix}.lo', f.diff_scale, f.diff_fmt)}, "
            f"{p.run(f'{prefix}.hi', f.diff_scale, f.diff_fmt)}]")


def _mde_text(f: Finding, p: _Printer, prefix: str) -> str:
    mde = p.run(f"{prefix}.mde", f.diff_scale, f.diff_fmt)
    if f.direction == 0:
        ref = f"margin ±{p.rule(f'{f.key}.margin', f.margin, f.diff_scale, f.diff_fmt)}"
    else:
        ref = f"E {p.rule(f'{f.key}.effect', reference_effect(f, p.metrics), f.diff_scale, f.diff_fmt)}"
    return f"{mde} ({ref})"


def _paper_text(f: Finding, p: _Printer) -> str:
    return p.paper(f.diff_paper) if f.diff_paper else _DIRECTION_WORDS[f.direction]


def _summary_table(findings, p: _Printer, verdicts) -> list[str]:
    lines = ["## Summary: one row per finding", "",
             "| finding | measured | paper | 95% CI | MDE (reference) | verdict | seeds |",
             "|---|---|---|---|---|---|---|"]
    for f in findings:
        if f.key not in verdicts:
            continue
        lines.append(f"| {f.title} | {p.run(f'{f.diff}.mean', f.diff_scale, f.diff_fmt)} | {_paper_text(f, p)} | "
                     f"{_ci_text(f, p, f.diff)} | {_mde_text(f, p, f.diff)} | {verdicts[f.key]} | "
                     f"{p.text(f'{f.diff}.seeds')} |")
    return lines + [""]


def _finding_section(f: Finding, p: _Printer, figures: Mapping[str, str], report_dir: str) -> list[str]:
    lines = [f"## {f.title}", "", "| quantity | measured | paper |", "|---|---|---|"]
    for row in f.rows:
        if row.optional and row.measured not in p.metrics:
            continue
        lines.append(f"| {row.label} | {p.run(row.measured, row.scale, row.fmt)} | {p.paper(row.paper)} |")
    mean = p.run(f"{f.diff}.mean", f.diff_scale, f.diff_fmt)
    lines.append(f"| {f.diff_label}, 95% CI | {mean} {_ci_text(f, p, f.diff)} | {_paper_text(f, p)} |")
    lines.append(f"| minimum detectable effect (80% power) | {p.run(f'{f.diff}.mde', f.diff_scale, f.diff_fmt)} | — |")
    result, reason = finding_verdict(f, p.metrics)
    method = p.text(f"{f.diff}.method", "as given in the metrics")
    ref = (f"Equivalence margin ±{p.rule(f'{f.key}.margin', f.margin, f.diff_scale, f.diff_fmt)}"
           if f.direction == 0 else
           f"Reference effect E = {p.rule(f'{f.key}.effect', reference_effect(f, p.metrics), f.diff_scale, f.diff_fmt)}")
    lines += ["", f"**Verdict: {result}**: {reason}. Seeds: {p.text(f'{f.diff}.seeds', 'not recorded')}. "
                  f"Interval: {method}. {ref} ({f.effect_source or 'none stated'}); "
                  f"paper's direction: {_DIRECTION_WORDS[f.direction]}.", ""]
    if f"{f.diff}.all.mean" in p.metrics:
        all_result, _ = finding_verdict(f, p.metrics, f"{f.diff}.all")
        lines += [f"Sensitivity, every seed (collapsed and diverged included; {p.text(f'{f.diff}.all.seeds')}): "
                  f"{p.run(f'{f.diff}.all.mean', f.diff_scale, f.diff_fmt)} {_ci_text(f, p, f'{f.diff}.all')}, "
                  f"MDE {p.run(f'{f.diff}.all.mde', f.diff_scale, f.diff_fmt)}: {all_result}.", ""]
    if f.note:
        lines += [f.note, ""]
    if bound_note := _at_bound_note(f, p.metrics):
        lines += [bound_note, ""]
    for name in f.figures:
        if name in figures:
            rel = os.path.relpath(os.path.abspath(figures[name]), os.path.abspath(report_dir))
            lines += [f"![{name}]({rel.replace(os.sep, '/')})", ""]
    return lines


def _at_bound_note(f: Finding, metrics: Mapping) -> str:
    """A sentence when every policy value in f.at_bound equals the structural upper bound (its last key): the
    difference there is then fixed by the bound, not measured against it."""
    if not f.at_bound:
        return ""
    *values, bound = (_num(metrics, k) for k in f.at_bound)
    if not all(math.isfinite(v) for v in (*values, bound)) or any(abs(v - bound) > 1e-9 for v in values):
        return ""
    return (f"At the tightest tier every policy reaches the structural upper bound ({100 * bound:.1f}% of tasks "
            "solvable within the budget): the gap there is 0 by construction, so this difference measures how "
            "far the bound binds, not a loss of RL's advantage on tasks it could still solve.")


def _health_section(p: _Printer, figures: Mapping[str, str], report_dir: str) -> list[str]:
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
    verdict, seeds), the seed-health table with the learning curves (figures `learning_<arm>`), then one
    section per finding that has at least one measured metric; figures are embedded by paths relative to
    report_dir; meta (e.g. {"Pass@(K,T) mode": "truncated"}) is listed verbatim."""
    figures, meta = dict(figures or {}), dict(meta or {})
    p = _Printer(metrics)
    verdicts, reasons, missing, measured = {}, {}, [], []
    for f in findings:
        keys = [r.measured for r in f.rows if r.measured] + [f"{f.diff}.mean"]
        if not any(k in metrics for k in keys):
            missing.append(f.title)
            continue
        measured.append(f)
        verdicts[f.key], reasons[f.key] = finding_verdict(f, metrics)
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", f"Verdict rule: {VERDICT_RULE}", ""]
    lines += _summary_table(measured, p, verdicts)
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
