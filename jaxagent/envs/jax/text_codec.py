"""Token-level text codec: a fixed vocabulary of text pieces ("words") as token ids of ANY tokenizer.

A jitted environment cannot call a tokenizer, so the host pre-encodes every word it may emit and
every action string it must recognise; inside JAX the env only gathers, compacts and compares ids.

Dimension legend: W words, Wt max tokens per word, Wr words in a rendering, A actions, M tokens of a
generated reply, Pa max tokens per action string, Fa accepted action forms (action x prefix); `compact`
works on any 1-D array (length n).

``TextCodec`` is a registered pytree dataclass: its arrays are leaves (a codec can be a `jax.jit` argument or a
closed-over constant), its ``words``/``actions`` strings static metadata. ``encode`` must not add special tokens.
With a BPE tokenizer pass ``word_prefix=" "`` (each word encoded as " word") and ``action_prefixes`` such as
``("", " ")`` (every form an action string takes after different left context, all mapping to the same action):
``parse_action`` matches exact token sequences. Why: docs/custom_env.md, "What the rollout needs" (the codec).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TextCodec:
    """Host-built tables; see ``make_codec``."""

    table_WxWt: jax.Array  # int32 token ids of each word, padded with pad_id
    lens_W: jax.Array  # int32 number of tokens of each word
    action_tokens_AxPa: jax.Array  # int32 canonical tokens of each action string
    action_lens_A: jax.Array  # int32
    match_tokens_FaxPa: jax.Array  # int32 every accepted form (action x prefix)
    match_lens_Fa: jax.Array  # int32
    match_action_Fa: jax.Array  # int32 action index of each form
    pad_id: int = dataclasses.field(default=0, metadata=dict(static=True))
    words: tuple[str, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    actions: tuple[str, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @property
    def tokens_per_word(self) -> int:
        return int(self.table_WxWt.shape[1])

    def word_id(self, word: str) -> int:
        """Index of ``word`` in the codec (host-side)."""
        try:
            return self.words.index(word)
        except ValueError:
            raise ValueError(f"word {word!r} is not in this codec's vocabulary") from None

    def word_ids(self, words: Sequence[str]) -> np.ndarray:
        """int32 indices of several words (host-side)."""
        return np.asarray([self.word_id(w) for w in words], np.int32)


jax.tree_util.register_dataclass(
    TextCodec,
    data_fields=["table_WxWt", "lens_W", "action_tokens_AxPa", "action_lens_A", "match_tokens_FaxPa",
                 "match_lens_Fa", "match_action_Fa"],
    meta_fields=["pad_id", "words", "actions"],
)


def _encode_all(texts: Sequence[str], encode: Callable[[str], list[int]], pad_id: int, what: str):
    ids = [list(map(int, encode(t))) for t in texts]
    for t, i in zip(texts, ids):
        if not i:
            raise ValueError(f"{what} {t!r} encodes to no tokens; every {what} needs >= 1 token")
    width = max(len(i) for i in ids)
    table = np.full((len(ids), width), pad_id, np.int32)
    for r, i in enumerate(ids):
        table[r, : len(i)] = i
    return table, np.asarray([len(i) for i in ids], np.int32)


def _check_distinct(texts, table, lens, what):
    seen = {}
    for t, row, n in zip(texts, table, lens):
        k = tuple(row[:n].tolist())
        if k in seen:
            raise ValueError(f"{what} {seen[k]!r} and {t!r} encode to the same tokens {list(k)}; "
                             "is one missing from the tokenizer's vocabulary?")
        seen[k] = t


def make_codec(words: Sequence[str], encode: Callable[[str], list[int]], pad_id: int,
               actions: Sequence[str], *, word_prefix: str = "",
               action_prefixes: Sequence[str] = ("",)) -> TextCodec:
    """Encode ``words`` (as ``encode(word_prefix + word)``) and ``actions`` once on the host.

    ``actions[k]`` is parsed as action index k; the canonical form is ``encode(action)`` and
    ``action_prefixes`` lists left contexts whose encodings ``encode(prefix + action)`` are also
    accepted. Raises ValueError when a word encodes to nothing or two words (or two actions) encode
    to the same tokens, e.g. words missing from a word-level vocabulary that all become [UNK].
    """
    words, actions = tuple(words), tuple(actions)
    if not words or not actions:
        raise ValueError("make_codec needs at least one word and one action")
    if len(set(words)) != len(words):
        dup = sorted({w for w in words if words.count(w) > 1})
        raise ValueError(f"duplicate words in codec vocabulary: {dup[:5]}")
    if len(set(actions)) != len(actions):
        raise ValueError("duplicate action strings")
    prefixes = tuple(dict.fromkeys(("",) + tuple(action_prefixes)))
    table, lens = _encode_all([word_prefix + w for w in words], encode, pad_id, "word")
    _check_distinct(words, table, lens, "words")
    forms = [p + a for p in prefixes for a in actions]
    match, match_lens = _encode_all(forms, encode, pad_id, "action form")
    for i in range(len(prefixes)):
        sl = slice(i * len(actions), (i + 1) * len(actions))
        _check_distinct(forms[sl], match[sl], match_lens[sl], "actions")
    canon = match[: len(actions)]
    return TextCodec(
        table_WxWt=jnp.asarray(table), lens_W=jnp.asarray(lens),
        action_tokens_AxPa=jnp.asarray(canon), action_lens_A=jnp.asarray(match_lens[: len(actions)]),
        match_tokens_FaxPa=jnp.asarray(match), match_lens_Fa=jnp.asarray(match_lens),
        match_action_Fa=jnp.asarray(np.tile(np.arange(len(actions), dtype=np.int32), len(prefixes))),
        pad_id=int(pad_id), words=words, actions=actions)


def phrase_table(codec: TextCodec, phrases: Sequence[str]) -> tuple[jax.Array, jax.Array]:
    """Fixed phrases (e.g. an env's messages) as codec word ids: (ids int32[n_phrases, Wr] padded, n_words
    int32[n_phrases]), phrase k = ``phrases[k].split()``, every word in the codec (host-side;
    ``render(codec, ids[k], n[k])`` gives its tokens inside jit)."""
    if isinstance(phrases, str):
        raise TypeError("phrase_table takes a sequence of phrases, not one string")
    words = [p.split() for p in phrases]
    if not words or not all(words):
        raise ValueError(f"phrase_table needs at least one phrase and no empty one, got {list(phrases)!r}")
    ids = np.zeros((len(words), max(len(w) for w in words)), np.int32)
    for k, w in enumerate(words):
        ids[k, :len(w)] = codec.word_ids(w)
    return jnp.asarray(ids), jnp.asarray([len(w) for w in words], jnp.int32)


def compact(values_n: jax.Array, keep_n: jax.Array, fill) -> tuple[jax.Array, jax.Array]:
    """Stable compaction: the kept values first, in order, then ``fill``; returns (values_n, count)."""
    n = values_n.shape[0]
    keep_n = keep_n.astype(bool)
    pos_n = jnp.cumsum(keep_n) - 1
    dest_n = jnp.where(keep_n, pos_n, n)  # index n is out of bounds -> dropped
    out_n = jnp.full((n,), fill, values_n.dtype).at[dest_n].set(values_n, mode="drop")
    return out_n, jnp.sum(keep_n).astype(jnp.int32)


def render(codec: TextCodec, word_ids_Wr: jax.Array, n_words) -> tuple[jax.Array, jax.Array]:
    """Concatenate the token sequences of the first ``n_words`` words.

    Returns (tokens int32[N*P], length): tokens[:length] = table[w_0][:len_0] ++ ... , pad_id after.
    Word ids outside [0, W) are clipped (callers pass their own, valid ids).
    """
    n_vocab, p = codec.table_WxWt.shape
    n = word_ids_Wr.shape[0]
    ids_Wr = jnp.clip(word_ids_Wr.astype(jnp.int32), 0, n_vocab - 1)
    toks_WrxWt = codec.table_WxWt[ids_Wr]
    keep_WrxWt = (jnp.arange(p)[None, :] < codec.lens_W[ids_Wr][:, None]) & (
        jnp.arange(n)[:, None] < jnp.asarray(n_words, jnp.int32))
    return compact(toks_WrxWt.reshape(n * p), keep_WrxWt.reshape(n * p), codec.pad_id)


def concat(tokens_a: jax.Array, len_a, tokens_b: jax.Array, len_b, *, pad_id: int = 0
           ) -> tuple[jax.Array, jax.Array]:
    """tokens_a[:len_a] ++ tokens_b[:len_b], padded with ``pad_id`` to the static size Na + Nb.

    Lengths are clipped to [0, Na] and [0, Nb]. Works for any 1-D integer arrays (tokens or words).
    """
    na, nb = tokens_a.shape[0], tokens_b.shape[0]
    len_a = jnp.clip(jnp.asarray(len_a, jnp.int32), 0, na)
    len_b = jnp.clip(jnp.asarray(len_b, jnp.int32), 0, nb)
    k = jnp.arange(na + nb)
    from_a = tokens_a[jnp.clip(k, 0, na - 1)] if na else jnp.zeros_like(k, tokens_b.dtype)
    from_b = tokens_b[jnp.clip(k - len_a, 0, nb - 1)] if nb else jnp.zeros_like(k, tokens_a.dtype)
    out = jnp.where(k < len_a, from_a, jnp.where(k < len_a + len_b, from_b, pad_id))
    return out.astype(jnp.result_type(tokens_a, tokens_b)), len_a + len_b


def parse_action(codec: TextCodec, tokens_M: jax.Array, length) -> jax.Array:
    """Index of the action whose token sequence occurs LAST in tokens[:length], or -1 if none.

    Sliding-window exact compare of every accepted form m at every start i:
        match[m, i] = (i + len_m <= length) and all_j<len_m tokens[i + j] == form_m[j];
    the winner is the match with the largest end i + len_m (ties: the longer form, then the lower m).
    Any int token values are safe: ids are only compared, never used as indices.
    """
    a = tokens_M.shape[0]
    m, pa = codec.match_tokens_FaxPa.shape
    if a == 0:
        return jnp.asarray(-1, jnp.int32)
    length = jnp.clip(jnp.asarray(length, jnp.int32), 0, a)
    tok = tokens_M.astype(jnp.int32)
    idx_MxPa = jnp.arange(a)[:, None] + jnp.arange(pa)[None, :]
    win_MxPa = tok[jnp.clip(idx_MxPa, 0, a - 1)]  # windows past the end are masked by end <= length
    used_FaxPa = jnp.arange(pa)[None, :] < codec.match_lens_Fa[:, None]
    eq_FaxMxPa = win_MxPa[None] == codec.match_tokens_FaxPa[:, None, :]
    full_FaxM = jnp.all(eq_FaxMxPa | ~used_FaxPa[:, None, :], axis=-1)
    end_FaxM = jnp.arange(a)[None, :] + codec.match_lens_Fa[:, None]
    hit_FaxM = full_FaxM & (end_FaxM <= length)
    # score = end * (pa + 1) + len: larger end wins, then longer form; argmax picks the lowest m.
    score_FaxM = jnp.where(hit_FaxM, end_FaxM * (pa + 1) + codec.match_lens_Fa[:, None], -1)
    best = jnp.argmax(score_FaxM.reshape(-1))
    found = jnp.any(hit_FaxM)
    return jnp.where(found, codec.match_action_Fa[best // a], -1).astype(jnp.int32)
