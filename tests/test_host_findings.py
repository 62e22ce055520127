"""Every host-domain verdict row can fail and none is decided by the structural bound: a row with a room
(`Finding.room`) whose range leaves less than E on the paper's side keeps its sign result (a CI wholly on one side
of 0) and is "untestable here (bound)" when its CI holds 0 (a parity row: whenever the room is less than its margin
either side of 0), and is decided on its interval otherwise;
the rooms the metric functions write are the ranges their definitions give (a rate in [0, 1], Pass@K in [0, U]);
every row says which result would have made it "not reproduced"; the report prints the room beside E and that
sentence. Synthetic metrics only (no model)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from jaxagent.eval import health, stats
from jaxagent.eval.findings import finding_verdict, reference_effect, room_from_metrics
from jaxagent.study.host import (dynamics as host_dynamics, error_recovery as host_error_recovery,
                                 metrics as host_metrics, report as host_report, step_quality as host_step_quality)

DOMAINS = (("sql", "SQL"), ("bfcl", "BFCL"), ("code", "Coding"))
OK = health.SeedHealth(health.HEALTHY, "", 2, 1.0, 1.0, 0.5)


def _all_findings():
    return [f for d, t in DOMAINS for f in host_metrics.domain_findings(d, t)]


def _wide(f, room=None) -> dict:
    """Metrics of a finding whose 95% CI holds both 0 and E (or both margins) with MDE > E: underpowered without a
    room; `room` = (lo, hi) written under the finding's room keys."""
    e = f.margin if f.direction == 0 else reference_effect(f, {})
    d = f.direction or 1
    lo, hi = sorted((-d * 1.0 * e, d * 2.0 * e))
    est = stats.Estimate(d * 0.5 * e, lo, hi, lo + 0.1 * e, hi - 0.1 * e, e, 3.0 * e, 4.0, 5, 50, stats.T_SEEDS)
    m = {f"{f.diff}.{k}": v for k, v in est.as_dict().items()}
    if room is not None:
        m[f"{f.key}.room_lo"], m[f"{f.key}.room_hi"] = room
    return m


def _short_room(f) -> tuple[float, float]:
    """A room that leaves half of E (a parity row: half its margin) on the paper's side."""
    if f.direction == 0:
        return -0.5 * f.margin, 0.5 * f.margin
    e = reference_effect(f, {})
    return (-0.5, 0.5 * e) if f.direction > 0 else (-0.5 * e, 0.5)


def test_every_host_row_says_what_would_have_failed_it():
    fs = _all_findings()
    assert len({f.key for f in fs}) == len(fs) == 19
    for f in fs:
        assert f.falsified_by and "95% CI" in f.falsified_by, f.key
        if f.direction != 0:
            assert reference_effect(f, {f.effect_rel: 1.0} if f.effect_rel else {}) is not None, f.key
    rooms = {f.key.split(".", 1)[1] for f in fs if f.room}
    assert rooms == {"f1_pass1", "f1_breadth", "f2_shrink", "f3_step", "f4_correction", "f6_r_multi", "f6_r_single",
                     "f7_gigpo"}
    assert not any(f.room for f in fs if ".f5_" in f.key)  # log-likelihoods have no structural bound


@pytest.mark.parametrize("f", [f for f in _all_findings() if f.room], ids=lambda f: f.key)
def test_each_bounded_row_is_untestable_when_the_room_is_short_and_decided_otherwise(f):
    short = _wide(f, _short_room(f))
    v, why = finding_verdict(f, short)
    assert v == stats.UNTESTABLE and "the bound allows at most" in why, (f.key, v, why)
    wide = _wide(f, (-1.0, 1.0))
    held = stats.UNDERPOWERED if f.direction != 0 else stats.INCONCLUSIVE  # a parity row has no power rule
    assert finding_verdict(f, wide)[0] == held
    assert finding_verdict(f, _wide(f))[0] == held  # no room measured: judged on its interval
    # the same interval, all on the wrong side of 0 (a parity row: beyond its margin), fails the row
    flip = dict(wide)
    if f.direction != 0:
        d = f.direction
        e = reference_effect(f, {})
        flip[f"{f.diff}.lo"], flip[f"{f.diff}.hi"] = sorted((-d * 3 * e, -d * 1 * e))
        assert finding_verdict(f, flip)[0] == stats.OPPOSITE
        # a short room blocks the size only: a CI on the paper's side is still a sign result, the bound named
        side = dict(short)
        side[f"{f.diff}.lo"], side[f"{f.diff}.hi"] = sorted((d * 0.1 * e, d * 0.4 * e))
        v, why = finding_verdict(f, side)
        assert v == stats.SMALLER and "the bound allows at most" in why, (f.key, v, why)
    else:
        flip[f"{f.diff}.lo"], flip[f"{f.diff}.hi"] = 2 * f.margin, 3 * f.margin
        assert finding_verdict(f, flip)[0] == stats.NOT_REPRODUCED


