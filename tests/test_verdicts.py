"""jaxagent.eval.findings: every verdict reachable through `finding_verdict` for a +1, a -1 and a parity row of
the study (synthetic metrics dicts as metrics.json holds them), the structural room making a row "untestable
here (bound)", seeds_to_decide, the real tier in titles, and the finding definitions themselves."""
import math

import pytest
from scipy import stats as sps

from jaxagent.eval import findings as F
from jaxagent.eval import stats

BY_KEY = {f.key: f for f in F.DEFAULT_FINDINGS}
T = stats.T_SEEDS


def _metrics(f, lo, hi, *, mde=0.05, mean=None, room=None, lo90=None, hi90=None, n=5, **extra):
    """A finding's estimate (t over n seeds) and optional room in a flat metrics dict."""
    mean = (lo + hi) / 2 if mean is None else mean
    half = (hi - lo) / 2
    p = f.diff
    m = {f"{p}.mean": mean, f"{p}.lo": lo, f"{p}.hi": hi, f"{p}.mde": mde, f"{p}.method": T,
         f"{p}.lo90": mean - 0.8 * half if lo90 is None else lo90,
         f"{p}.hi90": mean + 0.8 * half if hi90 is None else hi90,
         f"{p}.se": half / float(sps.t.ppf(0.975, n - 1)) if half > 0 else 0.0, f"{p}.df": n - 1, f"{p}.n_seeds": n,
         f"{p}.n_units": 64 * n}
    if room is not None:
        m[f"{f.key}.room_lo"], m[f"{f.key}.room_hi"] = room
    m.update(extra)
    return m


# ----------------------------------------------------------------------------- a +1 row: f1_pass1 (E = 10 points)
@pytest.mark.parametrize("lo, hi, room, want", [
    (0.02, 0.20, (-0.3, 0.5), stats.REPRODUCED),                 # CI above 0, reaches E
    (0.02, 0.08, (-0.3, 0.5), stats.SMALLER),                    # CI above 0, wholly short of E
    (-0.20, -0.02, (-0.3, 0.5), stats.OPPOSITE),                 # CI below 0
    (-0.02, 0.08, (-0.3, 0.5), stats.NOT_REPRODUCED),            # holds 0, upper end below E
    (-0.05, 0.15, (-0.3, 0.5), stats.UNDERPOWERED),              # holds 0 and E
    (0.0, 0.0, (-0.3, 0.5), stats.NO_VARIANCE),                  # every seed the same
    (0.02, 0.20, (-0.3, 0.06), stats.SMALLER),                   # the bound allows 6 < 10 points: sign only
    (-0.02, 0.20, (-0.3, 0.06), stats.UNTESTABLE),               # ... and the CI holds 0
    (0.02, 0.20, None, stats.REPRODUCED),                        # no room measured: the rule alone
])
def test_directional_positive_row_reaches_every_verdict(lo, hi, room, want):
    f = BY_KEY["f1_pass1"]
    verdict, why = F.finding_verdict(f, _metrics(f, lo, hi, room=room))
    assert verdict == want, why
    if room is not None and room[1] < 0.1 and want != stats.NO_VARIANCE:  # numbers in the report's scale
        assert "the bound allows at most 6 on the paper's side, less than E = 10" in why


def test_the_room_blocks_the_size_never_the_sign():
    """A CI far above 0 stays a sign result when the bound leaves less than E; one holding 0 is untestable."""
    f = BY_KEY["f8_budgetmix_t25"]  # E = 7.5 points
    assert F.finding_verdict(f, _metrics(f, 0.03, 0.05, room=(-0.2, 0.07)))[0] == stats.SMALLER
    assert F.finding_verdict(f, _metrics(f, -0.03, 0.05, room=(-0.2, 0.07)))[0] == stats.UNTESTABLE
    assert F.finding_verdict(f, _metrics(f, 0.03, 0.08, room=(-0.2, 0.08)))[0] == stats.REPRODUCED
    assert F.finding_verdict(f, _metrics(f, 0.0, 0.0, mde=0.0, room=(-0.2, 0.3)))[0] == stats.NO_VARIANCE


