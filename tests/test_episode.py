"""Tests for jaxagent.rollout.episode: the one budget text, the status rules on numpy and jax arrays, the
settings shared by both loops."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax import budgets
from jaxagent.envs.jax.base import EnvStep, Obs
from jaxagent.rollout import episode, types
from jaxagent.rollout.host_loop import HostRolloutConfig, host_config
from jaxagent.rollout.jax_loop import RolloutConfig

R, S, F, BE, CE = types.RUNNING, types.SUCCESS, types.FAILED, types.BUDGET_EXHAUSTED, types.CONTEXT_EXHAUSTED


def test_one_budget_template():
    assert budgets.budget_text(1, 5) == "Turn 2 of 5. 4 turns left."
    # the jittable envs' word template is the same text split into words
    assert " ".join(budgets.DEFAULT_TEMPLATE).replace(" .", ".") == budgets.BUDGET_TEMPLATE
    assert budgets.DEFAULT_TEMPLATE == ("Turn", "{turn}", "of", "{budget}", ".", "{remaining}", "turns", "left", ".")


@pytest.mark.parametrize("xp", [np, jnp])
def test_status_rules(xp):
    status = xp.asarray([R, R, R, S, R], np.int32)
    budget = xp.asarray([3, 1, 3, 3, 2], np.int32)
    fits = xp.asarray([True, True, False, True, True])
    new, active = episode.turn_start(status, 1, budget, fits)
    assert type(new) is type(status) and new.dtype == np.int32
    # episode 1 has no budget left at turn 1 (stays running, inactive); 2 does not fit; 3 already ended
    np.testing.assert_array_equal(np.asarray(new), [R, R, CE, S, R])
    np.testing.assert_array_equal(np.asarray(active), [True, False, False, False, True])
    done = xp.asarray([True, False, False, False, False])
    success = xp.asarray([False, False, False, False, False])
    after = episode.after_step(new, active, done, success, episode.out_of_budget(1, budget))
    np.testing.assert_array_equal(np.asarray(after), [F, R, CE, S, BE])
    np.testing.assert_array_equal(np.asarray(episode.finished(after)), [True, False, False, True, False])
    rew = xp.asarray(np.arange(10, dtype=np.float32).reshape(5, 2))
    np.testing.assert_array_equal(np.asarray(episode.episode_return(after, rew)), [1, 0, 0, 13, 0])


def test_host_config_rejects_jax_fields():
    base = RolloutConfig(t_max=3, max_action_tokens=8, max_context=64)
    assert host_config(base) == HostRolloutConfig(t_max=3, max_action_tokens=8, max_context=64)
    for field, value in (("allow_forced", True), ("kv_windows", 2), ("expert_fn", lambda *a: 0)):
        with pytest.raises(ValueError, match=field):
            host_config(dataclasses.replace(base, **{field: value}))
    with pytest.raises(ValueError, match="t_max"):
        HostRolloutConfig(t_max=0)


# ----------------------------------------------------------------------------- truncated replies
def test_reply_closed_rule_numpy_and_jax():
    end = 7
    reply = np.asarray([[3, 7, 0, 0], [3, 4, 5, 6], [7, 0, 0, 0], [3, 3, 3, 3]], np.int32)
    length = np.asarray([2, 4, 0, 3], np.int32)
    want = [True, False, False, False]  # closed; hit the limit; empty; ends on another token
    for xp in (np, jnp):
        got = episode.reply_closed(xp.asarray(reply), xp.asarray(length), end)
        assert type(got) is type(xp.asarray(length)) and np.asarray(got).tolist() == want
    assert bool(episode.reply_closed(reply[0], 2, end)) and not bool(episode.reply_closed(reply[1], 4, end))


OBS_WORDS, REPLY_WORD, SYSTEM = ("look", "here"), "go", "reply go"


class _EchoEnv:
    """Jittable: every observation is "look here", nothing ends an episode."""

    jittable = True

    def __init__(self, codec):
        self.codec = codec
        self._ids = jnp.asarray(codec.word_ids(OBS_WORDS))

    def _obs(self):
        from jaxagent.envs.jax.text_codec import render
        return Obs(*render(self.codec, self._ids, len(OBS_WORDS)))

    def reset(self, key, task, env_params):
        return jnp.asarray(0, jnp.int32), self._obs()

    def step(self, state, action_tokens_M, action_len, env_params):
        info = dict(valid=jnp.asarray(True), action=jnp.asarray(0, jnp.int32), success=jnp.asarray(False),
                    anchor=state)
        return EnvStep(state + 1, self._obs(), jnp.asarray(0.0, jnp.float32), jnp.asarray(False), info)

    def anchor(self, state):
        return state


class _EchoHostEnv:
    """The same env on the host."""

    jittable = False

    def system_prompt(self, task):
        return SYSTEM

    def reset(self, seed, task):
        return 0, " ".join(OBS_WORDS)

    def step(self, state, action_text):
        return state + 1, " ".join(OBS_WORDS), 0.0, False, {"valid": True, "success": False, "anchor": state}


def _always_says(cfg, params, token_id):
    """Params whose greedy reply is `token_id` after any context: the blocks add nothing to the residual
    stream, and every embedding row is one vector, `token_id`'s three times as long."""
    layers = {i: {**p, "attn": {**p["attn"], "o_proj": jnp.zeros_like(p["attn"]["o_proj"])},
                  "mlp": {**p["mlp"], "down_proj": jnp.zeros_like(p["mlp"]["down_proj"])}}
              for i, p in params["layers"].items()}
    embed = jnp.ones_like(params["embed"]).at[token_id].multiply(3.0)
    return {**params, "layers": layers, "embed": embed}


