"""Finding 5 on a host-env domain: likelihood of RL's and base's held-out trajectories under both policies (the paper,
BFCL: length-matched LLR difference RL - base 805.8 nats over 283 pairs of 146 tasks, 95% CI above 0; PAPER.md).

Per GRPO seed, base's and the seed's full-budget held-out episodes (`f5_tokens` of the eval logs), every policy token
y_t scored teacher-forced under pi_base and pi_RL (`likelihood_scoring.score_records`, temperature 1). Per episode:
    nll(a) = - sum_{t in a} log pi_base(y_t | y_<t) per action a;  n(tau) = its number of policy tokens;
    llr(tau) = sum_{t policy token of tau} [log pi_RL(y_t | y_<t) - log pi_base(y_t | y_<t)].
Rows (`likelihood_metrics`, units nested in GRPO seeds): `f5_nll` = mean nll of RL's actions - of base's (the paper
12.20 vs 10.25; E = 19% of base's NLL); `f5_llr_rl` = mean llr of RL's successes - LLR_THRESHOLD (1 nat) and
`f5_matched` = mean llr_RL - llr_base of length-matched success pairs (`matched_pairs`: same task, |n_RL - n_base|
<= 0.1 max) - LLR_THRESHOLD, reported, not judged (`recipe.llr_not_comparable`); `f5_llr_success`, the Jeffreys
contrast KL(RL || b) + KL(b || RL) >= 0, printed. Why, units, notes and metric keys: docs/host_study.md, "Findings
and what would have failed them" and "How the host findings are measured".

Dimension legend (CONVENTIONS.md): B episodes of a scoring batch, T tokens of an episode, M its policy tokens, D model
width, U budget tiers, P tasks, Z samples per task and tier, Br / Bb RL / base episodes of a matched comparison.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from jaxagent.eval import recipe as recipe_lib, stats
from jaxagent.eval.findings import LLR_THRESHOLD, SEI, Finding, Row

DOMAINS = ("bfcl",)  # env registry names: every domain on these envs (`host_domains.uses_env`)
REL_TOL = 0.1          # the length-matched control's tolerance: within 10% of the longer (PAPER.md)
EFFECT_NLL_REL = (12.20 - 10.25) / 10.25  # the paper's relative NLL gap, as `findings.f5_nll`
EFFECT_LLR = 1.0        # nats above LLR_THRESHOLD, jaxagent's smallest effect of interest (`findings.f5_llr_rl`)


def findings(d: str, title: str) -> tuple[Finding, ...]:
    """Finding 5 on domain `d` (module docstring): per-action NLL under base; RL's successful trajectories more
    than `LLR_THRESHOLD` above base in cumulative LLR (`<d>.f5_llr_rl`; the two-group contrast printed beside it:
    a Jeffreys divergence); the length-matched pair difference above the threshold (`<d>.f5_matched`). None has
    a structural room: log-likelihoods are unbounded. The two LLR rows are "untestable here (recipe)" at every
    base and recipe (`recipe.llr_not_comparable`): on the toy bases (KL 0.5, 20-30 iterations) RL stays within a
    fraction of a nat of its base, so the threshold row read "not reproduced (opposite)", a statement about the
    KL budget; a large model over long training could have read "reproduced", also about its budget."""
    nll, llr, mat, con = f"{d}.f5_nll", f"{d}.f5_llr_rl", f"{d}.f5_matched", f"{d}.f5_llr_success"
    thr = f"{LLR_THRESHOLD:g}"
    return (
        Finding(nll, f"{title}: 5. per-action NLL under base, RL actions vs base actions (paper: 12.20 vs 10.25)",
                (Row("base actions: mean NLL under base (nats)", f"{nll}.base", "f5_nll_base_actions", 1.0, ".2f"),
                 Row("RL actions: mean NLL under base (nats)", f"{nll}.rl", "f5_nll_rl_actions", 1.0, ".2f"),
                 Row("base actions scored", f"{nll}.n_base_actions", None, 1.0, ".0f"),
                 Row("RL actions scored (over the GRPO seeds)", f"{nll}.n_rl_actions", None, 1.0, ".0f")),
                f"{nll}.diff", "RL - base actions (nats)", +1, None, 1.0, ".2f", effect=EFFECT_NLL_REL,
                effect_rel=f"{nll}.base",
                effect_source="the paper's relative gap (12.20 - 10.25) / 10.25 = 19% of base's NLL",
                falsified_by=("a 95% CI of NLL(RL actions) - NLL(base actions) under base below 0, or holding 0 "
                              "with its upper end below 19% of base's NLL (RL's actions as likely under base as "
                              "base's own)")),
        Finding(llr, f"{title}: 5. cumulative LLR log pi_RL - log pi_base of RL's successful trajectories, above "
                     f"{thr} nat (paper: about 228 RL vs 26 base)",
                (Row("successful RL trajectories: mean LLR (nats)", f"{con}.rl", "f5_llr_success_rl", 1.0, ".2f"),
                 Row("threshold (nats)", f"{llr}.threshold", None, 1.0, ".0f"),
                 Row("successful base trajectories: mean LLR (nats)", f"{con}.base", "f5_llr_success_base", 1.0,
                     ".2f"),
                 Row("RL's minus base's successes (Jeffreys divergence, >= 0 by definition; not judged)",
                     f"{con}.jeffreys.mean", None, 1.0, ".2f"),
                 Row("successful RL trajectories (over the GRPO seeds)", f"{con}.n_rl", None, 1.0, ".0f"),
                 Row("successful base trajectories", f"{con}.n_base", None, 1.0, ".0f"),
                 Row("every RL trajectory: mean LLR (nats)", f"{con}.all_rl", None, 1.0, ".2f"),
                 Row("every base trajectory: mean LLR (nats)", f"{con}.all_base", None, 1.0, ".2f")),
                f"{llr}.diff", f"mean LLR of RL's successes - {thr} nat", +1, None, 1.0, ".2f", effect=EFFECT_LLR,
                effect_source=f"{SEI}: 1 nat above the {thr}-nat threshold",
                note=("The two groups' difference is E_RL[log pi_RL - log pi_base] - E_base[log pi_RL - log "
                      "pi_base] = KL(RL, base) + KL(base, RL) on the success-conditioned trajectory "
                      "distributions, the Jeffreys divergence: >= 0 for any two policies, so it is printed, not "
                      f"judged. The judged row asks whether RL's own successes sit more than {thr} nat above base."),
                falsified_by=(f"a 95% CI of RL's mean LLR on its successes - {thr} nat below 0, or holding 0 with "
                              f"its upper end below 1 nat (RL's successes within {2 * LLR_THRESHOLD:g} nats of "
                              "base)"), recipe=recipe_lib.llr_check),
        Finding(mat, f"{title}: 5. length-matched LLR control above {thr} nat (same task, both successful, "
                     "policy-token counts within 10% of the longer)",
                (Row("pairs (paper, BFCL: 283)", f"{mat}.n_pairs", "f5_matched_bfcl_pairs", 1.0, ".0f"),
                 Row("tasks among the pairs (paper, BFCL: 146)", f"{mat}.n_tasks", "f5_matched_bfcl_tasks", 1.0,
                     ".0f"),
                 Row("raw mean pair difference (nats; >= 0 in expectation by construction, not judged)",
                     f"{mat}.raw.mean", "f5_matched_bfcl_diff", 1.0, ".1f"),
                 Row("threshold (nats)", f"{mat}.threshold", None, 1.0, ".0f")),
                f"{mat}.diff", f"pair LLR difference RL - base - {thr} nat", +1, None, 1.0, ".1f",
                effect=EFFECT_LLR, effect_source=f"{SEI}: 1 nat above the {thr}-nat threshold",
                note=("The raw pair difference restricts both expectations of the Jeffreys divergence to the same "
                      "tasks and lengths, so it too is >= 0 in expectation for any two policies: printed, not "
                      f"judged; the row judges whether it exceeds {thr} nat."),
                falsified_by=(f"a 95% CI of the matched pair difference - {thr} nat below 0, or holding 0 with its "
                              "upper end below 1 nat"), recipe=recipe_lib.llr_check),
    )


# ----------------------------------------------------------------------------- the metrics
def matched_pairs(rl: Mapping, base: Mapping, rel_tol: float = REL_TOL) -> list[tuple[int, int]]:
    """(RL episode, base episode) index pairs of the length-matched control (PAPER.md, "jaxagent's definitions"):
    candidates are same task, both successful, |n_RL - n_base| <= rel_tol * max(n_RL, n_base) on policy-token
    counts; matched greedily one-to-one as `likelihood.length_matched_pairs` does (RL episodes in index order each
    take the still-unused candidate base episode with the smallest count gap, the lowest index on ties), here in
    numpy on the host (float64 tolerance)."""
    r_task, b_task = np.asarray(rl["task"]), np.asarray(base["task"])
    r_n, b_n = np.asarray(rl["n_tokens"], np.float64), np.asarray(base["n_tokens"], np.float64)
    b_ok = np.asarray(base["success"], bool).copy()  # still available
    pairs = []
    for i in np.flatnonzero(np.asarray(rl["success"], bool)):
        gap = np.abs(r_n[i] - b_n)
        cand = b_ok & (b_task == r_task[i]) & (gap <= rel_tol * np.maximum(r_n[i], b_n))
        if cand.any():
            j = int(np.argmin(np.where(cand, gap, np.inf)))
            b_ok[j] = False
            pairs.append((int(i), j))
    return pairs


def _seed_mean(values: Mapping[int, np.ndarray], seeds: Sequence[int]) -> float:
    means = [float(np.mean(values[s])) for s in seeds if len(values[s])]
    return float(np.mean(means)) if means else float("nan")


def no_pair_note(n_succ_rl: int, n_succ_base: int, n_common_tasks: int) -> str:
    """Why the length-matched control has no pair (counts over the included GRPO seeds)."""
    head = "Finding 5 (length-matched LLR control): no length-matched pair, "
    if n_succ_rl == 0 or n_succ_base == 0:
        why = (f"because {'no' if n_succ_rl == 0 else n_succ_rl} RL and {'no' if n_succ_base == 0 else n_succ_base} "
               "base full-budget held-out episodes succeeded (a pair needs a success of each policy on one task)")
    elif n_common_tasks == 0:
        why = (f"because no task has a successful episode of both policies ({n_succ_rl} RL and {n_succ_base} base "
               "successes)")
    else:
        why = (f"because on the {n_common_tasks} task(s) with successes of both policies no RL and base pair has "
               "policy-token counts within 10% of the longer")
    return head + why + "; the NLL and LLR rows above are measured on every scored episode."


def jeffreys_note(est: stats.Estimate) -> str:
    """The report line of the two-group LLR contrast (module docstring): printed with its interval, not judged."""
    ci = (f" (95% CI [{est.lo:.2f}, {est.hi:.2f}], {est.method})" if est.available else
          f" (no interval: {est.reason})")
    val = (f"= {est.mean:.2f} nats{ci}" if np.isfinite(est.mean) else
           "has no value in this run (no seed has successful episodes of both policies)")
    return ("Finding 5 (two-group LLR contrast, not judged): mean LLR of RL's successful trajectories minus that of "
            f"base's {val}. It is KL(RL, base) + KL(base, RL) on the success-conditioned trajectory "
            "distributions, the Jeffreys divergence, >= 0 for any two policies, so it cannot fail; the judged row is "
            f"RL's own successes against the {LLR_THRESHOLD:g}-nat threshold.")


def likelihood_metrics(d: str, scored: Mapping[int, Mapping], included: Sequence[int], put) -> dict:
    """The finding-5 metrics (module docstring) from `score_seed`'s record per GRPO seed; `put` is
    `metrics.put_estimate` (with its `stat` argument). The rows (means, counts) are over the included seeds;
    when the health rule excludes every seed (e.g. a CI miniature's collapsed policy) over every seed, with the
    note `<d>.note.f5_seeds`. No pair in those seeds: also the note `<d>.note.f5_matched`."""
    nll, llr, mat, judged = f"{d}.f5_nll", f"{d}.f5_llr_success", f"{d}.f5_matched", f"{d}.f5_llr_rl"
    m: dict = {f"{judged}.threshold": LLR_THRESHOLD, f"{mat}.threshold": LLR_THRESHOLD}
    u_nll, u_llr, u_pair = {}, {}, {}
    nll_rl, nll_base, llr_rl, llr_base, all_rl, all_base = {}, {}, {}, {}, {}, {}
    pair_tasks, succ_tasks = {}, {}
    for s, rec in sorted(scored.items()):
        r, b = rec["rl"], rec["base"]
        nll_rl[s] = np.asarray([x for a in r["nll_actions"] for x in a], np.float64)
        nll_base[s] = np.asarray([x for a in b["nll_actions"] for x in a], np.float64)
        lr, lb = np.asarray(r["llr"], np.float64), np.asarray(b["llr"], np.float64)
        sr, sb = np.asarray(r["success"], bool), np.asarray(b["success"], bool)
        llr_rl[s], llr_base[s], all_rl[s], all_base[s] = lr[sr], lb[sb], lr, lb
        u_nll[s], u_llr[s] = (nll_rl[s], nll_base[s]), (llr_rl[s], llr_base[s])
        pairs = matched_pairs(r, b)
        u_pair[s] = np.asarray([lr[i] - lb[j] for i, j in pairs], np.float64)
        pair_tasks[s] = {int(r["task"][i]) for i, _ in pairs}
        succ_tasks[s] = (set(np.asarray(r["task"])[sr].tolist()), set(np.asarray(b["task"])[sb].tolist()))
        m[f"{mat}.seed{s}.n_pairs"], m[f"{mat}.seed{s}.n_tasks"] = len(pairs), len(pair_tasks[s])
    put(m, f"{nll}.diff", u_nll, included, stat=stats.mean_difference)
    # judged: RL's own successes above the threshold; printed: the two groups' contrast (a Jeffreys divergence,
    # >= 0 for any two policies) and the raw matched pair difference (the same on matched pairs)
    put(m, f"{judged}.diff", {s: v - LLR_THRESHOLD for s, v in llr_rl.items()}, included)
    jeff = put(m, f"{llr}.jeffreys", u_llr, included, stat=stats.mean_difference)
    put(m, f"{mat}.raw", u_pair, included)
    put(m, f"{mat}.diff", {s: v - LLR_THRESHOLD for s, v in u_pair.items()}, included)
    m[f"{d}.note.f5_jeffreys"] = jeffreys_note(jeff)
    rows = [s for s in sorted(scored) if s in included]
    if not rows and scored:
        rows = sorted(scored)
        m[f"{d}.note.f5_seeds"] = ("Finding 5: the health rule excluded every GRPO seed, so the finding-5 rows (means "
                                   "and counts) are over every seed (" + ", ".join(map(str, rows)) + ").")
    for key, vals in ((f"{nll}.rl", nll_rl), (f"{nll}.base", nll_base), (f"{llr}.rl", llr_rl),
                      (f"{llr}.base", llr_base), (f"{llr}.all_rl", all_rl), (f"{llr}.all_base", all_base)):
        m[key] = _seed_mean(vals, rows)
    count = lambda vals: int(sum(len(vals[s]) for s in rows))  # noqa: E731
    m[f"{nll}.n_rl_actions"], m[f"{llr}.n_rl"] = count(nll_rl), count(llr_rl)
    # base's episodes are the same for every seed: counted once
    m[f"{nll}.n_base_actions"] = len(nll_base[rows[0]]) if rows else 0
    m[f"{llr}.n_base"] = len(llr_base[rows[0]]) if rows else 0
    m[f"{mat}.n_pairs"] = count(u_pair)
    m[f"{mat}.n_tasks"] = len(set().union(*(pair_tasks[s] for s in rows)))
    if m[f"{mat}.n_pairs"] == 0:
        common = set().union(*(succ_tasks[s][0] & succ_tasks[s][1] for s in rows))
        m[f"{d}.note.f5_matched"] = no_pair_note(m[f"{llr}.n_rl"], m[f"{llr}.n_base"], len(common))
    return m