def _grid(values_P, n_tiers=2, n_ks=1):
    """Per-task Pass@ grid [U, J, P] with the same values at every tier and K."""
    return np.broadcast_to(np.asarray(values_P, np.float64), (n_tiers, n_ks, len(values_P))).copy()


def test_pass_rows_rooms_from_the_bound_and_verdicts():
    """f1_pass1 / f1_breadth: base at 95% of an all-solvable set leaves 5 points < E = 10, so a 3-point gain is a
    sign result only (in direction, smaller); at 30% a 40-point gain is decided (reproduced). f2_shrink: K=1 on
    the tasks solvable at the tightest tier, room [-b_t - g_f, U - b_t - g_f]; base near 0 there and a small
    full-budget gap leave < 10 points on the paper's side (a shrinking gap: smaller than the paper, the bound
    named). f7_gigpo: on the solvable tasks U = 1, so its room always exceeds the margin."""
    rng = np.random.default_rng(0)
    n = 20
    bound = host_metrics.structural_bound([1] * 10 + [2] * 10, [1, 2], [1])  # half the tasks fit the tightest tier
    f = {x.key: x for x in host_metrics.domain_findings("sql", "SQL")}
    for base_v, gain, want in ((0.95, 0.03, stats.SMALLER), (0.3, 0.4, stats.REPRODUCED)):
        base = _grid([base_v] * n)
        rl = {s: np.clip(base + gain + 0.01 * rng.normal(size=base.shape), 0, 1) for s in range(3)}
        per_task = {"base": base, **{f"grpo/seed{s}": r for s, r in rl.items()},
                    **{f"gigpo/seed{s}": r + 0.01 * rng.normal(size=r.shape) for s, r in rl.items()}}
        hl = {(a, s): OK for a in ("grpo", "gigpo") for s in rl}
        m = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=n)
        for key in ("sql.f1_pass1", "sql.f1_breadth"):
            assert room_from_metrics(f[key], m) == pytest.approx((-base_v, 1.0 - base_v))
            assert finding_verdict(f[key], m)[0] == want, (key, finding_verdict(f[key], m))
        assert m["sql.f1_pass1.bound"] == 1.0 and m["meta.t_max"] == 2.0
        assert m["sql.f2_shrink.n_tasks"] == 10 and m["sql.f2_shrink.solvable_tight"] == 0.5
        assert m["sql.f7_gigpo.bound"] == 1.0 and m["sql.f7_gigpo.n_tasks"] == 10
        g = m["sql.f7_gigpo.grpo"]
        assert room_from_metrics(f["sql.f7_gigpo"], m) == pytest.approx((-g, 1.0 - g))
        assert finding_verdict(f["sql.f7_gigpo"], m)[0] != stats.UNTESTABLE
    # f2: tight-tier base 0 and RL 0.02 on the solvable tasks, full-budget gap 0.03: room on the paper's side
    # (a shrinking gap) is b_t + g_f = 0.03 < E
    base = _grid([0.0] * n)
    rl = {}
    for s in range(3):
        r = base.copy()
        r[0] += 0.02 + 0.001 * s
        r[1] += 0.03
        rl[s] = r
    per_task = {"base": base, **{f"grpo/seed{s}": r for s, r in rl.items()}}
    m = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], {("grpo", s): OK for s in rl}, n_train=8,
                                 n_heldout=n)
    lo, hi = room_from_metrics(f["sql.f2_shrink"], m)
    assert lo == pytest.approx(-0.0 - 0.03) and hi == pytest.approx(1.0 - 0.0 - 0.03)
    v, why = finding_verdict(f["sql.f2_shrink"], m)
    assert v == stats.SMALLER and "the bound allows at most -3 on the paper's side" in why, why
    # the same gaps on a base at 40%: decided on the interval (the tight gap is smaller: the advantage shrinks)
    per_task = {"base": base + 0.4, **{f"grpo/seed{s}": r + 0.4 for s, r in rl.items()}}
    m = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], {("grpo", s): OK for s in rl}, n_train=8,
                                 n_heldout=n)
    assert finding_verdict(f["sql.f2_shrink"], m)[0] not in (stats.UNTESTABLE,)
    assert m["sql.f2_shrink.diff.mean"] == pytest.approx(0.021 - 0.03)


