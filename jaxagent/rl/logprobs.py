"""Per-token log-probs and entropies of a Qwen3 policy, chunked over positions so that the f32
logits of a whole sequence never exist.

Dimension legend: B sequences, T tokens, C positions per logits chunk, V vocab, D model width.

Alignment: per-token arrays use one index, the action token: logp[:, t] = log pi(tokens[t] |
tokens[:t]) and logp[:, 0] = 0 (no prefix; never a policy token).

Memory: `next_token_stats` unembeds `logits_chunk` positions at a time in a `lax.scan`, each chunk
under `jax.checkpoint` and reduced to [B, C] log-probs and entropies, in the forward and in the
backward; `remat` names the model's per-layer `jax.checkpoint` policy (`qwen3.hidden_states`).
`make_logprobs_fn` jits `token_logprobs` over row chunks on a mesh (the trainer's pre-update
log-probs of a whole rollout, `rl.loop.rl_iteration`).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxagent import sharding, xla_options
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import losses

DEFAULT_LOGITS_CHUNK = 512  # positions per unembedding chunk (module doc)


def head_matrix(params, cfg: Qwen3Config):
    """The unembedding matrix: the tied embedding [V, D] or the LM head [D, V]."""
    return params["embed"] if cfg.tie_word_embeddings else params["lm_head"]


def _unembed_f32(head, cfg: Qwen3Config, h_BxCxD):
    """Logits [B, C, V] in f32 (as `qwen3.unembed`) from the head matrix alone: a scan over chunks
    that closed over the whole params tree would carry a zero gradient for every parameter."""
    if cfg.tie_word_embeddings:
        return jnp.einsum("bcd,vd->bcv", h_BxCxD, head.astype(h_BxCxD.dtype),
                          preferred_element_type=jnp.float32)
    return jnp.einsum("bcd,dv->bcv", h_BxCxD, head.astype(h_BxCxD.dtype),
                      preferred_element_type=jnp.float32)


def policy_positions(mask_BxT, m: int):
    """(positions [B, M] int32, over scalar int32): the indices of each row's first M nonzero entries of
    `mask_BxT` (a policy mask) in order, padded with 0 (position 0 is never a policy token: it has no prefix),
    and the count of nonzero entries beyond the first M over all rows (0 when M bounds every row)."""
    mask = mask_BxT.astype(bool)
    pos = jax.vmap(lambda r: jnp.nonzero(r, size=m, fill_value=0)[0])(mask).astype(jnp.int32)
    over = jnp.sum(jnp.maximum(jnp.sum(mask, axis=1) - m, 0)).astype(jnp.int32)
    return pos, over


def packed_policy_positions(mask_BxT, bucket: int, micro_batches: int = 1) -> np.ndarray:
    """int32 [Mb, N] (host numpy): for each micro-batch j (rows j, j + Mb, ..., as the train step splits a batch),
    the flat indices r x T + t into its [B / Mb, T] grid of every nonzero entry of `mask_BxT` (a policy mask;
    position 0 of a row is never one: it has no prefix), row-major, padded with 0 to N, the smallest multiple of
    min(`bucket`, the next power of two >= the largest micro-batch's count, at least 16) that holds that count: N
    takes few values, so a jitted step compiles few shapes, and a small batch is not padded to a whole bucket."""
    if bucket < 1 or micro_batches < 1:
        raise ValueError(f"bucket and micro_batches must be >= 1, got {bucket}, {micro_batches}")
    mask = np.asarray(mask_BxT).astype(bool)
    if mask.ndim != 2 or mask.shape[0] % micro_batches:
        raise ValueError(f"the policy mask must be [B, T] with B a multiple of micro_batches = {micro_batches}, "
                         f"got shape {mask.shape}")
    if mask[:, 0].any():
        raise ValueError("a policy mask with a token at position 0 (no prefix to draw it from)")
    flats = [np.flatnonzero(mask[j::micro_batches].reshape(-1)) for j in range(micro_batches)]
    most = max(len(f) for f in flats)
    step = min(bucket, max(16, 1 << max(most - 1, 0).bit_length()))
    n = max(1, -(-most // step)) * step
    return np.stack([np.pad(f, (0, n - len(f))) for f in flats]).astype(np.int32)


def _logits(head, cfg: Qwen3Config, h_BxTxD, mesh):
    """f32 logits [B, T, V] (`_unembed_f32`), pinned to `qwen3.LOGITS_AXES` on a mesh."""
    return sharding.constrain(_unembed_f32(head, cfg, h_BxTxD), qwen3.LOGITS_AXES, mesh)


def _target_logp(z_BxTxV, lse_BxT, tgt_BxT):
    return jnp.take_along_axis(z_BxTxV, tgt_BxT[..., None], axis=-1)[..., 0] - lse_BxT


def _stats(heads, hs, tgt_BxT, *, cfg: Qwen3Config, mesh):
    """`next_token_stats`' outputs at every state of hs[0] [B, T, D] (T: a sequence's or gathered ones) with
    targets tgt_BxT: (logp, entropy), and with a reference's head and states (heads, hs of two) (ref_logp, kl)."""
    z = _logits(heads[0], cfg, hs[0], mesh)
    lse = jax.nn.logsumexp(z, axis=-1)
    out = (_target_logp(z, lse, tgt_BxT), lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1))
    if len(heads) == 2:
        zr = _logits(heads[1], cfg, hs[1], mesh)
        out = out + (_target_logp(zr, jax.nn.logsumexp(zr, axis=-1), tgt_BxT), losses.exact_kl(z, zr))
    return out


