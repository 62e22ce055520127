"""A miniature of the study (`experiments.reproduce --preset ci`) end to end: every stage, the report,
resumability, and that the report's TEXT says what the run's files say: the summary row of every finding
(measured, CI, MDE, the range the structural bound allows, verdict, why, seeds), the seed-health table against
the raw training logs, and the Pass@K gaps against the per-policy, per-seed eval files (each RL seed on its
own held-out maps, the base evaluated on every seed's maps)."""
import dataclasses
import json
import math
import os

import numpy as np
import pytest

from experiments import reproduce
from jaxagent.aot import programs
from jaxagent.eval import health, report, stats
from jaxagent.eval import findings as findings_lib
from jaxagent.study.frozenlake import evaluate, measure
from jaxagent.study.frozenlake.presets import PRESETS
from jaxagent.study.common.arms import arm_settings
from jaxagent.study.frozenlake.run import Run
from tests import aot_coverage


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    """`experiments.reproduce --preset ci` in a subprocess, every jitted call recorded (tests/aot_coverage.py)."""
    return aot_coverage.record_reproduce("ci", str(tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="module")
def outputs(ci_run):
    text = open(os.path.join(ci_run, "report.md")).read()
    metrics = json.load(open(os.path.join(ci_run, "metrics.json")))
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## ")[1:]}
    return text, metrics, sections


def _fmt(metrics, key, scale, fmt):
    v = metrics.get(key)
    return "—" if not isinstance(v, (int, float)) or not math.isfinite(v) else format(v * scale, fmt)


def _estimate(metrics, prefix):
    """The stored estimate, read field by field from metrics.json (independently of report.py)."""
    if f"{prefix}.method" not in metrics:
        return None
    nan = float("nan")
    g = {f.name: metrics.get(f"{prefix}.{f.name}", nan) for f in stats.Estimate.__dataclass_fields__.values()}
    g = {k: (nan if v is None else v) for k, v in g.items()}
    return stats.Estimate(**g)


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.slow
def test_reproduce_writes_every_stage(ci_run):
    for part in ("config.json", "base/DONE", "base/policy/config.json", "base/policy/model.safetensors",
                 "arms/grpo/seed0/DONE", "arms/budgetmix/seed1/policy/model.safetensors",
                 "arms/grpo/seed0/metrics.jsonl", "arms/grpo/seed0/dynamics.jsonl", "eval/base_seed0.json",
                 "eval/base_seed1.json", "eval/bound_seed0.json",
                 "metrics.json", "report.md", "timing.json", "figures/pass_at_t.png", "figures/pass_kt_base.png",
                 "figures/learning_grpo.png", "figures/learning_budgetmix.png", "figures/dynamics.png",
                 "arms/grpo_tight/seed1/DONE", "arms/grpo_oracle_tight/seed0/metrics.jsonl",
                 "eval/grpo_oracle_tight_seed1.json"):
        assert os.path.exists(os.path.join(ci_run, part)), part


@pytest.mark.slow
def test_every_program_the_run_calls_is_in_the_aot_list(ci_run):
    """Each jitted call of the run (function, static values, argument shapes, dtypes and shardings, recorded around
    `jax.jit`) is a call of the ci preset's AOT list built on one CPU device (`aot.programs.preset_programs`, the
    toy world and vocabulary as the run makes them) or an `aot.coverage.HELPERS` function: a new jitted program in
    the pipeline fails here until the list knows it (tests/test_aot_coverage.py shows one caught). R_single's plan
    generation is among them, in calls of the rollout batch."""
    preset = PRESETS["ci"]
    calls = aot_coverage.recorded(ci_run)
    world = programs.toy_world(preset)
    cfg = aot_coverage.with_vocab(preset.model, world.tokenizer.vocab_size)
    progs = programs.preset_programs(preset, cfg, aot_coverage.one_device_mesh(),
                                     aot_coverage.arm_settings(arm_settings, preset))
    counts = aot_coverage.assert_covered(calls, progs)
    # what the miniature runs: every program of its list (no PPO arm: no critic values; f32 rollouts: no params_cast)
    assert {n for n, c in counts.items() if c} == set(programs.PROGRAM_NAMES) - {"train_step_ppo", "critic_values",
                                                                                  "params_cast"}
    r_single = preset.eval.n_plan_tasks * preset.eval.n_plan_samples // preset.rollout_batch
    # R_single at the base and after each iteration (each arm x 2 seeds x (1 + 2)) and the eval's base and grpo (2 seeds)
    assert counts["plan_generate"] == r_single * (len(preset.arms) * 2 * 3 + 2 * 2)


@pytest.mark.slow
def test_summary_rows_state_the_metrics_and_the_rule(outputs):
    text, metrics, sections = outputs
    assert text.startswith("# jaxagent toy study: ci")
    for heading in ("1. Pass@K at full budget as K grows", "2. FrozenLake: the RL advantage shrinks",
                    "3. Step quality on matched states", "4. Error recovery, FrozenLake",
                    "5. Length-matched LLR control, FrozenLake", "5. Cumulative LLR of RL's successful",
                    "8. BudgetMix vs full-budget RL", "1. Held-out Pass@1 at full budget (K=1)",
                    "Beyond the paper: announced vs hidden budget"):
        assert heading in text, heading
    assert "figures/pass_at_t.png" in text and "figures/learning_grpo.png" in text
    summary = sections["Summary: one row per finding"].splitlines()
    assert summary[2].startswith("Primary rows (the confirmatory claims") and "*1. Held-out Pass@1" in summary[2]
    assert summary[4] == ("| finding | measured | paper | 95% CI | MDE (reference) | bound allows | verdict | why "
                          "| seeds |")
    checked, roomed = 0, set()
    for f in findings_lib.DEFAULT_FINDINGS:
        est = _estimate(metrics, f.diff)
        if est is None:
            continue
        checked += 1
        title = findings_lib.finding_title(f, metrics)
        row = [line for line in summary if line.startswith(f"| {title} |")]
        assert len(row) == 1, f.key
        _, measured, paper, ci, mde, allowed, verdict, why, seeds = _cells(row[0])
        assert measured == _fmt(metrics, f"{f.diff}.mean", f.diff_scale, f.diff_fmt), f.key
        if est.method == stats.NOT_AVAILABLE:
            assert ci == f"n/a ({est.reason})" and est.reason, f.key
        else:
            assert ci == (f"[{_fmt(metrics, f'{f.diff}.lo', f.diff_scale, f.diff_fmt)}, "
                          f"{_fmt(metrics, f'{f.diff}.hi', f.diff_scale, f.diff_fmt)}]"), f.key
            assert est.n_seeds >= 2 and est.method == stats.T_SEEDS  # 2 seeds: never a bootstrap over seeds
        assert mde.split(" (")[0] == _fmt(metrics, f"{f.diff}.mde", f.diff_scale, f.diff_fmt), f.key
        effect = f.effect if f.effect_rel is None else (f.effect * metrics[f.effect_rel]
                                                        if isinstance(metrics.get(f.effect_rel), float) else None)
        room = None
        bounds_ = (metrics.get(f"{f.key}.room_lo"), metrics.get(f"{f.key}.room_hi"))
        if all(isinstance(x, float) and math.isfinite(x) for x in bounds_):
            room = bounds_
        want, reason = stats.decide(est, f.direction, None if effect is None else abs(effect), f.margin, room=room,
                                    scale=f.diff_scale, recipe=None if f.recipe is None else f.recipe(metrics),
                                    room_source=f.room_source)
        assert verdict == want and verdict in stats.VERDICTS, f.key
        assert why.startswith(reason), f.key
        if room is not None:  # a row judged against a structural bound prints the range it allows
            assert f.room, f.key
            assert allowed == (f"[{_fmt(metrics, f'{f.key}.room_lo', f.diff_scale, f.diff_fmt)}, "
                               f"{_fmt(metrics, f'{f.key}.room_hi', f.diff_scale, f.diff_fmt)}]"), f.key
            assert room[0] <= room[1], f.key
            roomed.add(f.key)
        else:
            assert allowed == "—", f.key
        assert seeds == metrics[f"{f.diff}.seeds"] and seeds.startswith(("grpo seeds", "grpo & ", "grpo_tight & ")), f.key
        assert f"**Verdict: {want}**: {why}. Seeds: {seeds}." in sections[title], f.key
        assert f"Would have been not reproduced with: {f.falsified_by}." in sections[title], f.key
        if f"{f.diff}.all.mean" in metrics:  # some seed excluded: the all-seeds line is printed
            assert "Sensitivity, every seed" in sections[title], f.key
    assert checked >= 11  # f1 x2, f2, f3, f4, f5 x3, f6 R_multi, f8 x2 (and f4 depth, f6 R_single where measured)
    # the rows every run measures against a bound (others have one when their units exist, e.g. solvable tasks)
    assert {"f1_pass1", "f1_breadth", "f6_r_multi", "f8_budgetmix_t100"} <= roomed, roomed


@pytest.mark.slow
def test_seed_health_table_matches_the_training_logs(ci_run, outputs):
    _, metrics, sections = outputs
    arms = PRESETS["ci"].arms
    table = [_cells(line) for line in sections["Seed health"].splitlines()
             if any(line.startswith(f"| {a} |") for a in arms)]
    assert len(table) == 2 * len(arms)  # every arm x 2 seeds
    excluded = []
    for arm, seed, status, reason, *_ in table:
        recs = health.read_log(os.path.join(ci_run, "arms", arm, f"seed{seed}", "metrics.jsonl"))
        want = health.classify_seed(recs)
        assert (status, reason) == (want.status, want.reason), (arm, seed)
        if not want.included:
            excluded.append(f"{arm} seed {seed} ({status})")
    # a seed the rule excludes is named, and the verdicts name it too
    text = sections["Seed health"]
    assert (f"Excluded from the primary verdicts: {', '.join(excluded)}." in text) if excluded else \
        "No seed collapsed or diverged." in text
    grpo_out = [e.split()[2] for e in excluded if e.startswith("grpo ")]
    for s in grpo_out:
        assert f"{s} (grpo " in metrics["f1_breadth.diff.seeds"]


def _per_task(ci_run, label):
    return np.asarray(json.load(open(os.path.join(ci_run, "eval", f"{label}.json")))["announced"]["per_task"])


def _headline(ci_run, label):
    """float[1, J, P]: the headline evaluation's Pass@K at full budget (finding 1's own maps and samples)."""
    return np.asarray(json.load(open(os.path.join(ci_run, "eval", f"headline_{label}.json")))["per_task"])


def _solvable(ci_run, seed, tier):
    """Seed `seed`'s held-out tasks the exact solver solves at tier index `tier` (p* > 0), from the bound file."""
    return np.asarray(json.load(open(os.path.join(ci_run, "eval", f"bound_seed{seed}.json")))["p_star"])[tier] > 0


def _included_grpo(ci_run):
    """GRPO seeds the health rule includes, from the raw training logs (both seeds when none is included)."""
    ok = [s for s in (0, 1) if health.classify_seed(health.read_log(
        os.path.join(ci_run, "arms", "grpo", f"seed{s}", "metrics.jsonl"))).included]
    return ok or [0, 1]


@pytest.mark.slow
def test_pass_at_k_gaps_come_from_the_eval_files(ci_run, outputs):
    text, metrics, sections = outputs
    # the estimate over every seed (the primary one when no seed is excluded) from the per-policy eval files,
    # each RL seed paired with the base on the same seed's maps
    # finding 1 from the headline evaluation's files (maps and samples of its own), not the Pass@ grid's
    gap = np.mean([np.mean(_headline(ci_run, f"grpo_seed{s}")[-1, -1] - _headline(ci_run, f"base_seed{s}")[-1, -1])
                   for s in (0, 1)])
    prefix = "f1_breadth.diff.all" if "f1_breadth.diff.all.mean" in metrics else "f1_breadth.diff"
    assert metrics[f"{prefix}.mean"] == pytest.approx(gap, abs=1e-9)
    assert metrics[f"{prefix}.n_seeds"] == 2 and metrics[f"{prefix}.method"] == stats.T_SEEDS
    ev = PRESETS["ci"].eval
    assert _headline(ci_run, "base_seed0").shape == (1, len(ev.ks), ev.headline_tasks)
    assert (metrics["f1_pass1.n_maps"], metrics["f1_pass1.n_samples"]) == (ev.headline_tasks, ev.headline_samples)
    assert f"| held-out maps per seed | {ev.headline_tasks} |" in text
    # the two seeds were evaluated on different held-out maps, and the headline's maps are not the Pass@ grid's
    run = Run(PRESETS["ci"], os.path.dirname(ci_run), "ci")
    maps = [np.asarray(measure.heldout_tasks(run, s)) for s in (0, 1)]
    assert not np.array_equal(maps[0], maps[1])
    assert not np.array_equal(np.asarray(measure.headline_tasks(run, 0))[:ev.n_tasks], maps[0])
    # f2 prints the share of solvable tight-tier tasks, and the real tier in its title
    f2 = next(f for f in findings_lib.DEFAULT_FINDINGS if f.key == "f2_shrink_frozenlake")
    sec = sections[findings_lib.finding_title(f2, metrics)]
    assert f"| held-out tasks solvable at the tightest tier (%) | " \
           f"{100 * metrics['f2_shrink_frozenlake.solvable_tight']:.1f} |" in sec
    assert 0 <= metrics["f2_shrink_frozenlake.solvable_tight"] <= 1
    assert "tightest tier (T=" in findings_lib.finding_title(f2, metrics)


@pytest.fixture(scope="module")
def included(ci_run):
    """The eval stage again on the cached diagnostics with every seed forced into the primary set (the ci
    preset's 4-step base rarely produces a valid action, so its seeds count as collapsed): the primary path."""
    orig = health.classify_seed
    mp = pytest.MonkeyPatch()
    mp.setattr(health, "classify_seed",
               lambda recs: dataclasses.replace(orig(recs), status=health.DEGRADED, reason="forced in by the test"))
    try:
        run = Run(PRESETS["ci"], os.path.dirname(ci_run), "ci")
        base = run.load_policy(os.path.join(run.dir, "base"))
        metrics, figures, _, _ = evaluate.evaluate(run, base, measure.collect_policies(run))
    finally:
        mp.undo()
    return metrics, report.build_report(metrics, run.dir, figures=figures)


@pytest.mark.slow
def test_primary_estimates_recomputed_from_the_diagnostic_files(ci_run, included):
    metrics, rep = included
    load = lambda name: json.load(open(os.path.join(ci_run, "eval", name)))  # noqa: E731
    base = {s: _per_task(ci_run, f"base_seed{s}") for s in (0, 1)}
    ks = metrics["meta.ks"]
    head = {s: _headline(ci_run, f"base_seed{s}") for s in (0, 1)}
    for k_i, k in enumerate(ks):  # f1: the gap at each K, full budget, mean over seeds of task means
        gap = np.mean([np.mean(_headline(ci_run, f"grpo_seed{s}")[-1, k_i] - head[s][-1, k_i]) for s in (0, 1)])
        assert metrics[f"f1_breadth.gap_k{k}"] == pytest.approx(gap, abs=1e-9)
        assert f"| RL - base at K={k} (points) | {100 * gap:.1f} | — |" in rep.markdown
    assert metrics["f1_breadth.diff.seeds"] == "grpo seeds 0, 1; none excluded"
    assert "f1_breadth.diff.all.mean" not in metrics  # nothing excluded: no sensitivity line
    # f1's headline: K=1, full budget
    want = np.mean([np.mean(_headline(ci_run, f"grpo_seed{s}")[-1, 0] - head[s][-1, 0]) for s in (0, 1)])
    assert metrics["f1_pass1.diff.mean"] == pytest.approx(want, abs=1e-9)
    # f2: change of the K=1 gap from the full to the tight tier, on the tasks solvable at the tight tier
    per_seed = []
    for s in (0, 1):
        use = _solvable(ci_run, s, 0)
        g = (_per_task(ci_run, f"grpo_seed{s}") - base[s])[:, 0, :][:, use]
        if use.any():
            per_seed.append(np.mean(g[0] - g[-1]))
    if len(per_seed) >= 2:
        assert metrics["f2_shrink_frozenlake.diff.mean"] == pytest.approx(np.mean(per_seed), abs=1e-9)
    # f3: G sampled actions per policy and state, an invalid reply worth 0 (not gamma V*)
    per_seed, invalid = [], []
    for s in (0, 1):
        x = load(f"step_quality_grpo_seed{s}.json")
        mask = np.asarray(x["mask"], bool)
        q = np.concatenate([np.asarray(x["q"])[:, :4], np.zeros((mask.size, 1))], axis=1)
        mean_q = {p: np.take_along_axis(q, np.asarray(x[f"draws_{p}"]), 1).mean(1)[mask] for p in ("base", "rl")}
        assert np.asarray(x["draws_rl"]).shape[1] == 16
        per_seed.append(np.mean(mean_q["rl"] - mean_q["base"]))
        invalid.append(np.mean(np.asarray(x["draws_rl"])[mask] == 4))
    assert metrics["f3_step_frozenlake.diff.mean"] == pytest.approx(np.mean(per_seed), abs=1e-6)
    assert metrics["f3_step_frozenlake.invalid_rl"] == pytest.approx(np.mean(invalid), abs=1e-9)
    assert metrics["f3_step_frozenlake.g"] == 16
    # f4: only error states with the goal still reachable (V* > 0) are used
    reach = unreach = 0
    for s in (0, 1):
        x = load(f"error_states_grpo_seed{s}.json")
        ok = np.asarray(x["mask"], bool) & np.asarray(x["replay_ok"], bool)
        v = np.asarray(x["q"])[:, :4].max(1)
        reach += int((ok & (v > 0)).sum())
        unreach += int((ok & ~(v > 0)).sum())
    assert (metrics["f4_error_frozenlake.n_states"], metrics["f4_error_frozenlake.n_unreachable"]) == (reach, unreach)
    # f4's control: the error-state gap minus the gap after the trajectory's own optimal move, same states
    per_seed = []
    for s in (0, 1):
        x = load(f"error_states_grpo_seed{s}.json")
        use = (np.asarray(x["mask"], bool) & np.asarray(x["replay_ok"], bool)
               & (np.asarray(x["q"])[:, :4].max(1) > 0) & np.asarray(x["control_ok"], bool))
        g = lambda a, b: (np.asarray(x[a]).mean(1) - np.asarray(x[b]).mean(1))[use]  # noqa: E731
        if use.any():
            per_seed.append(np.mean(g("success_rl", "success_base") - g("success_control_rl", "success_control_base")))
    if len(per_seed) == 2:
        assert metrics["f4_control_frozenlake.diff.mean"] == pytest.approx(np.mean(per_seed), abs=1e-9)
    # f5: the length-matched control's pairs, and the NLL contrast by seed
    pairs = sum(int((np.asarray(load(f"likelihood_grpo_seed{s}.json")["match"]) >= 0).sum()) for s in (0, 1))
    assert metrics["f5_matched_frozenlake.n_pairs"] == pairs
    nll = [np.mean(load(f"likelihood_grpo_seed{s}.json")["nll_rl_actions"])
           - np.mean(load(f"likelihood_grpo_seed{s}.json")["nll_base_actions"]) for s in (0, 1)]
    assert metrics["f5_nll.diff.mean"] == pytest.approx(np.mean(nll), rel=1e-6)
    assert metrics["f5_nll.diff.method"] == stats.T_SEEDS and metrics["f5_nll.diff.df"] == 1
    # the report states every verdict with these seeds
    for f in findings_lib.DEFAULT_FINDINGS:
        if f.key in rep.verdicts and f"{f.diff}.seeds" in metrics:
            assert f"Seeds: {metrics[f'{f.diff}.seeds']}." in rep.markdown, f.key


def _recomputed(ci_run):
    """Run numbers recomputed from the run's raw files (the training logs, the per-policy eval files, the bound
    stored next to them), never read from metrics.json or computed by report.py / jaxagent.study.frozenlake: key -> value."""
    want, success_of = {}, {}
    for arm in PRESETS["ci"].arms:
        for s in (0, 1):
            recs = [json.loads(line) for line in open(os.path.join(ci_run, "arms", arm, f"seed{s}", "metrics.jsonl"))
                    if line.strip()]
            valid = [float(r["valid_action_rate"]) for r in recs if isinstance(r.get("valid_action_rate"), (int, float))]
            success = [float(r["success_rate"]) for r in recs if isinstance(r.get("success_rate"), (int, float))]
            prefix = f"health.{arm}.seed{s}"
            want.update({f"{prefix}.min_valid": min(valid), f"{prefix}.last_valid": valid[-1],
                         f"{prefix}.last_success": success[-1]})
            success_of[(arm, s)] = success
    # finding 7's stability: each tight arm's fall from its best window of W = min(3, n // 2) iterations to its last
    falls = {}
    for (arm, s), r in success_of.items():
        w = min(3, len(r) // 2)
        windows = [sum(r[i:i + w]) / w for i in range(len(r) - w + 1)]
        falls[(arm, s)] = max(windows) - windows[-1]
    want["f7_stability_frozenlake.grpo"] = float(np.mean([falls[("grpo_tight", s)] for s in (0, 1)]))
    want["f7_stability_frozenlake.oracle"] = float(np.mean([falls[("grpo_oracle_tight", s)] for s in (0, 1)]))
    want["f7_stability_frozenlake.diff.mean"] = want["f7_stability_frozenlake.grpo"] - want["f7_stability_frozenlake.oracle"]
    base = {s: _per_task(ci_run, f"base_seed{s}") for s in (0, 1)}  # [U, J, P] on seed s's maps
    inc = _included_grpo(ci_run)
    head = {s: _headline(ci_run, f"base_seed{s}") for s in (0, 1)}   # finding 1: the headline evaluation
    head_rl = {s: _headline(ci_run, f"grpo_seed{s}") for s in (0, 1)}
    want["f1_breadth.base"] = float(np.mean([np.mean(head[s][-1, -1]) for s in inc]))  # full budget, largest K
    want["f1_pass1.base"] = float(np.mean([np.mean(head[s][-1, 0]) for s in inc]))     # full budget, K=1
    tight = {s: base[s][0, 0][_solvable(ci_run, s, 0)] for s in inc}
    if all(v.size for v in tight.values()):
        want["f2_shrink_frozenlake.base_tight"] = float(np.mean([np.mean(v) for v in tight.values()]))
    tiers = json.load(open(os.path.join(ci_run, "eval", "base_seed0.json")))["announced"]["tiers"]
    want["f2_shrink_frozenlake.tier_turns"] = float(tiers[0])
    for prefix in ("f1_breadth.diff", "f1_breadth.diff.all"):  # mean over the two seeds of task-mean gaps
        want[f"{prefix}.mean"] = float(np.mean([np.mean(head_rl[s][-1, -1] - head[s][-1, -1]) for s in (0, 1)]))
    nll = []
    for s in (0, 1):
        x = json.load(open(os.path.join(ci_run, "eval", f"likelihood_grpo_seed{s}.json")))
        nll.append(np.mean(x["nll_rl_actions"]) - np.mean(x["nll_base_actions"]))
    for prefix in ("f5_nll.diff", "f5_nll.diff.all"):
        want[f"{prefix}.mean"] = float(np.mean(nll))
    return want


def _shows(shown: str, value: float) -> bool:
    """The printed text is `value` (or `value` in percent) rounded to the digits shown."""
    digits = len(shown.split(".")[1]) if "." in shown else 0
    half = 0.5 * 10 ** -digits + 1e-9
    x = float(shown)
    return abs(x - value) <= half or abs(x - 100 * value) <= half


@pytest.mark.slow
def test_every_printed_number_comes_from_the_run(ci_run, outputs):
    """Each number the report prints: the text shows it (rounded as printed), the run's metrics.json holds it,
    and where it can be recomputed from the run's raw files (training logs, eval files), it equals that."""
    text, metrics, _ = outputs
    rep = report.build_report(metrics, ci_run, figures={})
    nums = report.printed_numbers(rep)
    assert len(nums) > 30
    findings = {f.key: f for f in findings_lib.DEFAULT_FINDINGS}
    recomputed = _recomputed(ci_run)
    checked = []
    for shown, value, source in nums:
        kind, key = source.split(":", 1)
        assert shown in text, source
        if kind == "run":
            # metrics.json on disk, not the value report.py passed along
            assert json.load(open(os.path.join(ci_run, "metrics.json")))[key] == pytest.approx(value), key
            if key in recomputed:
                assert _shows(shown, recomputed[key]), (key, shown, recomputed[key])
                assert value == pytest.approx(recomputed[key], abs=1e-6), key
                checked.append(key)
        elif kind == "paper":
            assert _shows(shown, findings_lib.PAPER_FIGURES[key]["value"]), key
        else:
            fkey, what = key.rsplit(".", 1)
            rule = findings[fkey].margin if what == "margin" else findings_lib.reference_effect(findings[fkey], metrics)
            assert kind == "rule" and _shows(shown, abs(rule)), key
    # the health table, f1, f2 and f5 numbers were all recomputed independently
    assert sum(k.startswith("health.") for k in checked) == 3 * 2 * len(PRESETS["ci"].arms), checked
    assert {"f7_stability_frozenlake.grpo", "f7_stability_frozenlake.oracle"} <= set(checked), checked
    assert {"f1_breadth.base", "f1_pass1.base", "f2_shrink_frozenlake.tier_turns"} <= set(checked)
    assert any(k.startswith("f1_breadth.diff") for k in checked) and any(k.startswith("f5_nll.diff") for k in checked)
    # the report on disk is the one build_report makes from metrics.json (plus figures and the hidden table)
    assert rep.verdicts == {f.key: findings_lib.finding_verdict(f, metrics)[0] for f in findings_lib.DEFAULT_FINDINGS
                            if f.key in rep.verdicts}
    for key, v in rep.verdicts.items():
        assert f"**Verdict: {v}**" in text, key


@pytest.mark.slow
def test_rerun_skips_finished_stages(ci_run, capsys):
    before = os.path.getmtime(os.path.join(ci_run, "arms", "grpo", "seed0", "DONE"))
    reproduce.main(["--preset", "ci", "--root", os.path.dirname(ci_run)])
    assert os.path.getmtime(os.path.join(ci_run, "arms", "grpo", "seed0", "DONE")) == before
    assert "done already" in capsys.readouterr().out