def test_both_loops_close_a_truncated_reply_alike(tmp_path):
    """A reply that hits max_action_tokens: the JAX loop and the host loop build the same context, token for
    token (the reply, then <|im_end|> at the head of the next turn's chunk, outside the policy mask)."""
    import jax
    from jaxagent.models import qwen3
    from jaxagent.models.config import Qwen3Config
    from jaxagent.rollout import env_text, rollout
    from jaxagent.rollout.host_loop import host_rollout
    from jaxagent.sampling import GREEDY

    text = env_text(OBS_WORDS + (REPLY_WORD,), ("stop",), SYSTEM, tokenizer_dir=tmp_path)
    tok = text.tokenizer
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    go = tok.encode(REPLY_WORD)[0]
    params = _always_says(cfg, qwen3.init(cfg, jax.random.key(0)), go)
    m = 4
    rcfg = RolloutConfig(t_max=2, max_action_tokens=m, max_context=96, sampler=GREEDY)
    jr = rollout(params, cfg, _EchoEnv(text.codec), text.layout, text.fmt, jnp.zeros((1,), jnp.int32),
                 np.asarray([2]), jax.random.key(1), None, rcfg, hide_budget=True)
    hr = host_rollout(params, cfg, _EchoHostEnv(), tok, [0], [2], jax.random.key(1),
                      dataclasses.replace(host_config(rcfg), hide_budget=True)).rollout
    n = int(jr.length[0])
    assert int(hr.length[0]) == n
    jt, ht = np.asarray(jr.tokens[0, :n]).tolist(), np.asarray(hr.tokens[0, :n]).tolist()
    assert jt == ht
    # both replies were truncated: m "go" tokens each, not stopped; the first one closed by the next chunk
    assert np.asarray(jr.turns.stopped).tolist() == np.asarray(hr.turns.stopped).tolist() == [[False, False]]
    start = int(jr.turns.span_start[0, 0])
    assert jt[start:start + m + 1] == [go] * m + [tok.im_end_id]
    assert tok.decode(jt[start + m:start + m + 4]) == "<|im_end|>\n<|im_start|>user"
    # the closing token is context of turn 1, not policy
    for r in (jr, hr):
        assert not bool(r.policy_mask[0, start + m]) and int(r.turn_index[0, start + m]) == 1
        assert np.asarray(r.policy_mask[0, :n]).sum() == 2 * m
    np.testing.assert_array_equal(np.asarray(jr.policy_mask[0, :n]), np.asarray(hr.policy_mask[0, :n]))
    np.testing.assert_array_equal(np.asarray(jr.turn_index[0, :n]), np.asarray(hr.turn_index[0, :n]))
    # the episode ends on its second truncated reply: nothing is appended after it
    assert jt[-m:] == [go] * m
