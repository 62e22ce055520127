"""The model's side of the host rollout (`host_loop`): jitted append / decode calls that donate the KV
cache, chunks appended in bucketed widths, given replies as tokens.

Compiles: `append_jit` once per distinct width (powers of two from 16 to `max_append_width`) and
`decode_jit` once, per (batch size, max_context, model, sampler); never per turn. The host loop gives
every episode group the same number of rows, so groups share the compiles.

Dimension legend (CONVENTIONS.md): B episodes, C append width (chunk tokens), M action tokens, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import qwen3
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout.episode import EpisodeConfig, text_reply
from jaxagent.sampling import append, bucket, decode
from jaxagent import xla_options


@functools.partial(xla_options.jit, static_argnames=("cfg",), donate_argnames=("cache", "logits_BxV"))
def append_jit(params, cache, tokens_BxC, n_valid_B, logits_BxV, *, cfg):
    """Appends each row's first n_valid tokens; rows with n_valid 0 keep their previous logits."""
    new_BxV, cache = append(params, cfg, cache, tokens_BxC, n_valid_B)
    return jnp.where((n_valid_B > 0)[:, None], new_BxV, logits_BxV), cache


@functools.partial(xla_options.jit, static_argnames=("cfg", "max_steps", "sampler", "stop_ids", "pad_id"),
                   donate_argnames=("cache",))
def decode_jit(params, cache, logits_BxV, key, active_B, *, cfg, max_steps, sampler, stop_ids, pad_id):
    return decode(params, cfg, cache, logits_BxV, key, max_steps, max_steps=max_steps, sampler=sampler,
                  stop_ids=stop_ids, pad_id=pad_id, active_B=active_B)


def append_rows(params, cfg, cache, logits_BxV, rows: list, pad_id: int, max_width: int):
    """Appends rows[b] (a list of ids, maybe empty) to every row's cache with one jitted call of a
    bucketed width, or several calls of `max_width` for longer rows; returns (logits, cache)."""
    n_B = np.asarray([len(r) for r in rows], np.int32)
    n_max = int(n_B.max())
    width = min(bucket(n_max), max_width)
    for off in range(0, n_max, width):
        n_piece_B = np.clip(n_B - off, 0, width).astype(np.int32)
        piece_BxC = np.full((len(rows), width), pad_id, np.int32)
        for b in np.flatnonzero(n_piece_B):
            piece_BxC[b, :n_piece_B[b]] = rows[b][off:off + n_piece_B[b]]
        logits_BxV, cache = append_jit(params, cache, jnp.asarray(piece_BxC), jnp.asarray(n_piece_B), logits_BxV,
                                        cfg=cfg)
    return logits_BxV, cache


def given_replies(texts: dict, n_ep: int, tokenizer: Tokenizer, m: int, pad_id: int):
    """Replies from texts {b: text}: (tokens [B, M], logprobs [B, M] zeros, lengths [B], stopped [B])."""
    tok_BxM = np.full((n_ep, m), pad_id, np.int32)
    len_B, stop_B = np.zeros((n_ep,), np.int32), np.zeros((n_ep,), bool)
    for b, text in texts.items():
        ids, stop_B[b] = text_reply(tokenizer, text, m)
        tok_BxM[b, :len(ids)], len_B[b] = ids, len(ids)
    return tok_BxM, np.zeros((n_ep, m), np.float32), len_B, stop_B


@dataclasses.dataclass
class HostPolicy:
    """The sampled policy of one episode group: params, its KV cache and next-token logits (one row per
    episode of the group), its key (split once per decode call)."""

    params: Any
    cfg: Any
    hcfg: EpisodeConfig
    stop_ids: tuple
    pad_id: int
    max_width: int
    key: jax.Array
    cache: Any = None
    logits: Any = None

    def start(self, n_ep: int):
        self.cache = qwen3.init_cache(self.cfg, n_ep, self.hcfg.max_context, jax.tree.leaves(self.params)[0].dtype)
        self.logits = jnp.zeros((n_ep, self.cfg.vocab_size), jnp.float32)

    def append(self, rows: list):
        self.logits, self.cache = append_rows(self.params, self.cfg, self.cache, self.logits, rows, self.pad_id,
                                               self.max_width)

    def turn(self, chunks: list, sample_B, given: dict, tokenizer: Tokenizer):
        """One turn of its rows: chunks[b] appended, a reply sampled where sample_B and b is not in
        `given`, the given replies {b: text} written into the cache after it: numpy (tokens [B, M],
        logprobs [B, M], lengths [B], stopped [B])."""
        n_rows = len(chunks)
        self.append(chunks)
        r_tok, r_lp, r_len, r_stop = self.sample(sample_B & ~np.isin(np.arange(n_rows), list(given)))
        if given:
            g_tok, g_lp, g_len, g_stop = given_replies(given, n_rows, tokenizer, self.hcfg.max_action_tokens,
                                                       self.pad_id)
            self.append([list(g_tok[b, :g_len[b]]) for b in range(n_rows)])
            for b in given:
                r_tok[b], r_lp[b], r_len[b], r_stop[b] = g_tok[b], g_lp[b], g_len[b], g_stop[b]
        return r_tok, r_lp, r_len, r_stop

    def sample(self, active_B):
        """One reply per row where active_B (one jitted decode): numpy (tokens, logprobs, lengths, stopped)."""
        self.key, k_dec = jax.random.split(self.key)
        gen = decode_jit(self.params, self.cache, self.logits, k_dec, jnp.asarray(active_B), cfg=self.cfg,
                          max_steps=self.hcfg.max_action_tokens, sampler=self.hcfg.sampler, stop_ids=self.stop_ids,
                          pad_id=self.pad_id)
        self.cache = gen.cache
        return tuple(np.array(x) for x in jax.device_get((gen.tokens, gen.logprobs, gen.lengths, gen.stopped)))
