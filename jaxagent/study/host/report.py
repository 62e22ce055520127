"""Markdown report of the host-domain study: per domain a section with the split sizes, the RL-vs-base
Pass@(K,T) table per budget tier beside the structural upper bound, and findings 1, 2, 3, 4, 5, 6 and 7 decided by
the FrozenLake study's rule (`findings.finding_verdict`, `stats.VERDICT_RULE`, with the range of the difference
the structural bound allows, `findings.room_from_metrics`, printed as "bound allows"); an underpowered row gives
the range of seeds that would decide it (`findings.seeds_to_decide`) and every row says which result would have
made it "not reproduced" (`Finding.falsified_by`). A finding the run could not measure says why in a note
(`<d>.note.<finding>`, e.g. no matched state for finding 3, no error prefixes for finding 4, finding 6 outside
the coding domain). Metric keys as `host_metrics` writes them.
No dimension legend: host-side text.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from jaxagent.eval import health as health_lib, stats
from jaxagent.eval.findings import Finding, finding_verdict, reference_effect, room_from_metrics, room_phrases
from jaxagent.eval.report import Printer, ci_text, room_text, why_text


def pass_table(d: str, metrics: Mapping, policies: Sequence[str], tiers: Sequence[int], ks: Sequence[int],
               t_max: int) -> list[str]:
    """Rows per (tier, K): task-mean Pass@K in % of each policy (arms: mean over their included seeds) and the
    structural upper bound; `d` is the metrics' prefix (the domain, or `<domain>.<split>` for a further split)."""
    pr = Printer(metrics)
    lines = ["| T (turns) | budget | K | " + " | ".join(policies) + " | upper bound |",
             "|---|---|---|" + "---|" * len(policies) + "---|"]
    for t in tiers:
        for k in ks:
            cells = [pr.run(f"{d}.pass.{p}.t{t}.k{k}", 100.0) for p in policies]
            lines.append(f"| {t} | {100 * t / t_max:.0f}% | {k} | " + " | ".join(cells) +
                         f" | {pr.run(f'{d}.bound.t{t}', 100.0)} |")
    return lines


def findings_lines(findings: Sequence[Finding], metrics: Mapping) -> tuple[list[str], dict, dict]:
    """A summary table of the measured findings (measured, CI, MDE beside E, the range the bound allows, verdict
    and why) and one detail table each, with the result that would have made the row "not reproduced"; returns
    (lines, verdicts, reasons)."""
    pr = Printer(metrics)
    verdicts, reasons = {}, {}
    lines = ["| finding | measured | 95% CI | MDE (reference E) | bound allows | verdict | why | seeds |",
             "|---|---|---|---|---|---|---|---|"]
    detail = []
    for f in findings:
        if f"{f.diff}.mean" not in metrics:
            continue
        verdicts[f.key], reasons[f.key] = finding_verdict(f, metrics)
        if f.direction == 0:  # parity: the equivalence margin stands where E stands for a directional row
            margin = format(f.margin * f.diff_scale, f.diff_fmt)
            e_text, ref = f"margin ±{margin}", f"Equivalence margin ±{margin}"
        else:
            e = reference_effect(f, metrics)
            e_text = "—" if e is None else format(e * f.diff_scale, f.diff_fmt)
            ref = f"Reference effect E = {e_text}"
        why = why_text(f, metrics, reasons[f.key])
        lines.append(f"| {f.title} | {pr.run(f.diff + '.mean', f.diff_scale, f.diff_fmt)} | "
                     f"{ci_text(f, pr, f.diff)} | {pr.run(f.diff + '.mde', f.diff_scale, f.diff_fmt)} "
                     f"({e_text}) | {room_text(f, pr)} | {verdicts[f.key]} | {why.replace('|', '/')} | "
                     f"{pr.text(f.diff + '.seeds')} |")
        detail += ["", f"**{f.title}**", "", "| quantity | measured |", "|---|---|"]
        for row in f.rows:
            if row.optional and row.measured not in metrics:
                continue
            detail.append(f"| {row.label} | {pr.run(row.measured, row.scale, row.fmt)} |")
        detail.append(f"| {f.diff_label}, 95% CI | {pr.run(f.diff + '.mean', f.diff_scale, f.diff_fmt)} "
                      f"{ci_text(f, pr, f.diff)} |")
        if room_from_metrics(f, metrics) is not None:
            detail.append(f"| {room_phrases(f)[0]} | {room_text(f, pr)} |")
        detail += ["", f"Verdict: **{verdicts[f.key]}**: {why}. Interval: "
                       f"{pr.text(f.diff + '.method')}. {ref} ({f.effect_source})."]
        if room_from_metrics(f, metrics) is not None:
            detail += ["", f"{room_phrases(f)[1]} {room_text(f, pr)}"
                           f"{' (points)' if f.diff_scale == 100.0 else ''}: whatever the policies do, the "
                           "difference cannot leave this range."]
        elif f.room:
            detail += ["", "This run has no value for the structural bound of this row."]
        if f.falsified_by:
            detail += ["", f"Would have been not reproduced with: {f.falsified_by}."]
        if f.note:
            detail += ["", f.note]
        if f"{f.diff}.all.mean" in metrics:
            all_v, _ = finding_verdict(f, metrics, f"{f.diff}.all")
            detail += ["", f"Sensitivity, every seed ({pr.text(f.diff + '.all.seeds')}): "
                           f"{pr.run(f.diff + '.all.mean', f.diff_scale, f.diff_fmt)} "
                           f"{ci_text(f, pr, f.diff + '.all')}: {all_v}."]
    return lines + detail, verdicts, reasons