# ----------------------------------------------------------------------------- a -1 row: f2 (E = 10 points)
@pytest.mark.parametrize("lo, hi, room, want", [
    (-0.25, -0.05, (-0.4, 0.2), stats.REPRODUCED),               # the gap shrinks by E or more
    (-0.08, -0.02, (-0.4, 0.2), stats.SMALLER),                  # it shrinks, by less than E
    (0.05, 0.25, (-0.4, 0.2), stats.OPPOSITE),                   # the gap grows
    (-0.08, 0.02, (-0.4, 0.2), stats.NOT_REPRODUCED),            # holds 0, lower end above -E
    (-0.15, 0.05, (-0.4, 0.2), stats.UNDERPOWERED),
    (-0.25, -0.05, (-0.08, 0.3), stats.SMALLER),                 # at most 8 points of shrinking possible
    (-0.25, 0.05, (-0.08, 0.3), stats.UNTESTABLE),
])
def test_directional_negative_row_reaches_every_verdict(lo, hi, room, want):
    f = BY_KEY["f2_shrink_frozenlake"]
    assert f.direction == -1
    verdict, why = F.finding_verdict(f, _metrics(f, lo, hi, room=room))
    assert verdict == want, why


# ----------------------------------------------------------------------------- a parity row: f8 at 100% (m = 4)
@pytest.mark.parametrize("lo, hi, lo90, hi90, room, want", [
    (-0.03, 0.03, -0.02, 0.02, (-0.5, 0.3), stats.REPRODUCED),      # TOST: 90% CI inside +/-4 points
    (0.01, 0.05, 0.015, 0.035, (-0.5, 0.3), stats.REPRODUCED),      # 95% CI misses 0, 90% CI inside the margin
    (0.05, 0.09, 0.055, 0.085, (-0.5, 0.3), stats.NOT_REPRODUCED),  # 95% CI wholly above +4 points
    (0.01, 0.09, 0.02, 0.08, (-0.5, 0.3), stats.INCONCLUSIVE),      # misses 0, straddles the margin
    (-0.08, 0.08, -0.06, 0.06, (-0.5, 0.3), stats.INCONCLUSIVE),    # neither
    (0.0, 0.0, 0.0, 0.0, (-0.5, 0.3), stats.NO_VARIANCE),           # every seed at 0
    (-0.03, 0.03, -0.02, 0.02, (-0.03, 0.02), stats.UNTESTABLE),    # the bound forces equivalence
])
def test_parity_row_reaches_every_verdict(lo, hi, lo90, hi90, room, want):
    f = BY_KEY["f8_budgetmix_t100"]
    assert f.direction == 0 and f.margin == pytest.approx(0.04)
    verdict, why = F.finding_verdict(f, _metrics(f, lo, hi, lo90=lo90, hi90=hi90, room=room))
    assert verdict == want, why
    if want == stats.UNTESTABLE:
        assert "equivalence is forced by the bound" in why


def test_room_from_metrics():
    f = BY_KEY["f1_pass1"]
    assert F.room_from_metrics(f, {}) is None
    assert F.room_from_metrics(f, {"f1_pass1.room_lo": -0.2}) is None
    assert F.room_from_metrics(f, {"f1_pass1.room_lo": -0.2, "f1_pass1.room_hi": math.nan}) is None
    assert F.room_from_metrics(f, {"f1_pass1.room_lo": 0.2, "f1_pass1.room_hi": 0.1}) is None  # not a range
    assert F.room_from_metrics(f, {"f1_pass1.room_lo": -0.2, "f1_pass1.room_hi": 0.5}) == (-0.2, 0.5)
    # a host domain's finding reads its own key
    host = F.Finding("sql.f1_pass1", "t", (), "sql.f1_pass1.diff", "d", 1, effect=0.1)
    assert F.room_from_metrics(host, {"sql.f1_pass1.room_lo": -0.1, "sql.f1_pass1.room_hi": 0.4}) == (-0.1, 0.4)


def test_seeds_to_decide_only_for_underpowered_rows():
    f = BY_KEY["f1_pass1"]
    under = _metrics(f, -0.05, 0.15, room=(-0.3, 0.5))
    rng = F.seeds_to_decide(f, under)
    est = F.estimate_from_metrics(under, f.diff)
    assert rng == stats.seeds_needed(est, 0.10, max_seeds=F.SEEDS_CAP) and est.n_seeds <= rng[0] < rng[1]
    assert F.seeds_to_decide(f, _metrics(f, 0.02, 0.2)) is None                     # reproduced
    assert F.seeds_to_decide(f, _metrics(f, -0.02, 0.2, room=(-0.3, 0.05))) is None  # untestable: no seeds help
    p = BY_KEY["f8_budgetmix_t100"]  # parity: no power rule, so no seed count
    assert F.seeds_to_decide(p, _metrics(p, -0.08, 0.08, lo90=-0.06, hi90=0.06)) is None


def test_seeds_phrase():
    assert F.seeds_phrase((3, 90)) == "about 3-90 seeds would decide it"
    assert F.seeds_phrase((7, 7)) == "about 7 seeds would decide it"
    assert F.seeds_phrase((40, None)) == "about 40 to over 1000 seeds would decide it"
    assert F.seeds_phrase((None, None)) == "over 1000 seeds would be needed to decide it"
    assert F.seeds_phrase(None) == ""