def _chunked_stats(heads, hs, tgt_BxT, *, cfg: Qwen3Config, mesh, logits_chunk: Optional[int]):
    """`_stats` over chunks of `logits_chunk` states (a `lax.scan`, each chunk under `jax.checkpoint`), so only a
    chunk's [B, C, V] logits exist at a time; logits_chunk None or >= T: one pass."""
    rows, n_t = tgt_BxT.shape
    stats = functools.partial(_stats, cfg=cfg, mesh=mesh)
    if logits_chunk is None or logits_chunk >= n_t:
        return stats(heads, hs, tgt_BxT)
    c = int(logits_chunk)
    n = -(-n_t // c)
    pad = ((0, 0), (0, n * c - n_t))
    chunks = lambda h: jnp.pad(h, pad + ((0, 0),)).reshape(rows, n, c, -1).swapaxes(0, 1)  # noqa: E731 [n,B,C,D]
    tg = jnp.pad(tgt_BxT, pad).reshape(rows, n, c).swapaxes(0, 1)
    chunk_fn = jax.checkpoint(stats, prevent_cse=False)
    _, outs = jax.lax.scan(lambda _, x: (None, chunk_fn(heads, *x)), None, (tuple(chunks(h) for h in hs), tg))
    return tuple(o.swapaxes(0, 1).reshape(rows, n * c)[:, :n_t] for o in outs)


def _stats_at_flat_positions(stats_fn, hs, tokens_BxT, flat_N):
    """`next_token_stats` with `flat_positions_N`: `stats_fn(hs, tgt)` (`_chunked_stats`) at the gathered states."""
    b, t = hs[0].shape[:2]
    flat = flat_N.astype(jnp.int32)
    real = flat % t > 0  # t = 0 has no state before it: the padding's entries
    prev = jnp.where(real, flat - 1, 0)  # the state each position's token is drawn from, in the same row
    outs = stats_fn(tuple(h.reshape(b * t, -1)[prev][None] for h in hs),
                    tokens_BxT.astype(jnp.int32).reshape(b * t)[flat][None])
    return tuple(jnp.zeros((b * t,), o.dtype).at[flat].add(jnp.where(real, o[0], 0)).reshape(b, t) for o in outs)


def _stats_at_positions(stats_fn, hs, tokens_BxT, positions_BxM):
    """`next_token_stats` with `positions_BxM`: `stats_fn(hs, tgt)` (`_chunked_stats`) at the gathered states."""
    b, t = hs[0].shape[:2]
    pos = positions_BxM.astype(jnp.int32)
    prev = jnp.maximum(pos - 1, 0)[..., None]  # the state each position's token is drawn from
    outs = stats_fn(tuple(jnp.take_along_axis(h, prev, axis=1) for h in hs),
                    jnp.take_along_axis(tokens_BxT.astype(jnp.int32), pos, axis=1))
    rows = jnp.arange(b)[:, None]
    return tuple(jnp.zeros((b, t), o.dtype).at[rows, pos].add(jnp.where(pos > 0, o, 0)) for o in outs)


def next_token_stats(head, cfg: Qwen3Config, h_BxTxD, tokens_BxT, *,
                     logits_chunk: Optional[int] = DEFAULT_LOGITS_CHUNK, mesh: Optional[Mesh] = None,
                     ref: Optional[tuple] = None, positions_BxM=None, flat_positions_N=None):
    """(logp, entropy) [B, T] from final hidden states, aligned as `token_logprobs`.

    logp[:, t] = z_{t-1}[tokens[t]] - logsumexp(z_{t-1}) and H[:, t] = logsumexp(z_{t-1}) -
    sum_v softmax(z_{t-1})_v z_{t-1,v}, z_{t-1} = unembed(h[:, t-1]) in f32; both 0 at t = 0.
    With T > logits_chunk the positions go through a `lax.scan` over chunks of logits_chunk, each
    under `jax.checkpoint` (the backward recomputes its logits): only [B, C, V] f32 logits exist at
    a time. logits_chunk None (or >= T): one pass over all positions. `head`: `head_matrix(params, cfg)`.
    With a mesh, each chunk's logits are pinned to `qwen3.LOGITS_AXES` (`sharding.constrain`).

    `ref` = (ref_head, ref_h_BxTxD), a reference model's head and hidden states over the same tokens:
    returns (logp, entropy, ref_logp, kl) with ref_logp aligned as logp and kl[:, t] =
    KL(pi(. | tokens[:t]) || pi_ref(. | tokens[:t])) over the whole vocabulary (`losses.exact_kl`),
    computed chunk by chunk beside the policy's logits (0 at t = 0). Gradients flow through the
    policy's arguments; stop the reference's yourself.

    `positions_BxM` (int [B, M], e.g. `policy_positions` of a policy mask): the stats only at those positions
    (those of position 0, the padding, are 0), every other entry of the [B, T] outputs 0: the vocabulary is
    projected at B x M states instead of B x T, each the same as in the full pass.

    `flat_positions_N` (int [N], e.g. `packed_policy_positions` of a policy mask): the same with the positions of
    every row in one list, as flat indices b x T + t into the [B, T] grid (those with t = 0, the padding, give 0):
    the vocabulary is projected at N states, however the policy tokens are spread over the rows.
    """
    b, t, _ = h_BxTxD.shape
    # targets: the next token; the last position's (out of range) target is dropped below
    tgt_BxT = jnp.pad(tokens_BxT[:, 1:].astype(jnp.int32), ((0, 0), (0, 1)))
    heads, hs = ((head,), (h_BxTxD,)) if ref is None else ((head, ref[0]), (h_BxTxD, ref[1]))
    if logits_chunk is not None and logits_chunk < 1:
        raise ValueError(f"logits_chunk must be >= 1 or None, got {logits_chunk}")
    stats_fn = functools.partial(_chunked_stats, heads, cfg=cfg, mesh=mesh, logits_chunk=logits_chunk)
    if flat_positions_N is not None:
        if positions_BxM is not None or flat_positions_N.ndim != 1:
            raise ValueError(f"flat positions must be [N] and alone (no positions_BxM), got shape "
                             f"{flat_positions_N.shape}")
        return _stats_at_flat_positions(stats_fn, hs, tokens_BxT, flat_positions_N)
    if positions_BxM is not None:
        if positions_BxM.ndim != 2 or positions_BxM.shape[0] != b:
            raise ValueError(f"positions must be [B, M] with B = {b}, got shape {positions_BxM.shape}")
        return _stats_at_positions(stats_fn, hs, tokens_BxT, positions_BxM)
    shift = lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0)))  # noqa: E731
    return tuple(shift(o) for o in stats_fn(hs, tgt_BxT))


