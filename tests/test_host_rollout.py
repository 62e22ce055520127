"""The host-env rollout: a tiny random Qwen3 with the real Qwen3 tokenizer runs the SQL, code and BFCL
envs end to end (budgets, masks, spans, sampler logprobs = teacher forcing, no recompiles), and
scripted replies check the turn loop's bookkeeping (gold / reference / ground-truth actions succeed,
the context equals Qwen3's chat template, env exceptions and the context limit are contained)."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.host import base as host
from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.models import chat, qwen3
from jaxagent.rollout import BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED, FAILED, SUCCESS, RolloutConfig
from jaxagent.rollout.host_loop import host_config, host_rollout
from jaxagent.rollout.host_policy import append_jit, decode_jit
from jaxagent.sampling import Sampler, bucket

T_MAX, M, S = 3, 16, 4096
BFCL_IDS = ("multi_turn_base_105", "multi_turn_base_146", "multi_turn_miss_param_105")


def _has_bfcl():
    try:
        import bfcl_eval  # noqa: F401
        return True
    except ImportError:
        return False


ENVS = ["sql", "code", pytest.param("bfcl", marks=pytest.mark.skipif(not _has_bfcl(), reason="needs bfcl-eval"))]


@pytest.fixture(scope="module")
def envs():
    out = {"sql": host.make("sql"), "code": host.make("code")}
    if _has_bfcl():
        out["bfcl"] = host.make("bfcl")
    return out


def _tasks(envs, name):
    env = envs[name]
    return [env.task(i) for i in BFCL_IDS] if name == "bfcl" else env.tasks("all")[:3]


RCFG = RolloutConfig(t_max=T_MAX, max_action_tokens=M, max_context=S, sampler=Sampler(temperature=1.0))


def _host(rcfg, **settings):
    """`rcfg` as a HostRolloutConfig with `settings` (the host run's fields) set."""
    return dataclasses.replace(host_config(rcfg), **settings)

BUDGETS = [3, 2, 1]


@pytest.fixture(scope="module")
def runs(tok, host_model, envs):
    """One random-model rollout per env (3 episodes, budgets 3/2/1), and the compiles they caused."""
    cfg, params = host_model
    n_append, n_decode = append_jit._cache_size(), decode_jit._cache_size()
    out = {name: host_rollout(params, cfg, envs[name], tok, _tasks(envs, name), BUDGETS, jax.random.key(i), RCFG)
           for i, name in enumerate(envs)}
    out["compiles"] = (append_jit._cache_size() - n_append, decode_jit._cache_size() - n_decode)
    return out


def _np(r):
    return jax.tree.map(np.asarray, r)


# ------------------------------------------------------------------------- random model, end to end
@pytest.mark.slow  # shares the session's host_model fixture (~1 min on 2 busy cores)
@pytest.mark.parametrize("name", ENVS)
def test_random_model_runs_within_budgets(runs, name):
    r, trace = runs[name]
    r = _np(r)
    budgets = np.asarray(BUDGETS)
    assert trace.errors == [None] * 3
    used = r.turns_used
    assert (used >= 1).all() and (used <= budgets).all() and (r.budget == budgets).all()
    assert all(r.turns.active[i, :used[i]].all() and not r.turns.active[i, used[i]:].any() for i in range(3))
    assert [len(a) for a in trace.actions] == used.tolist() == [len(i) for i in trace.infos]
    assert [len(o) for o in trace.observations] == (used + 1).tolist()
    if name in ("sql", "code"):
        # random text never holds a query / code block: invalid every turn, the budget runs out
        assert (r.status == BUDGET_EXHAUSTED).all() and (used == budgets).all()
        assert not r.turns.valid.any() and (r.turns.action[r.turns.active] == -1).all()
        assert all(o.startswith("Error:") for obs in trace.observations for o in obs[1:])
    else:
        # a plain message ends BFCL's first user turn without the calls it needs: the task fails
        assert (r.status == FAILED).all() and (used == 1).all()
        assert all(i[0]["failure"].startswith("multi_turn:empty_turn") for i in trace.infos)
    assert (r.episode_return == 0).all() and not r.success.any()
    assert not r.turns.forced.any()
    inactive = ~r.turns.active
    for field in ("reward", "span_len", "remaining", "span_start"):
        assert (getattr(r.turns, field)[inactive] == 0).all(), field
    assert (r.turns.anchor[inactive] == -1).all() and (r.turns.anchor[r.turns.active] >= 0).all()
    assert (r.turns.remaining[:, 0] == budgets).all()


@pytest.mark.slow  # shares the session's host_model fixture (~1 min on 2 busy cores)
@pytest.mark.parametrize("name", ENVS)
def test_policy_mask_and_turn_spans(tok, envs, runs, name):
    r, trace = runs[name]
    r = _np(r)
    assert (r.policy_mask.sum(1) == r.turns.span_len.sum(1)).all()
    assert (r.generated_tokens == r.turns.span_len.sum(1)).all()
    for i in range(3):
        n = r.length[i]
        assert (r.tokens[i, n:] == tok.pad_id).all() and not r.policy_mask[i, n:].any()
        assert (r.turn_index[i, n:] == -1).all()
        system = chat.system_turn(tok, envs[name].system_prompt(trace.tasks[i]))
        assert r.tokens[i, :len(system)].tolist() == system and (r.turn_index[i, :len(system)] == -1).all()
        assert (r.turn_index[i, len(system):n] >= 0).all()
        for t in range(T_MAX):
            start, k = r.turns.span_start[i, t], r.turns.span_len[i, t]
            if k:
                assert r.policy_mask[i, start:start + k].all() and (r.turn_index[i, start:start + k] == t).all()
                assert not r.policy_mask[i, start - 1] and not r.policy_mask[i, start + k]
                reply = r.tokens[i, start:start + k]
                assert r.turns.stopped[i, t] == (reply[-1] in tok.eos_ids)
                # every reply follows the assistant generation prompt (with the empty think block)
                gen = chat.turn_pieces(tok).generation_prompt
                assert r.tokens[i, start - len(gen):start].tolist() == list(gen)
                assert trace.actions[i][t] == tok.decode(
                    [x for x in reply[:k - r.turns.stopped[i, t]] if x < tok.vocab_size])
    # the budget text of each turn is in the prompt
    text = tok.decode([x for x in r.tokens[0, :r.length[0]].tolist() if x < tok.vocab_size])
    assert "Turn 1 of 3. 3 turns left." in text
    if r.turns_used[0] > 1:
        assert "Turn 2 of 3. 2 turns left." in text


_hidden = jax.jit(qwen3.hidden_states, static_argnums=1)


def _teacher_forced(params, cfg, tokens_S, policy_S):
    """log pi(token_p | tokens_<p) at every policy slot p from ONE uncached forward pass."""
    w = bucket(int(np.flatnonzero(policy_S).max()) + 1, 512)
    h, _ = _hidden(params, cfg, jnp.asarray(tokens_S[None, :w]))
    pos = np.flatnonzero(policy_S[:w])
    logits = qwen3.unembed(params, cfg, h[:, pos - 1])[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(logp, jnp.asarray(tokens_S[pos])[:, None], axis=-1)[:, 0]), pos


@pytest.mark.slow  # shares the session's host_model fixture (~1 min on 2 busy cores)
@pytest.mark.parametrize("name", ENVS)
def test_sampler_logprobs_equal_teacher_forced(host_model, runs, name):
    """The whole multi-turn context re-run without a cache reproduces the sampler's log-probs: every
    chunk went into the right cache slots, turn after turn."""
    cfg, params = host_model
    r = _np(runs[name].rollout)
    n = 0
    for i in range(3):
        want, pos = _teacher_forced(params, cfg, r.tokens[i], r.policy_mask[i])
        np.testing.assert_allclose(r.logprobs[i, pos], want, atol=1e-4)
        assert (r.logprobs[i][~r.policy_mask[i]] == 0).all()
        n += len(pos)
    assert n >= 16


@pytest.mark.slow  # shares the session's host_model fixture (~1 min on 2 busy cores)
def test_no_recompile_across_turns_and_calls(tok, host_model, envs, runs):
    cfg, params = host_model
    n_append, n_decode = runs["compiles"]
    # all runs (3 turns, 3 envs, one batch shape): decode compiled once; append once per width
    assert n_decode == 1
    assert 1 <= n_append <= len([w for w in (16, 32, 64, 128, 256, 512, 1024)])
    before = (append_jit._cache_size(), decode_jit._cache_size())
    again = host_rollout(params, cfg, envs["sql"], tok, _tasks(envs, "sql"), BUDGETS, jax.random.key(0), RCFG)
    other = host_rollout(params, cfg, envs["sql"], tok, _tasks(envs, "sql")[::-1], [2, 3, 3], jax.random.key(9),
                         RCFG)
    assert (append_jit._cache_size(), decode_jit._cache_size()) == before
    # same key, same rollout
    jax.tree.map(np.testing.assert_array_equal, _np(again.rollout), _np(runs["sql"].rollout))
    assert again.trace.actions == runs["sql"].trace.actions
    assert (np.asarray(other.rollout.turns_used) == [2, 3, 3]).all()


@pytest.mark.slow  # shares the session's host_model fixture (~1 min on 2 busy cores)
def test_forced_actions_then_model_continues(tok, host_model, envs):
    """A forced reply (e.g. an error prefix) is context, not a policy token, and the model continues
    from a cache that holds it."""
    cfg, params = host_model
    env, tasks = envs["sql"], _tasks(envs, "sql")
    forced = [["```sql\nSELECT name FROM customers\n```"], [None, "<answer>SELECT 1</answer>"], []]
    res = host_rollout(params, cfg, env, tok, tasks, [3, 3, 2], jax.random.key(3), RCFG, forced_actions=forced)
    r, trace = _np(res.rollout), res.trace
    assert r.turns.forced.tolist() == [[True, False, False], [False, True, False], [False, False, False]]
    assert trace.actions[0][0] == forced[0][0] and trace.infos[0][0]["valid"] and trace.infos[0][0]["kind"] == "execute"
    assert r.status[1] == FAILED and r.turns_used[1] == 2  # the forced wrong answer ended it
    s0, k0 = r.turns.span_start[0, 0], r.turns.span_len[0, 0]
    assert not r.policy_mask[0, s0:s0 + k0].any() and (r.logprobs[0, s0:s0 + k0] == 0).all()
    assert r.tokens[0, s0 + k0 - 1] == tok.im_end_id and (r.turn_index[0, s0:s0 + k0] == 0).all()
    assert r.policy_mask[0].sum() == r.turns.span_len[0, 1:].sum() == r.generated_tokens[0]
    want, pos = _teacher_forced(params, cfg, r.tokens[0], r.policy_mask[0])
    assert pos.min() > s0 + k0
    np.testing.assert_allclose(r.logprobs[0, pos], want, atol=1e-4)


# ------------------------------------------------------------------------- scripted replies
def _scripted(per_episode):
    """generate_fn replaying per_episode[b][t]."""
    def fn(t, active, contexts):
        assert len(contexts) == len(per_episode)
        return [per_episode[b][t] if active[b] else None for b in range(len(per_episode))]
    return fn


def _template_ids(tok, env, task, trace, b, *, hide_budget, budget):
    """The episode as Qwen3 chat messages rendered by `chat.format_chat` (whole text encoded once)."""
    msgs = [{"role": "system", "content": env.system_prompt(task)}]
    for t, action in enumerate(trace.actions[b]):
        obs = trace.observations[b][t]
        role = "user" if t == 0 else trace.infos[b][t - 1].get("obs_role", "user")
        head = "" if hide_budget else f"Turn {t + 1} of {budget}. {budget - t} turns left.\n"
        if role == "tool":
            assert hide_budget
            msgs += [{"role": "tool", "content": c}
                     for c in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", obs, re.DOTALL)]
        else:
            msgs.append({"role": "user", "content": head + obs})
        msgs.append({"role": "assistant", "content": action})
    ids, _ = chat.format_chat(tok, msgs, add_generation_prompt=False, keep_past_thinking=True)
    return ids[:-1]  # the rollout ends on the last reply's <|im_end|>, without the "\n" after it


def test_scripted_sql_gold_and_bookkeeping(tok, envs):
    env = envs["sql"]
    tasks = env.tasks("all")[:4]
    explore = "Let me look first.\n```sql\nSELECT 1\n```"
    actions = [[explore, f"<answer>{tasks[0].gold}</answer>"],       # success in 2 turns
               [f"<answer>{tasks[1].gold}</answer>"],                 # success in 1 turn
               ["<answer>SELECT 42</answer>"],                        # wrong answer: failed
               [explore, explore]]                                    # budget 2 runs out
    rcfg = dataclasses.replace(RCFG, max_action_tokens=128)
    res = host_rollout(None, None, env, tok, tasks, [3, 3, 3, 2], jax.random.key(0), _host(rcfg, workers=2),
                       generate_fn=_scripted(actions))
    r, trace = _np(res.rollout), res.trace
    assert r.status.tolist() == [SUCCESS, SUCCESS, FAILED, BUDGET_EXHAUSTED]
    assert r.success.tolist() == [True, True, False, False]
    assert r.turns_used.tolist() == [2, 1, 1, 2]
    assert r.episode_return.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert r.turns.reward[0].tolist() == [0.0, 1.0, 0.0] and r.turns.valid[0, :2].all()
    assert trace.actions == actions and trace.dones[0] == [False, True]
    # scripted replies are the acting policy (SFT targets, as jax_loop's expert mode): forced, in the mask
    assert (r.turns.forced == r.turns.active).all() and (r.logprobs == 0).all()
    assert (r.policy_mask.sum(1) == r.turns.span_len.sum(1)).all() and r.turns.stopped[r.turns.active].all()
    # equal action texts share an action id; the anchors are the env's
    assert r.turns.action[3, 0] == r.turns.action[3, 1] == r.turns.action[0, 0] != r.turns.action[0, 1]
    assert r.turns.anchor[0, 0] == trace.infos[0][0]["anchor"] != r.turns.anchor[0, 1]
    for b in range(4):
        want = _template_ids(tok, env, tasks[b], trace, b, hide_budget=False, budget=[3, 3, 3, 2][b])
        assert r.tokens[b, :r.length[b]].tolist() == want, b
    assert len(trace.trajectories("gold")) == 4 and trace.trajectories("gold")[0]["policy"] == "gold"


def test_scripted_code_reference_passes(tok, envs):
    env = envs["code"]
    tasks = env.tasks("all")[:2]
    actions = [["no code here", f"```python\n{tasks[0].reference}```"], [f"```python\n{tasks[1].reference}```"]]
    rcfg = dataclasses.replace(RCFG, max_action_tokens=1024)
    steps = []
    rcfg = _host(rcfg, process_reward_fn=lambda e, s, a, rem: steps.append(rem) or e.step_quality(s, a))
    res = host_rollout(None, None, env, tok, tasks, [3, 1], jax.random.key(0), rcfg, generate_fn=_scripted(actions))
    r = _np(res.rollout)
    assert r.status.tolist() == [SUCCESS, SUCCESS] and r.turns_used.tolist() == [2, 1]
    assert r.turns.valid.tolist() == [[False, True, False], [True, False, False]]
    assert r.turns.process_reward.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # unit-test pass rate
    assert sorted(steps) == [1, 2, 3] and res.trace.observations[0][2].startswith("All ")


@pytest.mark.skipif(not _has_bfcl(), reason="needs bfcl-eval")
def test_scripted_bfcl_ground_truth_solves(tok, envs):
    env = envs["bfcl"]
    tasks = [env.task(i) for i in BFCL_IDS[:2]]
    actions = [env.ground_truth_actions(t) for t in tasks]
    upper = [env.upper_bound_turns(t) for t in tasks]
    t_max = max(upper)
    rcfg = RolloutConfig(t_max=t_max, max_action_tokens=512, max_context=8192)
    res = host_rollout(None, None, env, tok, tasks, upper, jax.random.key(0), _host(rcfg, hide_budget=True),
                       generate_fn=_scripted(actions))
    r, trace = _np(res.rollout), res.trace
    assert r.status.tolist() == [SUCCESS, SUCCESS] and r.success.all()
    assert r.turns_used.tolist() == upper and r.episode_return.tolist() == [1.0, 1.0]
    assert all(trace.final_states[b].success for b in range(2))
    # tool results came back as tool turns; the context equals the template's, tool turns included
    assert any(i["obs_role"] == "tool" for i in trace.infos[0])
    for b in range(2):
        want = _template_ids(tok, env, tasks[b], trace, b, hide_budget=True, budget=upper[b])
        assert r.tokens[b, :r.length[b]].tolist() == want, b
    text = tok.decode(r.tokens[0, :r.length[0]].tolist())
    assert "Turn " not in text and "<|im_start|>user\n<tool_response>\n" in text
    # a budget one short of the reference solution cannot finish it
    short = host_rollout(None, None, env, tok, tasks[:1], [upper[0] - 1], jax.random.key(0), rcfg,
                         generate_fn=_scripted(actions[:1]))
    assert int(short.rollout.status[0]) == BUDGET_EXHAUSTED and float(short.rollout.episode_return[0]) == 0.0


class _FlakySQL(SQLEnv):
    """Raises in reset for one task and in the second step of another; answers a third with a
    malformed observation (None instead of text)."""

    def __init__(self, bad_reset, bad_step, bad_obs):
        super().__init__()
        self.bad_reset, self.bad_step, self.bad_obs = bad_reset, bad_step, bad_obs

    def reset(self, seed, task):
        if task.id == self.bad_reset:
            raise OSError("database vanished")
        return super().reset(seed, task)

    def step(self, state, action_text):
        if state.task.id == self.bad_step and state.turn == 1:
            raise RuntimeError("boom")
        state, obs, reward, done, info = super().step(state, action_text)
        return state, None if state.task.id == self.bad_obs else obs, reward, done, info


def test_env_exceptions_fail_only_their_episode(tok, envs):
    tasks = envs["sql"].tasks("all")[:4]
    env = _FlakySQL(bad_reset=tasks[0].id, bad_step=tasks[1].id, bad_obs=tasks[3].id)
    acts = [["x"] * 3, ["x"] * 3, ["x", f"<answer>{tasks[2].gold}</answer>"], ["x"] * 3]
    rcfg = dataclasses.replace(RCFG, max_action_tokens=128)
    res = host_rollout(None, None, env, tok, tasks, [3, 3, 3, 3], jax.random.key(0), rcfg,
                       generate_fn=_scripted(acts))
    r, trace = _np(res.rollout), res.trace
    assert r.status.tolist() == [FAILED, FAILED, SUCCESS, FAILED] and r.turns_used.tolist() == [0, 2, 2, 1]
    assert trace.errors[0] == "reset: OSError: database vanished" and r.length[0] == 0
    assert trace.errors[1] == "step 1: RuntimeError: boom" and trace.infos[1][1]["env_exception"]
    assert trace.errors[3] == "step 0: TypeError: an observation must be a str, got NoneType"
    assert trace.errors[2] is None and r.episode_return.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert not r.turns.valid[1, 1] and r.turns.active[1, 1] and trace.final_states[0] is None
    assert (r.turns.anchor[[1, 3], [1, 0]] == -1).all()


def test_context_exhausted(tok, envs):
    env = envs["sql"]
    tasks = env.tasks("all")[:2]
    run = lambda s: host_rollout(None, None, env, tok, tasks, [3, 3], jax.random.key(0),
                                 dataclasses.replace(RCFG, max_context=s), generate_fn=_scripted([["x"] * 3] * 2))
    first_chunk = np.asarray(run(S).rollout.turns.span_start[:, 0])  # system + first user turn + prompt
    # room for the first turn only: the second chunk (>= 20 tokens) + a full reply does not fit
    r = _np(run(int(first_chunk.max()) + M + 20).rollout)
    assert r.status.tolist() == [CONTEXT_EXHAUSTED] * 2 and r.turns_used.tolist() == [1, 1]
    assert (r.episode_return == 0).all() and (r.length <= int(first_chunk.max()) + M + 20).all()
    # one episode fits its first turn, the other does not (0 turns); none fits: a clear error
    r = _np(run(int(first_chunk.min()) + M).rollout)
    if first_chunk[0] != first_chunk[1]:
        assert sorted(r.turns_used.tolist()) == [0, 1] and (r.status == CONTEXT_EXHAUSTED).all()
    with pytest.raises(ValueError, match="cannot hold even one turn"):
        run(int(first_chunk.min()) + M - 1)


def test_thinking_mode_template(tok, envs):
    env = envs["sql"]
    task = env.tasks("all")[0]
    act = f"<think>\nThe customers table has a country column.\n</think>\n\n<answer>{task.gold}</answer>"
    rcfg = dataclasses.replace(RCFG, max_action_tokens=128)
    res = host_rollout(None, None, env, tok, [task], [2], jax.random.key(0),
                       _host(rcfg, enable_thinking=True, hide_budget=True), generate_fn=_scripted([[act]]))
    r, trace = _np(res.rollout), res.trace
    assert r.status.tolist() == [SUCCESS]
    msgs = [{"role": "system", "content": env.system_prompt(task)},
            {"role": "user", "content": trace.observations[0][0]}, {"role": "assistant", "content": act}]
    ids, _ = chat.format_chat(tok, msgs, add_generation_prompt=False, enable_thinking=True, keep_past_thinking=True)
    assert r.tokens[0, :r.length[0]].tolist() == ids[:-1]


def test_hidden_budget(tok, envs):
    env = envs["sql"]
    res = host_rollout(None, None, env, tok, env.tasks("all")[:1], [2], jax.random.key(0),
                       _host(RCFG, hide_budget=True), generate_fn=_scripted([["x", "y"]]))
    r = _np(res.rollout)
    text = tok.decode(r.tokens[0, :r.length[0]].tolist())
    assert r.turns_used[0] == 2 and "turns left" not in text and "Error: no SQL found" in text


def test_bad_inputs(tok, envs):
    env, tasks = envs["sql"], envs["sql"].tasks("all")[:2]
    run = lambda budgets, **kw: host_rollout(None, None, kw.pop("env", env), tok, tasks, budgets, jax.random.key(0),
                                             kw.pop("rcfg", RCFG), generate_fn=_scripted([["x"] * 3] * 2), **kw)
    for bad in ([0, 1], [-1, 1], [1, T_MAX + 1]):
        with pytest.raises(ValueError, match="budget"):
            run(bad)
    with pytest.raises(ValueError, match="one budget per task"):
        run([1, 1, 1])
    with pytest.raises(ValueError, match="workers"):
        run([1, 1], rcfg=_host(RCFG, workers=0))
    with pytest.raises(ValueError, match="jittable"):
        run([1, 1], env=type("J", (), {"jittable": True})())
    with pytest.raises(ValueError, match="host envs"):
        run([1, 1], rcfg=dataclasses.replace(RCFG, process_reward_fn=lambda *a: 0.0))
    with pytest.raises(ValueError, match="allow_forced"):  # a JAX-loop field the host loop would ignore
        run([1, 1], rcfg=dataclasses.replace(RCFG, allow_forced=True))


def test_compacted_decoding_levels():
    """The host policy's `compact_rows`: a quarter of the rows, then a sixteenth, while at least 2, on one device
    only (a mesh's batch shards would cross the gathered rows), none below 8 rows; what it gives `decode` accepts."""
    from jaxagent import sharding
    from jaxagent.rollout.host_policy import compact_rows
    assert compact_rows(64, None) == (16, 4)
    assert compact_rows(128, None) == (32, 8, 2)
    assert compact_rows(8, None) == (2,) and compact_rows(7, None) is None and compact_rows(2, None) is None
    assert compact_rows(64, sharding.make_mesh(2, 1, 1, devices=jax.devices()[:2])) is None
    from jaxagent.rollout.host_loop import host_config
    assert host_config(RCFG).compact_decode  # on by default, also for a config converted from the JAX loop's
