"""The model's side of the host rollout (`host_loop`): jitted append / decode calls that donate the KV
cache, chunks appended in bucketed widths, given replies as tokens.

Compiles: `append_jit` once per distinct width (powers of two from 16 to `max_append_width`) and `decode_jit` once,
per (batch size, max_context, model, sampler); never per turn. On one device a reply loop goes on over a quarter of
the rows once no more of them are generating, then a quarter of those (`compact_rows`, `decode`).
Placement (`Placement`). With the params on a single device (or unplaced) the host arrays go in as they are and the
replies come back with `jax.device_get`. With the params on a device mesh (`Placement.of(params)`) every host-side
input of a jitted call is placed on that mesh explicitly (token rows, counts and active mask over the batch axes,
the key replicated, a fresh KV cache and logits in their rule-table shardings), each global array built from the
host copy that every process holds, and the replies come back fully replicated (`Placement.fetch`), so every
process makes the same loop decisions. How each array is placed: docs/host_rollout.md, "Several processes".

Dimension legend (CONVENTIONS.md): B episodes, C append width (chunk tokens), M action tokens, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent import sharding as shd
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


@functools.partial(xla_options.jit, static_argnames=("cfg", "max_steps", "sampler", "stop_ids", "pad_id",
                                                    "compact_rows"),
                   donate_argnames=("cache",))
def decode_jit(params, cache, logits_BxV, key, active_B, *, cfg, max_steps, sampler, stop_ids, pad_id,
               compact_rows=None):
    return decode(params, cfg, cache, logits_BxV, key, max_steps, max_steps=max_steps, sampler=sampler,
                  stop_ids=stop_ids, pad_id=pad_id, active_B=active_B, compact_rows=compact_rows)


COMPACT_DIVISOR = 4  # a reply loop goes on over B / 4, then B / 16, ... rows as fewer are generating (`compact_rows`)


def compact_rows(n_rows: int, mesh: Optional[Mesh]) -> Optional[tuple]:
    """`decode`'s compact_rows for a group of `n_rows` on `mesh`: n_rows / COMPACT_DIVISOR^k for k = 1, 2, ... while
    at least 2, on one device; None (no compaction) on a mesh, whose batch shards the gathered rows would cross."""
    levels, c = [], n_rows // COMPACT_DIVISOR
    while mesh is None and c >= 2:
        levels.append(c)
        c //= COMPACT_DIVISOR
    return tuple(levels) or None


def canonical(sh: NamedSharding) -> NamedSharding:
    """`sh` with the trailing unsharded dimensions dropped from its spec, the form jit gives its outputs: a
    fresh cache in P(b, t, None, None) and the one an append returns in P(b, t) are the same layout, but unequal
    shardings, so the first append of each width would compile twice."""
    parts = list(sh.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return NamedSharding(sh.mesh, P(*parts))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the host loop's arrays go: `mesh` None (the params' single device: host arrays as they are) or
    the params' device mesh (module docstring)."""

    mesh: Optional[Mesh] = None

    @classmethod
    def of(cls, params) -> "Placement":
        """The mesh of the params' first leaf when it has a NamedSharding over more than one device."""
        leaves = jax.tree.leaves(params)
        sh = getattr(leaves[0], "sharding", None) if leaves else None
        return cls(sh.mesh if isinstance(sh, NamedSharding) and sh.mesh.size > 1 else None)

    def _global(self, x: np.ndarray, sh: NamedSharding) -> jax.Array:
        return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

    def rows(self, x) -> jax.Array:
        """A host array [B, ...] (the same on every process) with its rows over the mesh's batch axes."""
        x = np.asarray(x)
        if self.mesh is None:
            return jnp.asarray(x)
        return self._global(x, shd.batch_sharding(self.mesh, x.ndim, batch_size=x.shape[0]))

    def replicated(self, x) -> jax.Array:
        """A host array (the same on every process) whole on every device of the mesh."""
        x = np.asarray(x)
        return jnp.asarray(x) if self.mesh is None else self._global(x, shd.replicated(self.mesh))

    def key(self, key) -> jax.Array:
        """A typed PRNG key (host-local or already replicated) replicated on the mesh."""
        if self.mesh is None:
            return key
        sh = shd.replicated(self.mesh)
        if getattr(key, "sharding", None) == sh:
            return key
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # a raw uint32 key
            return self.replicated(key)
        data = np.asarray(jax.random.key_data(key))  # a local key, or a global one every process can read
        return jax.random.wrap_key_data(self._global(data, sh), impl=jax.random.key_impl(key))

    def zeros(self, shape: tuple, dtype, logical: tuple) -> jax.Array:
        """Zeros of `shape` in the rule-table sharding of their logical axes (`sharding.RULES`)."""
        if self.mesh is None:
            return jnp.zeros(shape, dtype)
        sh = NamedSharding(self.mesh, shd.spec_for(logical, shape, self.mesh))
        return jnp.zeros(shape, dtype, device=canonical(sh))

    def fetch(self, tree):
        """numpy copies of a pytree of arrays, every element on every process (gathered where this process
        cannot address every shard; a host-local leaf is this process's own copy)."""
        def one(x):
            if getattr(x, "is_fully_addressable", True):
                return jax.device_get(x)
            return multihost_utils.process_allgather(x, tiled=True)
        return jax.tree.map(one, tree)