def extra_splits(d: str, metrics: Mapping) -> list[str]:
    """The further held-out splits the metrics hold (`<d>.<split>.split.heldout`), in name order."""
    return sorted(k[len(d) + 1:-len(".split.heldout")] for k in metrics
                  if k.startswith(f"{d}.") and k.endswith(".split.heldout") and k.count(".") == 3)


def gap_table(prefix: str, metrics: Mapping, policies: Sequence[str], tiers: Sequence[int]) -> list[str]:
    """RL - base Pass@1 (points) of each arm at each tier with its 95% interval (`host_metrics.split_gaps`; printed,
    not judged)."""
    pr = Printer(metrics)
    lines = ["| arm | T (turns) | RL - base Pass@1 (points) | 95% CI | seeds |", "|---|---|---|---|---|"]
    for a in policies:
        for t in tiers:
            k = f"{prefix}.gap.{a}.t{t}"
            if f"{k}.mean" in metrics:
                lines.append(f"| {a} | {t} | {pr.run(k + '.mean', 100.0)} | [{pr.run(k + '.lo', 100.0)}, "
                             f"{pr.run(k + '.hi', 100.0)}] ({pr.text(k + '.method')}) | {pr.text(k + '.seeds')} |")
    return lines if len(lines) > 2 else []


def pass1_by_split(d: str, metrics: Mapping, policies: Sequence[str], tiers: Sequence[int], heldout: str) -> list[str]:
    """Pass@1 (%) of each policy at each tier on the held-out split and every further split, side by side."""
    pr = Printer(metrics)
    lines = ["| split | T (turns) | " + " | ".join(policies) + " |", "|---|---|" + "---|" * len(policies)]
    for name, prefix in [(heldout, d)] + [(x, f"{d}.{x}") for x in extra_splits(d, metrics)]:
        for t in tiers:
            lines.append(f"| {name} | {t} | " + " | ".join(pr.run(f"{prefix}.pass.{p}.t{t}.k1", 100.0)
                                                          for p in policies) + " |")
    return lines


