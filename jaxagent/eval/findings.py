"""The study's findings as data: what each finding measures (its metric keys and rows), the paper's figures
beside it, its smallest effect of interest or equivalence margin, and its seed-aware verdict
(`finding_verdict`, by `stats.VERDICT_RULE`). `report` renders them.

A finding's measured difference is the metric prefix `<diff>`: `.mean`, `.lo`, `.hi` (95% CI), `.lo90`, `.hi90`
(90% CI, for TOST), `.se`, `.mde`, `.df`, `.n_seeds`, `.n_units`, and the texts `.method`, `.reason`, `.seeds`
(the seeds used and excluded), as `jaxagent.eval.stats.Estimate` writes them.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from jaxagent.eval import stats

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
    ceiling: tuple[str, str] = ()    # (comparator value key, upper-bound key): see `ceiling_reason`


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


def metric_number(metrics: Mapping, key: str) -> float:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def estimate_from_metrics(metrics: Mapping, prefix: str) -> stats.Estimate | None:
    """The `stats.Estimate` stored under `<prefix>.*` (None when `<prefix>.mean` is absent); an entry with
    only mean / lo / hi (no method) reads as an interval without MDE or 90% CI."""
    if f"{prefix}.mean" not in metrics:
        return None
    g = lambda name: metric_number(metrics, f"{prefix}.{name}")  # noqa: E731
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
    verdict, reason = stats.decide(est, f.direction, reference_effect(f, metrics), f.margin)
    ceiling = ceiling_reason(f, metrics)
    if ceiling and est is not None and not (est.lo > 0 or est.hi < 0):
        return stats.UNDERPOWERED, f"{ceiling} (without the bound: {verdict}, {reason})"
    return verdict, reason


def ceiling_reason(f: Finding, metrics: Mapping) -> str:
    """Why a directional finding cannot show its reference effect E at this budget tier, or "".

    The comparator's Pass@K (e.g. GRPO's) sits within h = U - comparator of the structural upper bound U
    (the share of tasks the optimal policy solves within the budget, at the same K); the other policy can
    then beat it by at most h. When h < E an effect of size E cannot occur, whatever the sample size, and a
    CI that holds 0 says nothing about the paper's claim: the verdict is underpowered, with this reason,
    instead of depending on whether some seed happened to fall a task short of the bound."""
    if not f.ceiling or f.direction == 0:
        return ""
    comparator, bound = (metric_number(metrics, k) for k in f.ceiling)
    e = reference_effect(f, metrics)
    if e is None or not (math.isfinite(comparator) and math.isfinite(bound)) or bound - comparator >= e:
        return ""
    s, fmt = f.diff_scale, f.diff_fmt
    return (f"ceiling: the comparator reaches {comparator * s:{fmt}} of a structural upper bound of "
            f"{bound * s:{fmt}} at this tier, so no policy can beat it by more than {(bound - comparator) * s:{fmt}} "
            f"< E = {e * s:{fmt}}")


def _pair(key, title, base_paper, rl_paper, direction, figures=(), rl="RL", base="base", what="(%)",
          diff_paper=None, scale=100.0, fmt=".1f", effect=None, effect_source="", margin=None, effect_rel=None,
          note="", ceiling=()) -> Finding:
    """A finding comparing RL with base on one metric: rows <key>.base, <key>.rl, difference <key>.diff (and
    the structural upper bound when `ceiling` names it)."""
    rows = (Row(f"{base} {what}", f"{key}.base", base_paper, scale, fmt),
            Row(f"{rl} {what}", f"{key}.rl", rl_paper, scale, fmt))
    if ceiling:
        rows += (Row(f"structural upper bound {what}", ceiling[1], None, scale, fmt, optional=True),)
    return Finding(key, title, rows, f"{key}.diff", f"{rl} - {base}", direction, diff_paper, scale, fmt, figures,
                   effect, effect_source, effect_rel, margin, note, ceiling=ceiling)


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
        kw = dict(effect=PAPER_FIGURES[paper]["value"] / 100, effect_source=f"the paper's gain ({paper})",
                  ceiling=(f"{key}.base", f"{key}.bound"))
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
          rl="GRPO + process reward", base="GRPO",
          ceiling=("f7_process_frozenlake.base", "f7_process_frozenlake.bound"), **_PASS_SEI),
    _pair("f7_gigpo_bfcl", "7. GiGPO vs GRPO, BFCL, 25% budget (paper: no gain)", None, None, 0,
          rl="GiGPO", base="GRPO", margin=0.05, effect_source="equivalence margin 5 points (jaxagent's choice)"),
    _mix(25, +1), _mix(50, +1), _mix(75, +1), _mix(100, 0),
)
