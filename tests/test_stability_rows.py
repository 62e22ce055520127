"""Finding 7 on FrozenLake as the paper states it: training stability of GRPO and GRPO + the oracle process reward,
both trained at the tightest tier. The tight budget mode of the training loop, the per-seed fall
(`dynamics.training_drawdown`), the row on synthetic training logs (every seed counted, collapsed ones included,
the room GRPO's own fall leaves), its verdicts both ways, and the evaluation row judged only when the run trained at
the tight tier (`recipe.no_tight_training`)."""
import json
import types

import jax
import numpy as np
import pytest

from jaxagent.envs.jax import budgets
from jaxagent.eval import findings, health, recipe, stats
from jaxagent.eval.dynamics import training_drawdown
from jaxagent.rl.loop import RLSettings, sample_budgets
from jaxagent.study.common.arms import ARMS
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import Estimator
from jaxagent.study.frozenlake.pass_rows import process_pair
from jaxagent.study.frozenlake.stability_rows import KEY, TIGHT_ARMS, stability_row

BY_KEY = {f.key: f for f in findings.DEFAULT_FINDINGS}
SEEDS = (0, 1, 2, 3)


@pytest.mark.parametrize("t_max, want", [(8, 2), (10, 3), (4, 1), (1, 1)])
def test_tight_arms_train_every_episode_at_the_tightest_tier(t_max, want):
    settings = RLSettings(budget_mode="tight", n_tasks=2, group_size=3)
    got = np.asarray(sample_budgets(jax.random.key(0), settings, t_max))
    assert got.shape == (6,) and (got == want).all() and want == budgets.budget_tiers(t_max)[0]
    assert ARMS["grpo_tight"].budget_mode == ARMS["grpo_oracle_tight"].budget_mode == "tight"
    assert (ARMS["grpo_tight"].estimator, ARMS["grpo_oracle_tight"].estimator) == ("grpo", "process")
    with pytest.raises(ValueError, match="budget_mode must be one of"):
        RLSettings(budget_mode="tiny")


def test_training_drawdown_is_the_fall_from_the_best_window_to_the_last():
    assert training_drawdown([0.2, 0.5, 0.6, 0.1, 0.1, 0.0]) == pytest.approx((1.3 / 3 - 0.2 / 3, 3))
    assert training_drawdown([0.1, 0.2, 0.3, 0.4]) == (0.0, 2)       # rising to its end: no fall
    assert training_drawdown([0.3, 0.1]) == pytest.approx((0.2, 1))  # W = n // 2
    assert training_drawdown([0.5]) is None
    assert training_drawdown([1.0] * 4 + [0.0] * 4) == (1.0, 3)     # the largest fall possible


def _ctx(tmp_path, logs, collapsed=()):
    """An EvalContext whose arm seeds have the training logs `logs[(arm, seed)]` (per-iteration success)."""
    hl = {}
    for (arm, s), rates in logs.items():
        d = tmp_path / "arms" / arm / f"seed{s}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success_rate": r,
                                                             "valid_action_rate": 1.0}) + "\n"
                                                 for i, r in enumerate(rates)))
        status = health.COLLAPSED if (arm, s) in collapsed else health.HEALTHY
        hl[(arm, s)] = health.SeedHealth(status, "", len(rates), 1.0, 1.0, rates[-1])
    m: dict = {"meta.t_max": 8.0}
    return EvalContext(run=types.SimpleNamespace(dir=str(tmp_path), preset=None), base=None,
                       policies={k: None for k in logs}, tiers=[2, 4, 6, 8], rcfg=None, tasks={}, evals={},
                       bounds={}, hl=hl, m=m, est=Estimator(m, hl))


def _logs(grpo_falls, oracle_falls, n=12):
    """Per seed: both arms rise to 0.5, hold it for 3 iterations, then fall by the given amount for their last 3."""
    out = {}
    for arm, falls in zip(TIGHT_ARMS, (grpo_falls, oracle_falls)):
        for s, fall in zip(SEEDS, falls):
            out[(arm, s)] = list(np.linspace(0.2, 0.4, n - 6)) + [0.5] * 3 + [0.5 - fall] * 3
    return out


