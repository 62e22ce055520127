"""Plan mode (FrozenLake's R_single): the prompt, the parse-and-execute rule on scripted replies (the exact
solver's moves succeed, a wrong move, a cut or foreign token fails), `plan_success` on a tiny model, and the
base's SFT data (plan rows at the requested share, budgets per `BaseSettings.budget_mode`)."""
import jax
import numpy as np
import pytest

from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams, sample_tasks
from jaxagent.eval.state_drivers import first_turn_contexts
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import build_word_tokenizer
from jaxagent.rollout import env_codec
from jaxagent.study import plan_mode as pm
from jaxagent.study.stages import BaseSettings, TaskSettings, sft_data
from jaxagent.study.toy import expert_rollouts, make_toy_world

T_MAX = 8
ENV = FrozenLakeParams(horizon=T_MAX)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_toy_world(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tasks():
    maps = np.asarray(sample_tasks(jax.random.key(3), 32, 4, 0.8, random_start=True))
    dist = np.asarray(jax.vmap(fls.shortest_path_length)(maps))
    return maps[(dist >= 2) & (dist <= T_MAX)][:8]       # solvable within T_MAX, at least two moves


@pytest.fixture(scope="module")
def expert_plans(world, tasks):
    """The exact solver's moves (the noise-free budget-aware expert) on each task: actions [P, N], n [P]."""
    ro = expert_rollouts(world, tasks, np.full(len(tasks), T_MAX), jax.random.key(0), ENV, epsilon=0.0,
                         t_max=T_MAX, max_action_tokens=4, max_context=400)
    assert np.asarray(ro.success).all()
    return np.asarray(ro.turns.action), np.asarray(ro.turns_used)


def _replies(world, actions, n, m=None):
    """Canonical plan replies (moves + <|im_end|>) as generated tokens [R, M], lengths [R]."""
    m = m or pm.max_plan_tokens(world.codec, T_MAX)
    rows = [np.asarray(pm.plan_reply(world.codec, world.layout.end_of_turn, a, k, m)[0]) for a, k in zip(actions, n)]
    return np.stack(rows), np.asarray(n, np.int32) + 1


def test_plan_prompt_is_the_first_turn_with_the_instruction(world, tasks):
    toks, lens = pm.plan_prompts(world, tasks, T_MAX, ENV)
    text = world.tokenizer.decode(np.asarray(toks[0, :lens[0]]))
    assert f"Turn 1 of {T_MAX} . {T_MAX} turns left ." in text
    assert text.endswith(pm.PLAN_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n")
    # up to the map, the prompt is the multi-turn episode's first-turn context token for token
    ctx, ctx_len, _ = first_turn_contexts(world, tasks, t_max=T_MAX, env_params=ENV, width=256)
    n_tail = len(world.layout.close)
    for i in range(len(tasks)):
        first = np.asarray(ctx[i, :ctx_len[i] - n_tail])
        np.testing.assert_array_equal(np.asarray(toks[i, :first.size]), first)
        assert int(lens[i]) == int(ctx_len[i]) + len(pm.PLAN_WORDS)


def test_solver_plans_succeed_and_broken_ones_fail(world, tasks, expert_plans):
    actions, n = expert_plans
    replies, lens = _replies(world, actions, n)
    stopped, p = np.ones(len(n), bool), len(n)
    ok, parsed = pm.plan_outcomes(world, tasks, replies, lens, stopped, T_MAX, jax.random.key(1), ENV)
    assert np.asarray(ok).all() and np.asarray(parsed).all()

    # the last move changed: the goal is entered from its neighbour by one direction only
    wrong = actions.copy()
    last = n - 1
    wrong[np.arange(p), last] = (actions[np.arange(p), last] + 1) % 4
    r, ln = _replies(world, wrong, n)
    ok, parsed = pm.plan_outcomes(world, tasks, r, ln, stopped, T_MAX, jax.random.key(1), ENV)
    assert not np.asarray(ok).any() and np.asarray(parsed).all()

    # a budget one short of the plan: the moves past it are not made
    ok, _ = pm.plan_outcomes(world, tasks, replies, lens, stopped, n - 1, jax.random.key(1), ENV)
    assert not np.asarray(ok).any()

    # moves after the goal change nothing (the walk ended there)
    short = n < T_MAX
    extra = actions[short].copy()
    extra[np.arange(short.sum()), n[short]] = 0
    r, ln = _replies(world, extra, n[short] + 1)
    ok, _ = pm.plan_outcomes(world, tasks[short], r, ln, stopped[short], T_MAX, jax.random.key(1), ENV)
    assert short.any() and np.asarray(ok).all()

    # unparsable: a map word among the moves; no stop token (cut at the limit); no move at all
    foreign = replies.copy()
    foreign[:, 1] = world.tokenizer.token_id("F")
    no_move = np.full_like(replies, world.layout.pad_id)
    no_move[:, 0] = world.layout.end_of_turn
    for r, ln, st in ((foreign, lens, stopped), (replies, lens, np.zeros(p, bool)), (no_move, np.ones(p), stopped)):
        ok, parsed = pm.plan_outcomes(world, tasks, r, ln, st, T_MAX, jax.random.key(1), ENV)
        assert not np.asarray(ok).any() and not np.asarray(parsed).any()


def test_plan_success_shape_dtype_and_context_check(world, tasks):
    cfg = Qwen3Config(vocab_size=world.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    kw = dict(t_max=T_MAX, n_samples=3, env_params=ENV, max_context=400)
    out = pm.plan_success(world, cfg, params, tasks[:5], jax.random.key(7), **kw)
    assert out.shape == (5, 3) and out.dtype == np.float32 and set(np.unique(out)) <= {0.0, 1.0}
    np.testing.assert_array_equal(out, pm.plan_success(world, cfg, params, tasks[:5], jax.random.key(7), **kw))
    assert pm.plan_success(world, cfg, params, tasks[:5], jax.random.key(7), batch_size=4, **kw).shape == (5, 3)
    with pytest.raises(ValueError, match="max_context"):
        pm.plan_success(world, cfg, params, tasks[:2], jax.random.key(7), **{**kw, "max_context": 64})
    with pytest.raises(ValueError, match="n_samples"):
        pm.plan_success(world, cfg, params, tasks[:2], jax.random.key(7), **{**kw, "n_samples": 0})


def test_plan_sft_rows_train_on_the_whole_plan_only(world, tasks, expert_plans):
    actions, n = expert_plans
    width = pm.plan_sft_width(world, T_MAX)
    toks, mask, lens = pm.plan_sft_rows(world, tasks, T_MAX, actions, n, ENV, width=width)
    prompts, plen = pm.plan_prompts(world, tasks, T_MAX, ENV, width=width)
    names = FrozenLake.ACTION_STRINGS
    for i in range(len(n)):
        np.testing.assert_array_equal(np.asarray(toks[i, :plen[i]]), np.asarray(prompts[i, :plen[i]]))
        target = world.tokenizer.decode(np.asarray(toks[i])[np.asarray(mask[i])])
        assert target == " ".join(names[a] for a in actions[i, :n[i]]) + "<|im_end|>"
        assert int(lens[i]) == int(plen[i]) + n[i] + 1 and np.asarray(mask[i]).sum() == n[i] + 1


@pytest.mark.parametrize("mode", ["full", "budgetmix"])
def test_sft_data_has_plan_rows_at_the_requested_share(world, mode):
    ts = TaskSettings(size=4, t_max=T_MAX, max_context=400)
    bs = BaseSettings(n_episodes=40, plan_fraction=0.25, budget_mode=mode)
    data = sft_data(world, jax.random.key(0), ts, bs)
    assert data["is_plan"].sum() == 10 == bs.n_plan() and data["tokens"].shape == (40, data["width"])
    instr = world.tokenizer.token_id("Plan")
    has_instr = (data["tokens"] == instr).any(axis=1)
    np.testing.assert_array_equal(has_instr, data["is_plan"])
    assert data["mask"].any(axis=1).all()
    texts = [world.tokenizer.decode(r) for r in data["tokens"][~data["is_plan"]]]
    at_full = [f"Turn 1 of {T_MAX} ." in t for t in texts]
    if mode == "full":
        assert all(at_full)
    else:
        assert not all(at_full)


def test_settings_validation():
    with pytest.raises(ValueError, match="budget_mode.*'full', 'budgetmix'.*'mixed'"):
        BaseSettings(budget_mode="mixed")
    for bad in (1.0, -0.1, True, "0.2"):
        with pytest.raises(ValueError, match="plan_fraction"):
            BaseSettings(plan_fraction=bad)
    assert BaseSettings().budget_mode == "full" and BaseSettings(plan_fraction=0.0).n_plan() == 0


def test_codec_without_the_instruction_words_is_refused(world, tmp_path):
    codec = env_codec(world.tokenizer, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=True)
    with pytest.raises(ValueError, match="Plan"):
        pm.instruction_ids(codec)
    # a tokenizer stored for the vocabulary without them is rebuilt by make_toy_world
    build_word_tokenizer(FrozenLake.vocabulary(), tmp_path)
    w = make_toy_world(tmp_path)
    assert w.tokenizer.vocab_size == world.tokenizer.vocab_size and len(pm.instruction_ids(w.codec)) == len(pm.PLAN_WORDS)
