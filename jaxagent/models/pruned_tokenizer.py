"""A byte-level BPE tokenizer (Qwen3's) pruned to the tokens a corpus uses, for toy models on a CPU.

`prune_tokenizer` keeps every token the source tokenizer makes on the corpus texts, the tokens of the merges that
build them (recursively), the 256 byte-level base tokens and every added (control) token, renumbered densely in the
source order (base vocabulary, then the added tokens), and the merges whose two parts and result are all kept, in
the source order. So every text of the corpus is cut into exactly the source tokenizer's tokens, and
`source.decode(source.encode(s)) == pruned.decode(pruned.encode(s))` for those texts (`check_pruned`); any other
text still encodes (into shorter pieces, at worst single bytes) and decodes to itself: nothing maps to an unknown
token. The files are the source's `tokenizer.json` (model, pre-tokenizer, decoder, normaliser, added tokens) with
the pruned vocabulary and merges, and its `tokenizer_config.json` with the added tokens' ids renumbered; they load
through `Tokenizer.from_dir` like any checkpoint's tokenizer. `pruned_from.json` records the source directory's
vocabulary size and the corpus size. Why a toy study needs it, and why the cut is exact: docs/host_study.md, "Toy
presets" (Model and tokenizer).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from jaxagent.models.tokenizer import Tokenizer

_SOURCE_RECORD = "pruned_from.json"


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    """The merges as (left, right) pairs (tokenizers writes them as "a b" strings or as [a, b] lists)."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def _source_json(source: Tokenizer) -> dict:
    return json.loads(source.hf.backend_tokenizer.to_str())


def kept_tokens(source: Tokenizer, texts: Iterable[str], model: dict | None = None) -> set[str]:
    """The source vocabulary entries `prune_tokenizer` keeps for `texts` (module docstring), added tokens excluded.
    `model`: the source's tokenizer.json "model" section, when the caller has parsed it already."""
    from tokenizers import pre_tokenizers

    model = _source_json(source)["model"] if model is None else model
    vocab = model["vocab"]
    made_by = {a + b: (a, b) for a, b in _merge_pairs(model["merges"])}
    keep = {t for t in pre_tokenizers.ByteLevel.alphabet() if t in vocab}
    stack = []
    for text in texts:
        for tid in source.encode(text):
            tok = source.hf.backend_tokenizer.id_to_token(tid)
            if tok in vocab and tok not in keep:
                stack.append(tok)
    while stack:
        tok = stack.pop()
        if tok in keep:
            continue
        keep.add(tok)
        stack.extend(p for p in made_by.get(tok, ()) if p not in keep)
    return keep


def prune_tokenizer(source: Tokenizer, texts: Iterable[str], out_dir: str | os.PathLike) -> Tokenizer:
    """Write the source tokenizer pruned to `texts` (module docstring) into `out_dir` and load it."""
    raw = _source_json(source)
    keep = kept_tokens(source, texts, raw["model"])
    old_vocab = raw["model"]["vocab"]
    order = sorted(keep, key=old_vocab.__getitem__)
    vocab = {tok: i for i, tok in enumerate(order)}
    merges = [[a, b] for a, b in _merge_pairs(raw["model"]["merges"]) if a in keep and b in keep and a + b in keep]
    old_to_new = {}
    for i, added in enumerate(sorted(raw["added_tokens"], key=lambda t: t["id"])):
        old_to_new[added["id"]] = len(vocab) + i
        added["id"] = len(vocab) + i
    raw["model"]["vocab"], raw["model"]["merges"] = vocab, merges
    if raw.get("post_processor"):
        raw["post_processor"] = None  # the source's adds no tokens for encode(add_special_tokens=False) either
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(raw, ensure_ascii=False))
    config_path = Path(source.path) / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if "added_tokens_decoder" in config:
        config["added_tokens_decoder"] = {str(old_to_new[int(k)]): v for k, v in config["added_tokens_decoder"].items()
                                          if int(k) in old_to_new}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / _SOURCE_RECORD).write_text(json.dumps({"source": str(source.path), "source_vocab_size": source.vocab_size,
                                                  "vocab_size": len(vocab) + len(old_to_new)}) + "\n")
    return Tokenizer.from_dir(out)


def check_pruned(source: Tokenizer, pruned: Tokenizer, texts: Iterable[str]) -> list[str]:
    """The texts (up to 5) that the pruned tokenizer does not cut into the source's tokens: [] when it is exact on
    them (module docstring)."""
    bad = []
    src_tok, new_tok = source.hf.backend_tokenizer.id_to_token, pruned.hf.backend_tokenizer.id_to_token
    for text in texts:
        if [src_tok(i) for i in source.encode(text)] != [new_tok(i) for i in pruned.encode(text)]:
            bad.append(text)
            if len(bad) == 5:
                break
    return bad
