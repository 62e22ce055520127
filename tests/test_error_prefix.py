"""BFCL error-prefix evaluation: prefixes ending in a tool-call error, one continuation per policy."""
import json

import jax
import pytest

from jaxagent.eval import error_prefix
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
from jaxagent.rollout import RolloutConfig
from jaxagent.sampling import Sampler

bfcl_env = pytest.importorskip("jaxagent.envs.host.bfcl_env")
pytest.importorskip("bfcl_eval")

BAD_CALL = '<tool_call>\n{"name": "no_such_function", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def setup():
    from jaxagent.envs.host import base as host
    env = host.make("bfcl")
    task = env.task("multi_turn_base_105")
    gt = env.ground_truth_actions(task)
    traj = {"task": task, "actions": [BAD_CALL], "infos": [], "policy": "rl"}
    state, _ = env.reset(0, task)
    _, _, _, done, info = env.step(state, BAD_CALL)
    traj["infos"], traj["dones"] = [info], [done]
    prefixes = error_prefix.collect_error_prefixes([traj], t_max=4)
    return env, task, gt, prefixes


def test_error_prefix_is_collected(setup):
    _, _, _, prefixes = setup
    assert len(prefixes) == 1 and prefixes[0].actions == (BAD_CALL,) and prefixes[0].step == 0


def test_ground_truth_continuation_corrects_and_bad_one_does_not(setup):
    env, _, gt, prefixes = setup
    rates = error_prefix.correction_rate(env, prefixes, {"oracle": [gt[0]], "bad": [BAD_CALL]})
    assert rates["oracle"]["rate"] == 1.0 and rates["bad"]["rate"] == 0.0


@pytest.mark.slow
def test_model_continuations_end_to_end(setup):
    env, _, _, prefixes = setup
    tok = Tokenizer.from_dir(qwen3_tokenizer_dir())
    cfg = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    pa, pb = qwen3.init(cfg, jax.random.key(0)), qwen3.init(cfg, jax.random.key(1))
    rcfg = RolloutConfig(t_max=3, max_action_tokens=12, max_context=4096, sampler=Sampler(temperature=1.0))
    out = error_prefix.correction_rates(env, tok, prefixes * 2, {"a": (pa, cfg), "b": (pb, cfg)},
                                        jax.random.key(0), rcfg)
    for name in ("a", "b"):
        assert out[name]["n"] == 2 and 0.0 <= out[name]["rate"] <= 1.0
        assert len(out[name]["actions"]) == 2 and all(isinstance(a, str) for a in out[name]["actions"])
        # the continuation is the model's reply, not the forced prefix action
        assert all(a != BAD_CALL for a in out[name]["actions"])
    json.dumps({k: v["rate"] for k, v in out.items()})