def domain_section(d: str, title: str, metrics: Mapping, findings: Sequence[Finding], *, policies: Sequence[str],
                   tiers: Sequence[int], ks: Sequence[int], t_max: int, splits: tuple[str, str],
                   notes: tuple[str, str] = ("", "")) -> tuple[list[str], dict]:
    """The `## <title>` section of one domain; `notes` = (how the env makes the splits, what the reference
    solution's turns are), each printed when given (the metrics' `<d>.split.heldout_note`, the env's own, in place
    of the first). Every table names the split its numbers come from; further held-out splits
    (`<d>.<split>.pass...`, Pass@(K,T) only) follow the findings. Returns (lines, verdicts)."""
    split_note, bound_note = notes
    split_note = metrics.get(f"{d}.split.heldout_note", split_note)
    pr = Printer(metrics)
    held = splits[1]
    lines = [f"## {title}", "",
             f"Tasks: {pr.run(f'{d}.split.train', 1.0, '.0f')} train (split '{splits[0]}'), "
             f"{pr.run(f'{d}.split.heldout', 1.0, '.0f')} held-out (split '{held}')"
             + (f" ({split_note})" if split_note else "") + "; RL trains on the "
             f"train split only, and every number below is on split '{held}' unless its table names another. "
             "Pass@(K,T) mode: announced (the budget is in the prompt; separate rollouts per tier). Upper bound: "
             "share of tasks whose reference solution needs <= T turns, each reply within the reply cap"
             + (f" (reference turns: {bound_note})" if bound_note else "") + ".", "",
             f"### Pass@(K,T) on held-out split '{held}' (%)", ""]
    lines += pass_table(d, metrics, policies, tiers, ks, t_max)
    lines += ["", f"### Findings (on split '{held}')", ""]
    body, verdicts, _ = findings_lines(findings, metrics)
    notes_ = [f"- {pr.text(k)}" for k in sorted(metrics) if k.startswith(f"{d}.note.")]
    more = []
    for name in extra_splits(d, metrics):
        more += ["", f"### Pass@(K,T) on split '{name}' (%)", "",
                 f"{pr.run(f'{d}.{name}.split.heldout', 1.0, '.0f')} tasks: {pr.text(f'{d}.{name}.split.note')}. "
                 "Pass@(K,T), and RL - base Pass@1 printed, not judged (the findings are measured on the held-out "
                 "split).", ""]
        more += pass_table(f"{d}.{name}", metrics, policies, tiers, ks, t_max)
        more += [""] + gap_table(f"{d}.{name}", metrics, policies, tiers)
    if more:
        more += ["", "### Pass@1 by split (%)", ""] + pass1_by_split(d, metrics, policies, tiers, held)
    return lines + body + ([""] + notes_ if notes_ else []) + more + [""], verdicts


def health_lines(metrics: Mapping) -> list[str]:
    seeds = sorted({k.rsplit(".", 1)[0] for k in metrics if k.startswith("health.") and k.endswith(".status")})
    if not seeds:
        return []
    pr = Printer(metrics)
    lines = ["## Seed health", "", f"Rule: {health_lib.HEALTH_RULE}", "",
             "| arm / seed | status | reason | min valid-action rate | last success |", "|---|---|---|---|---|"]
    for p in seeds:
        lines.append(f"| {p.removeprefix('health.')} | {pr.text(p + '.status')} | {pr.text(p + '.reason')}"
                     f" | {pr.run(p + '.min_valid', 1.0, '.2f')} | {pr.run(p + '.last_success', 1.0, '.2f')} |")
    return lines + [""]


def build_host_report(meta: Mapping[str, str], metrics: Mapping, sections: Sequence[list[str]],
                      title: str = "jaxagent host-domain study report") -> str:
    """The whole report: meta lines, the interval method (`stats.INTERVAL_METHOD`), the verdict rule, seed health,
    then the domain sections."""
    lines = [f"# {title}", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", f"Intervals: {stats.INTERVAL_METHOD}", "",
              f"Verdict rule (the FrozenLake study's): {stats.VERDICT_RULE}", ""]
    lines += health_lines(metrics)
    for s in sections:
        lines += s
    return "\n".join(lines)