def append_rows(params, cfg, cache, logits_BxV, rows: list, pad_id: int, max_width: int,
                place: Placement = Placement()):
    """Appends rows[b] (a list of ids, maybe empty) to every row's cache with one jitted call of a
    bucketed width, or several calls of `max_width` for longer rows; returns (logits, cache). `place`:
    where the token rows go (module docstring)."""
    n_B = np.asarray([len(r) for r in rows], np.int32)
    n_max = int(n_B.max())
    width = min(bucket(n_max), max_width)
    for off in range(0, n_max, width):
        n_piece_B = np.clip(n_B - off, 0, width).astype(np.int32)
        piece_BxC = np.full((len(rows), width), pad_id, np.int32)
        for b in np.flatnonzero(n_piece_B):
            piece_BxC[b, :n_piece_B[b]] = rows[b][off:off + n_piece_B[b]]
        logits_BxV, cache = append_jit(params, cache, place.rows(piece_BxC), place.rows(n_piece_B), logits_BxV,
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
    episode of the group), its key (split once per decode call), all placed per `Placement.of(params)`."""

    params: Any
    cfg: Any
    hcfg: EpisodeConfig
    stop_ids: tuple
    pad_id: int
    max_width: int
    key: jax.Array
    cache: Any = None
    logits: Any = None
    place: Placement = Placement()

    def start(self, n_ep: int):
        self.place = Placement.of(self.params)
        self.key = self.place.key(self.key)
        dtype = jax.tree.leaves(self.params)[0].dtype
        if self.place.mesh is None:
            self.cache = qwen3.init_cache(self.cfg, n_ep, self.hcfg.max_context, dtype)
        else:  # each array born in its rule-table sharding: a real cache never sits whole on one device
            shapes = jax.eval_shape(lambda: qwen3.init_cache(self.cfg, n_ep, self.hcfg.max_context, dtype))
            shardings = shd.shardings_for(qwen3.cache_logical_axes(self.cfg), shapes, self.place.mesh)
            self.cache = jax.tree.map(lambda s, sh: jnp.zeros(s.shape, s.dtype, device=canonical(sh)), shapes, shardings)
        self.logits = self.place.zeros((n_ep, self.cfg.vocab_size), jnp.float32, ("batch", "vocab"))

    def append(self, rows: list):
        self.logits, self.cache = append_rows(self.params, self.cfg, self.cache, self.logits, rows, self.pad_id,
                                               self.max_width, self.place)

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
        gen = decode_jit(self.params, self.cache, self.logits, k_dec, self.place.rows(active_B), cfg=self.cfg,
                          max_steps=self.hcfg.max_action_tokens, sampler=self.hcfg.sampler, stop_ids=self.stop_ids,
                          pad_id=self.pad_id,
                          compact_rows=compact_rows(len(active_B), self.place.mesh) if self.hcfg.compact_decode
                          else None)
        self.cache = gen.cache
        return tuple(np.array(x) for x in self.place.fetch((gen.tokens, gen.logprobs, gen.lengths, gen.stopped)))
