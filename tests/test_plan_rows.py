"""jaxagent.study.frozenlake.plan_rows' R_multi row (finding 6) against pass_rows' headline (finding 1) on the same
synthetic run: R_multi reads the training log (GRPO's training-batch success, last W iterations - first W), the
headline the evaluation (final RL - base held-out Pass@1): two estimates that move with different data."""
import json
import types

import numpy as np
import pytest

from jaxagent.eval import findings, health, stats
from jaxagent.study.frozenlake.context import EvalContext
from jaxagent.study.frozenlake.estimates import Estimator
from jaxagent.study.frozenlake.pass_rows import headline_rows
from jaxagent.study.frozenlake.plan_rows import r_multi_row

SEEDS = (0, 1, 2)
BATCH = 8  # episodes per training batch (n_tasks x group_size)
BY_KEY = {f.key: f for f in findings.DEFAULT_FINDINGS}


def _grid(v, tiers=2, n_tasks=4):
    """per_task [U, J=1, P]: the same Pass@1 on every tier and task."""
    return np.full((tiers, 1, n_tasks), float(v))


def _ctx(tmp_path, rates_by_seed, rl_by_seed, base=0.5):
    """An EvalContext over SEEDS: base and GRPO Pass@ grids (`rl_by_seed`), an all-solvable bound, and each GRPO
    seed's metrics.jsonl holding `rates_by_seed[s]` as its per-iteration training success."""
    for s, rates in rates_by_seed.items():
        d = tmp_path / "arms" / "grpo" / f"seed{s}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success_rate": r,
                                                             "valid_action_rate": 1.0}) + "\n"
                                                 for i, r in enumerate(rates)))
    preset = types.SimpleNamespace(eval=types.SimpleNamespace(ks=(1,), n_tasks=4, n_samples=1), rollout_batch=BATCH)
    evals = {f"base/seed{s}": {"announced": {"per_task": _grid(base)}} for s in SEEDS}
    evals.update({f"grpo/seed{s}": {"announced": {"per_task": _grid(rl_by_seed[s])}} for s in SEEDS})
    hl = {("grpo", s): health.SeedHealth(health.HEALTHY, "", 10, 1.0, 1.0, 0.5) for s in SEEDS}
    m: dict = {}
    return EvalContext(run=types.SimpleNamespace(dir=str(tmp_path), preset=preset), base=None,
                       policies={("grpo", s): None for s in SEEDS}, tiers=[1, 2], rcfg=None,
                       tasks={s: None for s in SEEDS}, evals=evals,
                       bounds={s: {"per_task": _grid(1.0), "p_star": np.ones((2, 4))} for s in SEEDS},
                       hl=hl, m=m, est=Estimator(m, hl))


def _rows(tmp_path, rates_by_seed, rl_by_seed):
    ctx = _ctx(tmp_path, rates_by_seed, rl_by_seed)
    headline_rows(ctx)
    assert not any(k.startswith("f6_") for k in ctx.m)  # the headline no longer writes R_multi
    r_multi_row(ctx, list(SEEDS))
    return ctx.m


RATES = {s: [0.25] * 5 + [0.5 + s / 8] * 5 for s in SEEDS}  # rises 0.25, 0.375, 0.5 over 10 iterations
RL = {0: 0.6, 1: 0.7, 2: 0.8}                                 # final RL - base +0.1, +0.2, +0.3 on held-out maps


def test_f6_r_multi_is_the_training_log_not_the_headline(tmp_path):
    m = _rows(tmp_path / "a", RATES, RL)
    # finding 1: t over the per-seed held-out gaps 0.1, 0.2, 0.3 (4 tasks each)
    assert m["f1_pass1.diff.mean"] == pytest.approx(0.2) and m["f1_pass1.diff.n_units"] == 3 * 4
    # finding 6: per seed, the last 5 batches' episodes - the first 5's (8 episodes each): 0.25, 0.375, 0.5
    assert m["f6_r_multi.diff.mean"] == pytest.approx(0.375) and m["f6_r_multi.diff.n_units"] == 3 * 80
    assert m["f6_r_multi.diff.lo"] == pytest.approx(0.375 - 4.303 * 0.125 / np.sqrt(3), abs=1e-3)
    assert (m["f6_r_multi.first"], m["f6_r_multi.last"]) == pytest.approx((0.25, 0.625))
    assert (m["f6_r_multi.room_lo"], m["f6_r_multi.room_hi"]) == pytest.approx((-0.25, 0.75))
    assert (m["f6_r_multi.window"], m["f6_r_multi.iterations"], m["f6_r_multi.n_batch"]) == (5, 10, BATCH)
    # the two rows have their own E and their own verdicts on this run
    f1, f6 = BY_KEY["f1_pass1"], BY_KEY["f6_r_multi"]
    assert (f1.effect, f6.effect) == (pytest.approx(0.10), pytest.approx(0.127))
    assert findings.finding_verdict(f1, m)[0] == stats.UNDERPOWERED   # [-0.05, 0.45] holds 0 and 10 points
    assert findings.finding_verdict(f6, m)[0] == stats.REPRODUCED     # [0.06, 0.69] above 0, reaches 0.127
    # a different training log moves R_multi only; a different evaluation moves the headline only
    flat = _rows(tmp_path / "b", {s: [0.25] * 10 for s in SEEDS}, RL)
    assert flat["f1_pass1.diff.mean"] == pytest.approx(0.2) and flat["f6_r_multi.diff.mean"] == pytest.approx(0.0)
    assert findings.finding_verdict(f6, flat)[0] == stats.NO_VARIANCE  # every seed flat: no test
    worse = _rows(tmp_path / "c", RATES, {0: 0.4, 1: 0.45, 2: 0.5})
    assert worse["f1_pass1.diff.mean"] == pytest.approx(-0.05) and worse["f6_r_multi.diff.mean"] == pytest.approx(0.375)


def test_a_seed_with_one_logged_iteration_has_no_r_multi(tmp_path):
    rates = {0: RATES[0], 1: RATES[1], 2: [0.5]}
    m = _rows(tmp_path, rates, RL)
    assert m["f6_r_multi.diff.n_seeds"] == 2 and m["f6_r_multi.diff.mean"] == pytest.approx((0.25 + 0.375) / 2)
    # an uneven window (4 iterations: W = 2) uses the first and last two batches
    m = _rows(tmp_path / "w", {s: [0.0, 0.125, 0.5, 0.75 + s / 8] for s in SEEDS}, RL)
    assert m["f6_r_multi.window"] == 2 and m["f6_r_multi.first"] == pytest.approx(0.0625)
    assert m["f6_r_multi.diff.mean"] == pytest.approx(np.mean([(0.5 + 0.75 + s / 8) / 2 - 0.0625 for s in SEEDS]))
