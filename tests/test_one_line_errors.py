"""Bad input a researcher tries in the first hours gets one line naming the argument (not a deep traceback, not a
silent run): each case below once failed with an error from deep inside numpy / JAX, or ran silently."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax import EnvStep, Obs, phrase_table, render
from jaxagent.models import Qwen3Config, forward, init, load, save
from jaxagent.rollout import RolloutConfig, env_text, rollout
from jaxagent.sampling import Sampler, generate

CFG = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8)
TOKENS = jnp.ones((1, 3), jnp.int32)


@pytest.fixture(scope="module")
def params():
    return init(CFG, jax.random.key(0))


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


def test_forward_refuses_a_list_int_weights_and_missing_keys(params):
    with pytest.raises(TypeError) as e:
        forward(params, CFG, [[1, 2, 3]])
    assert one_line(e).startswith("qwen3.forward: tokens_BxT must be an array")
    with pytest.raises(TypeError) as e:
        forward(jax.tree.map(lambda x: x.astype(jnp.int16), params), CFG, TOKENS)
    assert "the weights must be floating-point" in one_line(e) and "params['embed'] is int16[32, 16]" in one_line(e)
    with pytest.raises(TypeError) as e:
        forward({k: v for k, v in params.items() if k != "embed"}, CFG, TOKENS)
    assert one_line(e).startswith("qwen3.forward: params lacks ['embed'] (it has ['layers', 'norm'])")


def test_forward_refuses_concrete_ids_outside_the_vocabulary_and_clips_traced_ones(params):
    for bad, shown in ((40, "[40, 40]"), (-1, "[-1, -1]")):
        with pytest.raises(ValueError) as e:
            forward(params, CFG, jnp.full((1, 3), bad, jnp.int32))
        assert f"tokens_BxT holds token ids in {shown} but the vocabulary has 32" in one_line(e)
    with pytest.raises(ValueError, match="holds token ids in"):
        forward(params, CFG, np.full((1, 3), 32, np.int32))       # numpy input is concrete too
    # under jit no value exists to check: the ids are clipped (the documented behaviour), as id V - 1
    traced = jax.jit(lambda t: forward(params, CFG, t)[0])(jnp.full((1, 3), 40, jnp.int32))
    np.testing.assert_allclose(traced, forward(params, CFG, jnp.full((1, 3), 31, jnp.int32))[0], atol=1e-6)


def test_generate_names_its_options(params):
    key = jax.random.key(0)
    with pytest.raises(TypeError) as e:
        generate(params, CFG, TOKENS, key, max_new_tokens=2, sampler="greedy")
    assert one_line(e).startswith("generate: sampler must be a jaxagent.sampling.Sampler")
    with pytest.raises(TypeError) as e:
        generate(params, CFG, TOKENS, key, max_new_tokens=2, stop_ids=2)
    assert one_line(e) == "generate: stop_ids must be a sequence of token ids, e.g. (2,) or tok.eos_ids; got int 2"
    with pytest.raises(TypeError) as e:
        generate(jax.tree.map(lambda x: x.astype(jnp.int16), params), CFG, TOKENS, key, max_new_tokens=2)
    assert one_line(e).startswith("generate: the weights must be floating-point")
    # what is accepted still runs: a numpy array of stop ids, a greedy Sampler
    out = generate(params, CFG, TOKENS, key, max_new_tokens=2, stop_ids=np.asarray([5]), sampler=Sampler(greedy=True))
    assert out.tokens.shape == (1, 8)


def test_load_names_a_bad_dtype(params, tmp_path):
    save(tmp_path, CFG, params)
    with pytest.raises(TypeError) as e:
        load(tmp_path, dtype="bf16")
    assert one_line(e).startswith("weights.load: dtype 'bf16' is not a dtype; use jnp.bfloat16")
    with pytest.raises(TypeError, match="weights.load: dtype must be a floating dtype"):
        load(tmp_path, dtype=jnp.int8)
    assert load(tmp_path, dtype="bfloat16")[1]["embed"].dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- env mistakes, named while tracing
WORDS, ACTIONS = ("ping", "."), ("<answer>a</answer>", "<answer>b</answer>")


class _Ping:
    jittable = True

    def __init__(self, codec):
        self.codec = codec
        self.ids, self.lens = phrase_table(codec, ("ping .",))

    def reset(self, key, task, env_params):
        return jnp.asarray(0, jnp.int32), Obs(*render(self.codec, self.ids[0], self.lens[0]))

    def step(self, state, action_tokens_M, action_len, env_params):
        info = dict(valid=jnp.asarray(True), action=jnp.asarray(0, jnp.int32), success=jnp.asarray(False),
                    anchor=state)
        return EnvStep(state + 1, self.reset(None, None, None)[1], jnp.asarray(0.0), jnp.asarray(False), info)

    def anchor(self, state):
        return state


class _GymnaxOrder(_Ping):
    def reset(self, key, task, env_params):
        state, obs = super().reset(key, task, env_params)
        return obs, state


class _DoneOfTwo(_Ping):
    def step(self, state, action_tokens_M, action_len, env_params):
        return super().step(state, action_tokens_M, action_len, env_params)._replace(done=jnp.zeros((2,), bool))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    text = env_text(WORDS, ACTIONS, "say ping", tokenizer_dir=tmp_path_factory.mktemp("tok"))
    cfg = Qwen3Config(vocab_size=text.tokenizer.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return text, cfg, init(cfg, jax.random.key(0))


def _roll(world, env_cls, budgets):
    text, cfg, params = world
    return rollout(params, cfg, env_cls(text.codec), text.layout, text.fmt, jnp.zeros((2,), jnp.int32), budgets,
                   jax.random.key(0), None, RolloutConfig(t_max=2, max_action_tokens=4, max_context=96))


def test_env_mistakes_are_one_line(world):
    with pytest.raises(TypeError) as e:
        _roll(world, _GymnaxOrder, np.asarray([2, 2]))
    assert one_line(e) == ("rollout: _GymnaxOrder.reset returns (Obs, state), gymnax's order; jaxagent's reset returns "
                           "(state, Obs) (envs.jax.gymnax_env.GymnaxEnv wraps a gymnax env)")
    with pytest.raises(ValueError) as e:
        _roll(world, _DoneOfTwo, np.asarray([2, 2]))
    assert one_line(e) == ("rollout: _DoneOfTwo.step's done must be a bool scalar for one episode (the rollout vmaps "
                           "the env); got bool[2]")
    with pytest.raises(ValueError) as e:
        _roll(world, _Ping, np.asarray([2.0, 1.0]))
    assert one_line(e).startswith("budgets must be integers (turns per episode), got dtype float64")


def test_tiny_checkpoint_loads_back(tmp_path):
    from jaxagent.models import Tokenizer, tiny_checkpoint
    cfg = tiny_checkpoint(tmp_path, ("ping", "pong"), hidden_size=16)
    loaded_cfg, loaded = load(tmp_path)
    assert loaded_cfg == cfg and (cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers) == (16, 4, 1)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.vocab_size == cfg.vocab_size and tok.decode(tok.encode("ping pong")) == "ping pong"
    assert forward(loaded, cfg, jnp.asarray([tok.encode("ping")], jnp.int32))[0].shape == (1, 1, cfg.vocab_size)
    with pytest.raises(ValueError, match="tiny_checkpoint: hidden_size must be a positive multiple of 4, got 6"):
        tiny_checkpoint(tmp_path, ("ping",), hidden_size=6)