def test_finding_title_prints_the_real_tier():
    f25, f2, f1 = BY_KEY["f8_budgetmix_t25"], BY_KEY["f2_shrink_frozenlake"], BY_KEY["f1_pass1"]
    assert F.finding_title(f25, {}) == f25.title
    exact = F.finding_title(f25, {"f8_budgetmix_t25.tier_turns": 2, "meta.t_max": 8})
    assert "at 25% of T_max (T=2 of 8)," in exact and "nominal" not in exact
    off = F.finding_title(f25, {"f8_budgetmix_t25.tier_turns": 2, "meta.t_max": 6})
    assert "at 25% of T_max (T=2 of 6: 33% of T_max, not the nominal 25%)" in off
    assert "tightest tier (T=2 of 8)" in F.finding_title(f2, {"f2_shrink_frozenlake.tier_turns": 2, "meta.t_max": 8})
    assert F.finding_title(f1, {"meta.t_max": 8}) == f1.title


def test_every_row_says_what_would_fail_it_and_llr_rows_test_a_threshold():
    for f in F.DEFAULT_FINDINGS:
        assert f.falsified_by and not f.falsified_by.endswith("."), f.key
        assert f.direction in (-1, 0, 1)
    keys = set(BY_KEY)
    assert {"f1_pass1", "f5_llr_rl"} <= keys and "f5_llr_success" not in keys  # Jeffreys contrast: not judged
    assert F.DEFAULT_FINDINGS[0].key == "f1_pass1"
    assert F.LLR_THRESHOLD == 1.0
    for key in ("f5_llr_rl", "f5_matched_frozenlake"):
        assert BY_KEY[key].direction == 1 and BY_KEY[key].effect == pytest.approx(1.0), key
    assert "informative test" not in BY_KEY["f5_matched_frozenlake"].note
    assert "Jeffreys" in BY_KEY["f5_llr_rl"].note and "KL(RL || base) + KL(base || RL)" in BY_KEY["f5_llr_rl"].note
    # rows judged where the bound can leave room for E carry one
    for key in ("f1_pass1", "f1_breadth", "f2_shrink_frozenlake", "f3_step_frozenlake", "f4_error_frozenlake",
                "f6_r_multi", "f6_r_single", "f7_process_frozenlake", "f8_budgetmix_t25", "f8_budgetmix_t50",
                "f8_budgetmix_t75", "f8_budgetmix_t100"):
        assert BY_KEY[key].room, key
    assert BY_KEY["f6_r_single"].direction == -1 and BY_KEY["f6_r_single"].effect == pytest.approx(0.097)
    # R_multi on FrozenLake: E from the paper's FrozenLake continuation gain, not DeepCoder-MT's 0.331
    assert BY_KEY["f6_r_multi"].effect == pytest.approx(0.513 - 0.386) == F.F6_R_MULTI_E
    assert BY_KEY["f6_r_multi"].diff_paper is None and "training-batch" in BY_KEY["f6_r_multi"].title
    assert [BY_KEY[f"f8_budgetmix_t{t}"].tier for t in (25, 50, 75, 100)] == [0.25, 0.5, 0.75, 1.0]
    for field in ("at_bound", "ceiling"):
        assert field not in F.Finding.__dataclass_fields__


def test_docs_state_what_would_fail_each_row():
    """docs/study.md's falsifier table holds every row with the sentence the report prints."""
    import os
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "study.md"), encoding="utf-8").read()
    table = text[text.index("## What would have failed each row"):text.index("## Results on two seed sets")]
    for f in F.DEFAULT_FINDINGS:
        row = next((line for line in table.splitlines() if line.startswith(f"| `{f.key}` |")), None)
        assert row is not None and row.endswith(f"| {f.falsified_by} |"), f.key
    for word in (" round ", "previously", "Second round", "Third round"):
        assert word not in text, word


def test_every_judged_frozenlake_row_says_what_its_base_does_to_it():
    """Each FrozenLake row the rule judges carries, in its note, what the epsilon-noisy base does to it and why its
    failing result was possible under this recipe (`findings.BASE_EFFECT`); the LLR rows are reported, not judged."""
    other_domains = ("bfcl", "deepcoder", "terminal")
    for f in F.DEFAULT_FINDINGS:
        if any(d in f.key for d in other_domains) or f.recipe is F.recipe_lib.llr_check:
            continue
        assert "Base:" in f.note and f.key in F.BASE_EFFECT, f.key
