"""The toy presets: budget tiers at the exact fractions of T_max, contexts that hold every episode and the plan
prompt, a base SFT at the full budget with plan episodes, and R_single's held-out sizes; a preset with a command line's overrides (`with_overrides`)."""
from fractions import Fraction

import pytest

from jaxagent.envs.jax.budgets import budget_text, budget_tiers
from jaxagent.study import plan_mode
from jaxagent.study.frozenlake import presets
from jaxagent.study.frozenlake.presets import PRESETS, EvalSettings
from jaxagent.study.run_dir import InvalidSettings
from jaxagent.study.toy import make_toy_world

TOY = ("quick", "standard", "full", "ci")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    return {size: make_toy_world(d, size=size) for size in {PRESETS[n].task.size for n in TOY}}


@pytest.mark.parametrize("name", TOY)
def test_tiers_are_exact_fractions(name):
    p = PRESETS[name]
    tiers = budget_tiers(p.task.t_max, p.eval.fractions)
    assert all(Fraction(t, p.task.t_max) == Fraction(repr(f)) for t, f in zip(tiers, p.eval.fractions)), tiers


def test_tiers_of_the_study():
    assert budget_tiers(PRESETS["quick"].task.t_max) == budget_tiers(PRESETS["standard"].task.t_max) == (2, 4, 6, 8)
    assert budget_tiers(PRESETS["full"].task.t_max) == (3, 6, 9, 12)
    assert PRESETS["ci"].task.t_max == 4


def _longest_episode(world, t_max: int, max_action_tokens: int) -> int:
    """Tokens of the longest possible episode: every reply cut at max_action_tokens and invalid (so every later
    turn opens with <|im_end|> and shows "Invalid action ." before the map)."""
    layout, size = world.layout, world.env.size
    grid = size * (size + 1) - 1
    total = len(layout.system)
    for t in range(t_max):
        budget = len(budget_text(t, t_max).replace(".", " .").split())
        opener = len(layout.first_open) if t == 0 else 1 + len(layout.next_open)
        total += opener + budget + (0 if t == 0 else 3) + grid + len(layout.close) + max_action_tokens
    return total


@pytest.mark.parametrize("name", TOY)
def test_context_holds_every_episode_and_the_plan_prompt(name, worlds):
    p = PRESETS[name]
    w = worlds[p.task.size]
    assert _longest_episode(w, p.task.t_max, p.task.max_action_tokens) <= p.task.max_context
    plan = len(w.layout.system) + plan_mode.plan_chunk_width(w, p.task.t_max) + plan_mode.max_plan_tokens(
        w.codec, p.task.t_max)
    assert plan <= p.task.max_context


@pytest.mark.parametrize("name", TOY)
def test_base_is_trained_at_the_full_budget_with_plan_episodes(name):
    b = PRESETS[name].base
    assert b.budget_mode == "full" and 0.1 <= b.plan_fraction <= 0.5 and b.n_plan() >= 1


def test_r_single_sizes():
    assert (EvalSettings().n_plan_tasks, EvalSettings().n_plan_samples) == (64, 8)
    assert (PRESETS["quick"].eval.n_plan_tasks, PRESETS["quick"].eval.n_plan_samples) == (32, 4)
    assert (PRESETS["ci"].eval.n_plan_tasks, PRESETS["ci"].eval.n_plan_samples) == (4, 2)


def test_with_overrides():
    p = presets.with_overrides("ci", iterations=3, seeds=[4, 5], mesh=[1, 1, 1], remat="none", micro_batches=2)
    assert (p.iterations, p.seeds, p.mesh, p.remat, p.micro_batches) == (3, (4, 5), (1, 1, 1), None, 2)
    assert presets.with_overrides(PRESETS["quick"]) == PRESETS["quick"]  # None / empty keep the preset's values
    assert presets.with_overrides("ci", remat="dots").remat == "dots"
    with pytest.raises(InvalidSettings, match="needs --checkpoint"):
        presets.with_overrides("qwen3-0.6b-1gpu")
    assert presets.with_overrides("qwen3-0.6b-1gpu", checkpoint="/ckpt").checkpoint == "/ckpt"
    with pytest.raises(InvalidSettings, match="unknown preset 'nope'"):
        presets.with_overrides("nope")


def test_report_banner_says_what_measures_nothing():
    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent.study.stages import PLUMBING_NOTE, REHEARSAL_NOTE, report_banner
    assert report_banner(PRESETS["ci"]) == {"plumbing check": PLUMBING_NOTE}
    assert report_banner(HOST_PRESETS["ci-sql"]) == {"plumbing check": PLUMBING_NOTE}
    assert report_banner(PRESETS["quick"]) == {} and report_banner(HOST_PRESETS["sql-toy"]) == {}
    assert report_banner(presets.rehearsal_preset(PRESETS["qwen3-0.6b-1gpu"])) == {"rehearsal": REHEARSAL_NOTE}


def test_eta_line_counts_the_runs_that_trained():
    from jaxagent.study.frozenlake.train import eta_line
    assert eta_line([30.0, 0.1, 10.0], 7) == ("[RL] 3 of 7 arm x seed runs done (40 s); about 80 s left for 4 at "
                                             "20 s each")
    assert eta_line([0.1], 3) == "[RL] 1 of 3 arm x seed runs done (0 s); 2 left"
    assert eta_line([5.0, 7.0], 2) == "[RL] 2 of 2 arm x seed runs done (12 s)"


def test_quick_trains_the_judged_arms_on_five_seeds_and_has_a_headline_evaluation():
    q = PRESETS["quick"]
    # gigpo and ppo enter no FrozenLake verdict: quick spends their time on 5 seeds of the judged arms (standard
    # keeps them)
    assert q.arms == ("grpo", "budgetmix", "grpo_oracle", "grpo_tight", "grpo_oracle_tight")
    assert q.seeds == (0, 1, 2, 3, 4)
    assert {"gigpo", "ppo"} <= set(PRESETS["standard"].arms)
    assert (q.eval.headline_tasks, q.eval.headline_samples) == (256, 8) and q.eval.headline_samples >= max(q.eval.ks)
    # the rehearsal cuts the headline as the other counts; an accelerator preset has none
    r = presets.rehearsal_preset(q)
    assert (r.eval.headline_tasks, r.eval.headline_samples) == (2, 1)
    assert PRESETS["qwen3-0.6b-1gpu"].eval.headline_tasks == 0


@pytest.mark.parametrize("tasks, samples, match", [(-1, 8, "eval.headline_tasks must be a non-negative integer"),
                                                   (16, 2, r"eval.headline_samples must be an integer >= the largest K \(4\)"),
                                                   (16, 4.0, "eval.headline_samples must be an integer")])
def test_a_bad_headline_evaluation_is_one_line_naming_the_field(tmp_path, tasks, samples, match):
    import dataclasses
    from jaxagent.study.frozenlake.run import Run
    bad = dataclasses.replace(PRESETS["quick"], eval=dataclasses.replace(PRESETS["quick"].eval, headline_tasks=tasks,
                                                                         headline_samples=samples))
    with pytest.raises(InvalidSettings, match=match):
        Run(bad, str(tmp_path))
    assert not any(tmp_path.iterdir())  # checked before the run directory is made
