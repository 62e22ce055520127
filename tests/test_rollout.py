"""The jitted multi-turn rollout: budgets, masks, cache reuse, statuses, no retrace, fuzzed outputs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams, sample_tasks
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import build_word_tokenizer
from jaxagent.rollout import (BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED, FAILED, SUCCESS, RolloutConfig, budget_format,
                              chat_layout, env_codec, oracle_process_reward, rollout)
from jaxagent.rollout.jax_loop import rollout_jit
from jaxagent.sampling import Sampler

B, T_MAX = 6, 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = build_word_tokenizer(FrozenLake.vocabulary(), tmp_path_factory.mktemp("tok"))
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=True)
    env = FrozenLake(codec, size=4)
    layout = chat_layout(tok, FrozenLake.system_prompt())
    fmt = budget_format(codec)
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    # Bias the random policy towards the action tokens so that episodes move, fall and succeed.
    act_ids = [tok.encode(a)[0] for a in FrozenLake.ACTION_STRINGS] + [tok.im_end_id]
    params["embed"] = params["embed"].at[jnp.asarray(act_ids)].multiply(40.0)
    rcfg = RolloutConfig(t_max=T_MAX, max_action_tokens=6, max_context=384, sampler=Sampler(temperature=1.0),
                         process_reward_fn=oracle_process_reward)
    env_params = FrozenLakeParams(horizon=T_MAX)
    run = functools.partial(rollout, params, cfg, env, layout, fmt, env_params=env_params, rcfg=rcfg)
    return dict(tok=tok, env=env, layout=layout, fmt=fmt, cfg=cfg, params=params, rcfg=rcfg, run=run,
                env_params=env_params)


def _tasks(seed, n=B):
    return sample_tasks(jax.random.key(seed), n, 4, 0.8)


@pytest.fixture(scope="module")
def base_run(setup):
    budgets = np.array([1, 2, 3, 4, 4, 4])
    return budgets, setup["run"](tasks=_tasks(0), budgets=budgets, key=jax.random.key(1))


def test_turns_within_budget_and_statuses(base_run):
    budgets, r = base_run
    used = np.asarray(r.turns_used)
    assert (used <= budgets).all() and (used >= 1).all()
    active = np.asarray(r.turns.active)
    # active turns form a prefix
    assert all(active[i, :used[i]].all() and not active[i, used[i]:].any() for i in range(B))
    status = np.asarray(r.status)
    assert set(status.tolist()) <= {SUCCESS, FAILED, BUDGET_EXHAUSTED}
    exhausted = status == BUDGET_EXHAUSTED
    assert (used[exhausted] == budgets[exhausted]).all()
    assert (np.asarray(r.episode_return)[exhausted] == 0).all()
    assert (np.asarray(r.success) == (status == SUCCESS)).all()


def test_token_buffer_matches_turn_spans(base_run):
    _, r = base_run
    policy = np.asarray(r.policy_mask)
    span_len = np.asarray(r.turns.span_len)
    assert (policy.sum(1) == span_len.sum(1)).all()
    assert (np.asarray(r.generated_tokens) == span_len.sum(1)).all()
    starts = np.asarray(r.turns.span_start)
    turn_index = np.asarray(r.turn_index)
    for i in range(B):
        for t in range(T_MAX):
            if span_len[i, t]:
                sl = slice(starts[i, t], starts[i, t] + span_len[i, t])
                assert policy[i, sl].all() and (turn_index[i, sl] == t).all()
    assert (policy.sum(1) <= np.asarray(r.length)).all()


def test_sampler_logprobs_equal_teacher_forced(setup, base_run):
    """The whole multi-turn context, re-run in one forward pass, reproduces the sampler's logprobs:
    the cache was reused correctly across turns (no stale or misplaced slots)."""
    _, r = base_run
    logits, _ = jax.jit(qwen3.forward, static_argnums=1)(setup["params"], setup["cfg"], r.tokens)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nxt = jnp.take_along_axis(logp[:, :-1], r.tokens[:, 1:, None], axis=-1)[..., 0]
    mask = np.asarray(r.policy_mask)[:, 1:]
    diff = np.abs(np.asarray(nxt) - np.asarray(r.logprobs)[:, 1:])[mask]
    assert mask.sum() > 10 and diff.max() < 1e-4


def test_budget_text_in_prompt(setup, base_run):
    _, r = base_run
    text = setup["tok"].decode(np.asarray(r.tokens[3, :r.length[3]]).tolist())
    assert "Turn 1 of 4 . 4 turns left ." in text
    if int(r.turns_used[3]) >= 2:
        assert "Turn 2 of 4 . 3 turns left ." in text


def test_hidden_budget(setup):
    before = rollout_jit._cache_size()
    r = setup["run"](tasks=_tasks(0), budgets=np.full(B, 2), key=jax.random.key(0), hide_budget=True)
    assert rollout_jit._cache_size() == before
    text = setup["tok"].decode(np.asarray(r.tokens[0, :r.length[0]]).tolist())
    assert "Turn" not in text and "turns left" not in text and "P" in text


def test_process_reward_is_oracle(setup, base_run):
    _, r = base_run
    env, p = setup["env"], setup["env_params"]
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    want = jax.jit(jax.vmap(lambda s, a, h: env.process_reward(s, a, h, p)))(
        jax.tree.map(flat, r.env_states), flat(r.turns.action), flat(r.turns.remaining))
    active = np.asarray(r.turns.active).reshape(-1)
    got = np.asarray(r.turns.process_reward).reshape(-1)
    assert np.abs(np.asarray(want)[active] - got[active]).max() < 1e-6
    assert (np.asarray(r.turns.process_reward) <= 1e-6).all()


def test_same_seed_same_rollout_and_no_retrace(setup, base_run):
    budgets, r = base_run
    before = rollout_jit._cache_size()
    r2 = setup["run"](tasks=_tasks(0), budgets=budgets, key=jax.random.key(1))
    as_np = lambda x: np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(as_np(a), as_np(b)), r, r2)
    r3 = setup["run"](tasks=_tasks(7), budgets=np.array([4, 3, 2, 1, 1, 2]), key=jax.random.key(5))
    assert rollout_jit._cache_size() == before
    assert (np.asarray(r3.turns_used) <= np.array([4, 3, 2, 1, 1, 2])).all()


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budgets=st.lists(st.integers(1, T_MAX), min_size=B, max_size=B), seed=st.integers(0, 2**16))
def test_property_budget_respected_and_masked_turns_inert(setup, budgets, seed):
    budgets = np.array(budgets)
    r = setup["run"](tasks=_tasks(seed), budgets=budgets, key=jax.random.key(seed))
    used = np.asarray(r.turns_used)
    assert (used <= budgets).all()
    inactive = ~np.asarray(r.turns.active)
    for name in ("reward", "process_reward", "span_len", "remaining"):
        assert (np.asarray(getattr(r.turns, name))[inactive] == 0).all(), name
    assert (np.asarray(r.turns.action)[inactive] == -1).all()
    # the env state stops changing once an episode is over
    pos = np.asarray(r.env_states.pos)
    final = np.asarray(r.final_state.pos)
    for i in range(B):
        if used[i] < T_MAX:
            assert (pos[i, used[i] + 1:] == final[i]).all() if used[i] + 1 < T_MAX else True


@pytest.mark.parametrize("bad", [[0, 1, 1, 1, 1, 1], [-2, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, T_MAX + 1]])
def test_bad_budgets_rejected(setup, bad):
    with pytest.raises(ValueError, match="budget"):
        setup["run"](tasks=_tasks(0), budgets=np.array(bad), key=jax.random.key(0))


def test_task_budget_count_mismatch(setup):
    with pytest.raises(ValueError, match="budgets"):
        setup["run"](tasks=_tasks(0, 3), budgets=np.array([1, 1]), key=jax.random.key(0))


def test_context_exhausted(setup):
    import dataclasses
    sys_len = len(setup["layout"].system)
    from jaxagent.rollout.episode import max_chunk
    one_turn = sys_len + max_chunk(setup["layout"], setup["fmt"], setup["env"], 3) + setup["rcfg"].max_action_tokens
    rcfg = dataclasses.replace(setup["rcfg"], max_context=one_turn + 5, t_max=3)
    r = rollout(setup["params"], setup["cfg"], setup["env"], setup["layout"], setup["fmt"], _tasks(3), np.full(B, 3),
                jax.random.key(0), setup["env_params"], rcfg)
    st_ = np.asarray(r.status)
    assert (np.asarray(r.turns_used) <= 1).all()
    assert ((st_ == CONTEXT_EXHAUSTED) | (st_ == SUCCESS) | (st_ == FAILED)).all()
    assert (st_ == CONTEXT_EXHAUSTED).any()
    assert (np.asarray(r.episode_return)[st_ == CONTEXT_EXHAUSTED] == 0).all()
    assert (np.asarray(r.length) <= rcfg.max_context).all()
    with pytest.raises(ValueError, match="cannot hold even one turn"):
        rollout(setup["params"], setup["cfg"], setup["env"], setup["layout"], setup["fmt"], _tasks(3), np.full(B, 3),
                jax.random.key(0), setup["env_params"], dataclasses.replace(rcfg, max_context=one_turn - 1))


@pytest.mark.parametrize("value", [4, 5, -2, 99])
def test_forced_actions_out_of_range_are_an_error(setup, value, monkeypatch):
    """Forced actions are -1 or an action index in [0, A): anything else is an error, never clipped to a valid
    action silently. Valid ones reach the jitted rollout unchanged (stubbed: only the check is tested)."""
    import dataclasses
    from jaxagent.rollout import jax_loop
    rcfg = dataclasses.replace(setup["rcfg"], allow_forced=True)
    n_act = setup["env"].codec.action_tokens_AxPa.shape[0]
    assert n_act == 4
    forced = np.full((B, T_MAX), -1, np.int32)
    forced[2, 1] = value
    args = (setup["params"], setup["cfg"], setup["env"], setup["layout"], setup["fmt"], _tasks(0), np.full(B, T_MAX),
            jax.random.key(0), setup["env_params"], rcfg)
    with pytest.raises(ValueError, match=rf"in \[0, 4\); got {value} at episode 2, turn 1 \(1 such entries\)"):
        rollout(*args, forced_actions=forced)
    with pytest.raises(ValueError, match="must be integers"):
        rollout(*args, forced_actions=np.full((B, T_MAX), 1.5))
    seen = {}
    monkeypatch.setattr(jax_loop, "rollout_jit", lambda *a, **kw: seen.setdefault("forced", np.asarray(a[6])))
    forced[2, 1] = n_act - 1
    forced[0, 0] = 0
    rollout(*args, forced_actions=forced)
    np.testing.assert_array_equal(seen["forced"], forced)