def test_each_seed_is_compared_with_its_own_base_draw():
    """RL - base per seed uses the base's draw sampled with that seed's key ('base/seed<s>'), so the base's
    sampling error varies over seeds and widens the interval: with one shared draw that happened to come out 10
    points low, three RL seeds equal to the true base read as a gain with a tight CI (reproduced); with a draw
    per seed (one low, two on target) the same RL seeds give a wide interval holding 0."""
    n = 20
    bound = host_metrics.structural_bound([1] * n, [1, 2], [1])
    f = {x.key: x for x in host_metrics.domain_findings("sql", "SQL")}
    true = _grid([0.5] * n)
    rl = {s: true + 0.001 * s for s in range(3)}
    hl = {("grpo", s): OK for s in rl}
    shared = {"base": true - 0.1, **{f"grpo/seed{s}": r for s, r in rl.items()}}
    m = host_metrics.domain_metrics("sql", shared, bound, [1, 2], [1], hl, n_train=8, n_heldout=n)
    assert m["sql.f1_pass1.diff.lo"] > 0.09 and finding_verdict(f["sql.f1_pass1"], m)[0] == stats.REPRODUCED
    draws = {"base/seed0": true - 0.1, "base/seed1": true, "base/seed2": true}
    m = host_metrics.domain_metrics("sql", {**shared, **draws}, bound, [1, 2], [1], hl, n_train=8, n_heldout=n)
    assert m["sql.f1_pass1.diff.mean"] == pytest.approx((0.1 + 0.0 + 0.001 + 0.002) / 3)
    assert m["sql.f1_pass1.diff.lo"] < 0 < m["sql.f1_pass1.diff.hi"]
    assert finding_verdict(f["sql.f1_pass1"], m)[0] != stats.REPRODUCED
    # the base's rows are the mean of its draws, not the unpaired draw
    assert m["sql.f1_pass1.base"] == pytest.approx(0.5 - 0.1 / 3)
    assert m["sql.pass.base.t2.k1"] == pytest.approx(0.5 - 0.1 / 3)


def test_no_task_solvable_at_the_tightest_tier_is_stated():
    bound = host_metrics.structural_bound([2] * 4, [1, 2], [1])
    per_task = {"base": _grid([0.0] * 4), "grpo/seed0": _grid([0.5] * 4), "grpo/seed1": _grid([0.5] * 4),
                "gigpo/seed0": _grid([0.5] * 4), "gigpo/seed1": _grid([0.5] * 4)}
    hl = {(a, s): OK for a in ("grpo", "gigpo") for s in (0, 1)}
    m = host_metrics.domain_metrics("bfcl", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=4)
    assert m["bfcl.f2_shrink.n_tasks"] == 0 and math.isnan(m["bfcl.f2_shrink.diff.mean"])
    assert "bfcl.f2_shrink.room_lo" not in m and "T = 1 turns" in m["bfcl.note.f2_shrink"]
    assert "bfcl.f7_gigpo.room_lo" not in m and "Finding 7" in m["bfcl.note.f7_gigpo"]


def test_a_base_that_recovers_from_its_slips_puts_its_tilt_beside_finding_2():
    """A noisy expert that recovers from its slips given more turns tilts finding 2 towards "not reproduced"
    (`RECOVERING_EXPERT_NOTE`): the run says so beside the row, which is still estimated; the toy presets' bases
    all recover (SQL checks first; coding and BFCL fix the slip), a base without a noisy expert does not."""
    import dataclasses
    import types
    from jaxagent.study.host import evaluate as host_evaluate
    from jaxagent.study.host.experts import NoisyExpert
    from jaxagent.study.host.presets import HOST_PRESETS
    n = 6
    bound = host_metrics.structural_bound([1] * n, [1, 2], [1])
    per_task = {"base": _grid([0.3] * n), **{f"grpo/seed{s}": _grid([0.4 + 0.01 * s] * n) for s in range(3)}}
    hl = {("grpo", s): OK for s in range(3)}
    for recovering in (False, True):
        m = host_metrics.domain_metrics("code", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=n,
                                        recovering_expert=recovering)
        assert not math.isnan(m["code.f2_shrink.diff.mean"])
        assert (m.get("code.note.f2_shrink") == host_metrics.RECOVERING_EXPERT_NOTE) is recovering

    class Env:  # an env without a noisy expert of its own (`expert_for` gives None): a base cannot recover
        def ground_truth_actions(self, task):
            return ["ref"]

    class Expert(NoisyExpert):  # the slipped episode: the slip, then the reference (coding, BFCL) or the slip alone
        def __init__(self, env, fixes):
            super().__init__(env)
            self.fixes = fixes

        def slipped_actions(self, task, seed, fix=1.0):
            return None if task == "no slip" else ["slip", "ref"] if self.fixes and fix > 0 else ["slip"]

    sft = HOST_PRESETS["code-toy"].sft
    for settings, fixes, expect in ((sft, True, True), (sft, False, False),
                                    (dataclasses.replace(sft, check=0.5), False, True),
                                    (dataclasses.replace(sft, noise=0.0), True, False), (None, True, False),
                                    (dataclasses.replace(sft, slip_fix=0.0), True, False)):
        env = Env()
        run = types.SimpleNamespace(preset=types.SimpleNamespace(sft=settings),
                                    world=types.SimpleNamespace(env=env, train_tasks=["no slip", "t"]))
        assert host_evaluate.recovering_expert(run, Expert(env, fixes)) is expect
        assert host_evaluate.recovering_expert(run) is (expect and settings.check > 0)  # no expert: no fixed slip
    assert all(HOST_PRESETS[p].sft.noise > 0 for p in ("sql-toy", "code-toy", "bfcl-toy"))
    assert HOST_PRESETS["sql-toy"].sft.check > 0