def test_the_row_pairs_seeds_counts_collapsed_ones_and_leaves_grpo_s_fall_as_room(tmp_path):
    grpo, oracle = (0.30, 0.35, 0.25, 0.40), (0.0, 0.05, 0.0, 0.02)
    ctx = _ctx(tmp_path, _logs(grpo, oracle), collapsed={("grpo_tight", 3)})
    stability_row(ctx)
    m = ctx.m
    diffs = np.subtract(grpo, oracle)
    assert m[f"{KEY}.diff.mean"] == pytest.approx(diffs.mean()) and m[f"{KEY}.diff.n_seeds"] == 4
    assert m[f"{KEY}.diff.seeds"].endswith("none excluded")  # the collapsed seed 3 counts
    assert (m[f"{KEY}.grpo"], m[f"{KEY}.oracle"]) == pytest.approx((np.mean(grpo), np.mean(oracle)))
    assert (m[f"{KEY}.collapsed_grpo"], m[f"{KEY}.collapsed_oracle"]) == (0.25, 0.0)
    assert (m[f"{KEY}.room_lo"], m[f"{KEY}.room_hi"]) == pytest.approx((np.mean(grpo) - 1, np.mean(grpo)))
    assert (m[f"{KEY}.window"], m[f"{KEY}.tier_turns"]) == (3.0, 2.0)
    f = BY_KEY[KEY]
    assert findings.finding_verdict(f, m)[0] == stats.REPRODUCED
    assert "(T=2 of 8)" in findings.finding_title(f, m)


def test_the_row_can_fail_and_a_grpo_that_never_fell_blocks_only_the_size(tmp_path):
    f = BY_KEY[KEY]
    worse = _ctx(tmp_path / "a", _logs((0.0, 0.02, 0.0, 0.01), (0.20, 0.30, 0.25, 0.35)))
    stability_row(worse)  # the process reward made training less stable: a CI below 0
    assert worse.m[f"{KEY}.diff.hi"] < 0 and findings.finding_verdict(f, worse.m)[0] == stats.OPPOSITE
    calm = _ctx(tmp_path / "b", _logs((0.02, 0.04, 0.03, 0.05), (0.0, 0.01, 0.0, 0.01)))
    stability_row(calm)   # GRPO fell 3.5 points on average: the room leaves less than E = 10 points
    assert calm.m[f"{KEY}.room_hi"] < f.effect
    assert findings.finding_verdict(f, calm.m)[0] == stats.SMALLER  # a CI above 0: the sign stands
    same = _ctx(tmp_path / "c", _logs((0.02, 0.0, 0.01, 0.0), (0.0, 0.02, 0.0, 0.01)))
    stability_row(same)   # a CI holding 0 with GRPO's fall below E: not decidable here
    assert findings.finding_verdict(f, same.m)[0] == stats.UNTESTABLE


def test_no_row_without_both_tight_arms(tmp_path):
    logs = {k: v for k, v in _logs((0.3,) * 4, (0.0,) * 4).items() if k[0] == "grpo_tight"}
    ctx = _ctx(tmp_path, logs)
    stability_row(ctx)
    assert not any(k.startswith(KEY) for k in ctx.m)


def test_the_evaluation_row_is_judged_only_on_arms_trained_at_the_tight_tier(tmp_path):
    tight = _ctx(tmp_path / "a", {(a, 0): [0.1, 0.2] for a in ("grpo", "grpo_oracle") + TIGHT_ARMS})
    assert process_pair(tight) == ("grpo_tight", "grpo_oracle_tight", 2)
    full = _ctx(tmp_path / "b", {(a, 0): [0.1, 0.2] for a in ("grpo", "grpo_oracle", "grpo_tight")})
    assert process_pair(full) == ("grpo", "grpo_oracle", 8)
    assert process_pair(_ctx(tmp_path / "c", {("grpo", 0): [0.1, 0.2]})) is None
    assert recipe.no_tight_training({"f7_process_frozenlake.train_turns": 2.0, "meta.t_max": 8.0}) is None
    for m in ({"f7_process_frozenlake.train_turns": 8.0, "meta.t_max": 8.0}, {"meta.t_max": 8.0}, {}):
        assert recipe.no_tight_training(m) == recipe.NO_TIGHT_TRAINING_REASON