def hidden(params, cfg: Qwen3Config, tokens_BxT, remat=None, mesh=None, scan_layers: bool = False):
    """`qwen3.hidden_states` with the remat policy, the activation-sharding mesh and `scan_layers`."""
    h, _ = qwen3.hidden_states(params, cfg, tokens_BxT, remat=remat, mesh=mesh, scan_layers=scan_layers)
    return h


def token_logprobs(params, cfg: Qwen3Config, tokens_BxT, *, with_entropy: bool = False,
                   logits_chunk: Optional[int] = DEFAULT_LOGITS_CHUNK, remat: Optional[str] = None,
                   mesh: Optional[Mesh] = None, scan_layers: bool = False):
    """logp [B, T] with logp[:, t] = log pi(tokens[t] | tokens[:t]) and logp[:, 0] = 0; with
    with_entropy also H[:, t] = entropy of pi(. | tokens[:t]) (0 at t = 0). Chunked over positions
    (`next_token_stats`), so [B, T, V] logits never exist. `scan_layers`: `qwen3.hidden_states`'."""
    if tokens_BxT.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens_BxT.shape}")
    h = hidden(params, cfg, tokens_BxT, remat, mesh, scan_layers)
    logp, ent = next_token_stats(head_matrix(params, cfg), cfg, h, tokens_BxT, logits_chunk=logits_chunk,
                                 mesh=mesh)
    return (logp, ent) if with_entropy else logp


def make_logprobs_fn(cfg: Qwen3Config, *, mesh: Optional[Mesh] = None, micro_batches: int = 1,
                     remat: Optional[str] = None, compute_dtype=None,
                     logits_chunk: Optional[int] = DEFAULT_LOGITS_CHUNK):
    """`logprobs_fn(params, tokens_BxT) -> logp [B, T]` (f32, aligned as `token_logprobs`) as one jitted
    program: the trainer's log-probs of a whole rollout under given params (the pre-update policy of an
    iteration with several updates, `rl.loop.rl_iteration`). `compute_dtype`: floating params cast for
    the forward, as the train step does; rows in `micro_batches` chunks (`sharding.map_row_chunks`).
    With a `mesh`: params on their `qwen3.logical_axes` shardings, rows in and out over the batch axes
    (`sharding.row_sharding`); callers place their arguments there first (`jax.device_put`)."""

    def fn(params, tokens_BxT):
        if compute_dtype is not None:
            params = jax.tree.map(lambda x: x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                                  else x, params)
        return sharding.map_row_chunks(
            lambda t: token_logprobs(params, cfg, t, logits_chunk=logits_chunk, remat=remat, mesh=mesh),
            tokens_BxT, micro_batches, mesh)

    if mesh is None:
        return xla_options.jit(fn, sequence=True)
    p_sh = sharding.shardings_for(qwen3.logical_axes(cfg), qwen3.param_shapes(cfg), mesh)
    row = sharding.row_sharding(mesh)
    return xla_options.jit(fn, in_shardings=(p_sh, row), out_shardings=row, sequence=True)