def test_gigpo_parity_is_not_judged_when_every_training_episode_took_one_turn():
    """One-turn episodes make GiGPO's step groups its episode groups (a rescaled GRPO advantage): finding 7 then
    has no estimate and says why; a single longer episode makes the comparison possible again, and the share of
    longer episodes is a row of the finding."""
    bound = host_metrics.structural_bound([1] * 6, [1, 2], [1])
    rng = np.random.default_rng(1)
    per_task = {"base": _grid([0.3] * 6), **{f"{a}/seed{s}": _grid(0.5 + 0.1 * rng.random(6))
                                              for a in ("grpo", "gigpo") for s in (0, 1)}}
    hl = {(a, s): OK for a in ("grpo", "gigpo") for s in (0, 1)}
    f7 = next(x for x in host_metrics.domain_findings("sql", "SQL") if x.key == "sql.f7_gigpo")
    one = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=6,
                                      gigpo_turns={0: [1.0] * 5, 1: [1.0] * 5})
    assert not any(k.startswith("sql.f7_gigpo.diff") for k in one) and "sql.f7_gigpo.room_lo" not in one
    assert "took one turn" in one["sql.note.f7_gigpo"] and one["sql.f7_gigpo.multi_turn_share"] == 0.0
    assert finding_verdict(f7, one)[0] != stats.REPRODUCED
    mixed = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=6,
                                        gigpo_turns={0: [1.0, 1.25], 1: [1.0, 1.0]})
    assert "sql.note.f7_gigpo" not in mixed and np.isfinite(mixed["sql.f7_gigpo.diff.mean"])
    assert mixed["sql.f7_gigpo.multi_turn_share"] == pytest.approx(0.25 / 4)
    lines, _ = host_report.domain_section("sql", "SQL", mixed, (f7,), policies=["base", "grpo", "gigpo"],
                                          tiers=[1, 2], ks=[1], t_max=2, splits=("train", "test"))
    assert "longer than one turn (%, at least) | 6.2" in "\n".join(lines)
    assert host_metrics.multi_turn_share([1.0, 2.0, 3.0], 3) == pytest.approx(0.5)


