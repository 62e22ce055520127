"""What a new jittable env needs and what the library derives: the Env contract is checked with errors that name
the missing piece, the budget words come with the codec, O_max is read from reset. The worked example is
docs/custom_env.md (run by tests/test_docs_snippets.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax import EnvStep, FrozenLake, Obs, check_env, phrase_table, render
from jaxagent.envs.jax import budgets
from jaxagent.models import Qwen3Config, build_word_tokenizer, init
from jaxagent.rollout import RolloutConfig, env_codec, env_text, rollout
from jaxagent.rollout.episode import max_chunk, observation_size

WORDS = ("ping", "pong", ".")
ACTIONS = ("<answer>a</answer>", "<answer>b</answer>")


class _Ping:
    """A minimal env: one observation, nothing ends. Subclasses break one rule each."""

    jittable = True

    def __init__(self, codec):
        self.codec = codec
        self.ids, self.lens = phrase_table(codec, ("ping .", "pong ."))

    def reset(self, key, task, env_params):
        return jnp.asarray(0, jnp.int32), Obs(*render(self.codec, self.ids[0], self.lens[0]))

    def info(self, state):
        return dict(valid=jnp.asarray(True), action=jnp.asarray(0, jnp.int32), success=jnp.asarray(False),
                    anchor=state)

    def step(self, state, action_tokens_M, action_len, env_params):
        obs = Obs(*render(self.codec, self.ids[1], self.lens[1]))
        return EnvStep(state + 1, obs, jnp.asarray(0.0), jnp.asarray(False), self.info(state))

    def anchor(self, state):
        return state


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return env_text(WORDS, ACTIONS, "say ping", tokenizer_dir=tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model(text):
    cfg = Qwen3Config(vocab_size=text.tokenizer.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return cfg, init(cfg, jax.random.key(0))


def _run(text, model, env):
    cfg, params = model
    return rollout(params, cfg, env, text.layout, text.fmt, jnp.zeros((2,), jnp.int32), np.asarray([2, 2]),
                   jax.random.key(0), None, RolloutConfig(t_max=2, max_action_tokens=4, max_context=96))


def test_the_library_supplies_the_budget_words(text, tmp_path):
    # the env listed only its own words; the codec and the tokenizer also hold the budget text's
    for w in budgets.vocabulary():
        assert w in text.codec.words and text.tokenizer.encode(w) != [text.tokenizer.encode("<unk>")[0]]
    assert text.codec.words[:len(WORDS)] == WORDS and text.fmt.digit_ids == tuple(text.codec.word_ids(budgets.DIGITS))
    # FrozenLake, whose vocabulary has them already, keeps its codec word for word
    fl_tok = build_word_tokenizer(FrozenLake.vocabulary(), tmp_path)
    fl = env_codec(fl_tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=True)
    assert fl.words == FrozenLake.vocabulary()


def test_observation_size_is_read_from_reset(text):
    env = _Ping(text.codec)
    assert not hasattr(env, "obs_size") and observation_size(env, jnp.zeros((3,), jnp.int32), None) == 2
    wide = max_chunk(text.layout, text.fmt, env, 2, obs_size=2)
    assert wide == text.layout.open_width + text.fmt.words_for(2) + 2 + len(text.layout.close)


def test_missing_pieces_are_named(text, model):
    class NoCodec(_Ping):
        def __init__(self, codec):
            super().__init__(codec)
            del self.codec

    class Host(_Ping):
        jittable = False

    class NoAnchor(_Ping):
        anchor = None

    with pytest.raises(TypeError, match=r"env NoCodec needs a `codec` attribute, a TextCodec"):
        check_env(NoCodec(text.codec))
    with pytest.raises(ValueError, match="must say jittable = True"):
        check_env(Host(text.codec))
    with pytest.raises(TypeError, match=r"lacks the method\(s\) \['anchor'\]"):
        check_env(NoAnchor(text.codec))
    with pytest.raises(TypeError, match="needs a `codec` attribute"):  # the rollout checks before anything runs
        _run(text, model, NoCodec(text.codec))


def test_bad_returns_are_named_while_tracing(text, model):
    class NoAnchorInfo(_Ping):
        def info(self, state):
            return {k: v for k, v in super().info(state).items() if k != "anchor"}

    class LongerObs(_Ping):
        def step(self, state, action_tokens_M, action_len, env_params):
            out = super().step(state, action_tokens_M, action_len, env_params)
            return out._replace(obs=Obs(jnp.pad(out.obs.tokens, (0, 1)), out.obs.length))

    class TupleStep(_Ping):
        def step(self, state, action_tokens_M, action_len, env_params):
            return tuple(super().step(state, action_tokens_M, action_len, env_params))

    with pytest.raises(ValueError, match=r"NoAnchorInfo.step's info must be a dict with at least \['valid', 'action', "
                                         r"'success', 'anchor'\]"):
        _run(text, model, NoAnchorInfo(text.codec))
    with pytest.raises(ValueError, match="LongerObs.step's Obs.tokens has 3 slots but reset's has 2"):
        _run(text, model, LongerObs(text.codec))
    with pytest.raises(TypeError, match="TupleStep.step must return an EnvStep"):
        _run(text, model, TupleStep(text.codec))


def test_env_text_and_phrase_table_inputs(text, tmp_path):
    with pytest.raises(ValueError, match="give a tokenizer, or a tokenizer_dir"):
        env_text(WORDS, ACTIONS, "say ping")
    with pytest.raises(TypeError, match="not one string"):
        env_text("ping pong", ACTIONS, "say ping", tokenizer_dir=tmp_path)
    with pytest.raises(ValueError, match="'pang' is not in this codec's vocabulary"):
        phrase_table(text.codec, ("ping pang",))
    ids, n = phrase_table(text.codec, ("ping .", "pong pong ."))
    assert ids.shape == (2, 3) and np.asarray(n).tolist() == [2, 3]