def test_rate_rows_rooms_and_verdicts():
    """f3 (pass rate), f4 (correction rate), f6 (success rates): room (-base, 1 - base) from the metric
    functions; a base pass rate of 2% leaves f3 (RL below base) less than E = 0.05: untestable; a base correction
    rate of 95% leaves f4 5 points < E = 14.2: untestable; each is decided on its interval otherwise."""
    f3 = host_step_quality.finding("code", "Coding")
    # RL - base per seed: shift + 0.01 s; -0.01 gives a CI holding 0, +0.1 one above it (the paper's opposite)
    for q_base, shift, want in ((0.02, -0.01, stats.UNTESTABLE), (0.5, -0.01, stats.NOT_REPRODUCED),
                                (0.02, 0.1, stats.OPPOSITE), (0.5, 0.1, stats.OPPOSITE)):
        scored = {s: {"g": 2, "base": [[q_base, q_base]] * 4, "rl": [[q_base + shift + 0.01 * s] * 2] * 4,
                      "source": ["base"] * 4, "turn": [0] * 4, "task_id": ["t"] * 4, "episode": [0] * 4}
                  for s in range(3)}
        m = host_step_quality.step_quality_metrics("code", scored, [0, 1, 2], host_metrics.put_estimate)
        assert room_from_metrics(f3, m) == pytest.approx((-q_base, 1 - q_base))
        assert finding_verdict(f3, m)[0] == want, (q_base, shift, finding_verdict(f3, m))
    f4 = host_error_recovery.finding("bfcl", "BFCL")
    # RL corrects n_base + gain + (s % 2) of 20: at 19 of 20 the CI holds 0 with 1 point of room
    for n_base, gain, want in ((19, 0, stats.UNTESTABLE), (6, 7, stats.REPRODUCED)):
        judged = {s: {"base": [True] * n_base + [False] * (20 - n_base),
                      "rl": [True] * (n_base + gain + s % 2) + [False] * (20 - n_base - gain - s % 2),
                      "source": ["base"] * 20} for s in range(4)}
        m = host_error_recovery.error_recovery_metrics("bfcl", judged, [0, 1, 2, 3], host_metrics.put_estimate)
        assert room_from_metrics(f4, m) == pytest.approx((-n_base / 20, 1 - n_base / 20))
        assert finding_verdict(f4, m)[0] == want, finding_verdict(f4, m)
    f_multi, f_single = host_dynamics.finding("code", "Coding")

    def logs(base_single, first_multi, last_multi):
        rs = lambda v: {"r_single": float(np.mean(v)), "r_single_tasks": list(v), "n_samples": 4}  # noqa: E731
        return {s: [host_dynamics.record(-1, math.nan, 0, rs(base_single)),
                    host_dynamics.record(0, first_multi, 16, rs(base_single)),
                    host_dynamics.record(9, last_multi + s / 16, 16, rs(np.maximum(base_single - 0.01 * s, 0)))]
                for s in range(3)}

    def batches(first_multi, last_multi):  # 10 iterations of 16 episodes: the first 5 at first_multi, the last 5 higher
        return {s: [first_multi] * 5 + [last_multi + s / 16] * 5 for s in range(3)}

    m = host_dynamics.dynamics_metrics("code", logs(np.full(4, 0.05), 0.75, 0.8), [0, 1, 2],
                                       host_metrics.put_estimate, batches(0.75, 0.8))
    assert room_from_metrics(f_single, m) == pytest.approx((-0.05, 0.95))
    assert room_from_metrics(f_multi, m) == pytest.approx((-0.75, 0.25))
    assert finding_verdict(f_single, m)[0] == stats.UNTESTABLE  # 0.05 < E = 0.097: R_single cannot fall by E
    assert finding_verdict(f_multi, m)[0] == stats.UNTESTABLE   # 0.25 < E = 0.331: R_multi cannot rise by E
    m = host_dynamics.dynamics_metrics("code", logs(np.full(4, 0.5), 0.25, 0.25), [0, 1, 2],
                                       host_metrics.put_estimate, batches(0.25, 0.25))
    assert finding_verdict(f_single, m)[0] not in (stats.UNTESTABLE,)
    assert finding_verdict(f_multi, m)[0] == stats.NOT_REPRODUCED  # no rise: the CI's upper end is below E


def test_report_prints_the_room_and_what_would_have_failed_each_row():
    rng = np.random.default_rng(1)
    bound = host_metrics.structural_bound([1] * 8, [1, 2], [1, 2])
    base = np.broadcast_to(np.full(8, 0.95), (2, 2, 8)).copy()
    per_task = {"base": base, **{f"grpo/seed{s}": np.clip(base + 0.02 * rng.normal(size=base.shape), 0, 1)
                                 for s in range(3)}}
    m = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1, 2], {("grpo", s): OK for s in range(3)},
                                 n_train=8, n_heldout=8)
    findings = host_metrics.domain_findings("sql", "SQL")
    lines, verdicts = host_report.domain_section("sql", "SQL", m, findings, policies=["base", "grpo"], tiers=[1, 2],
                                                 ks=[1, 2], t_max=2, splits=("train", "test"))
    text = "\n".join(lines)
    assert "| bound allows | verdict | why |" in text
    assert verdicts["sql.f1_pass1"] == stats.UNTESTABLE
    row = next(x for x in text.splitlines() if x.startswith("| SQL: 1. held-out Pass@1"))
    assert ("| [-95.0, 5.0] | untestable here (bound) | the 95% CI holds 0 and the bound allows at most 5 on the "
            "paper's side" in row)
    for f in findings:
        if f.key in verdicts:
            assert f"Would have been not reproduced with: {f.falsified_by}." in text
    assert "The bound allows differences in [-95.0, 5.0] (points)" in text
    report = host_report.build_host_report({"preset": "x"}, m, [lines])
    assert f"Intervals: {stats.INTERVAL_METHOD}" in report
