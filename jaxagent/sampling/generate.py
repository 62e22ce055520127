"""Prefill + decode with a KV cache: `lax.while_loop`, static shapes, per-row done mask.

Legend: B batch, L prompt slots (bucketed), M new-token buffer, S cache slots, V vocab.

The pieces compose for the multi-turn path: `append` writes any number of new tokens per row into an
existing cache (a prompt, or an environment's reply after the model's turn) and returns each row's
next-token logits; `decode` samples until every row has hit a stop token or its own token limit. Rows
never re-prefill their history. `generate` is the one-call convenience for a batch of prompts with
left or right padding.

On a mesh, decoding reads every weight at every token, so the weights it reads are laid out for decoding
(`rollout_params`: per `sharding.ROLLOUT_RULES`, split over tensor and whole over the batch axes, gathered
once per call) rather than FSDP-sharded as for training (gathered at every decode step). The training and
evaluation rollouts (`study.stages`, `eval.driver_common`) and `generate` use that one layout.
"""
from __future__ import annotations

import collections.abc
import functools
import numbers
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxagent import checks
from jaxagent import sharding as shd
from jaxagent import xla_options
from jaxagent.models import ops, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.sampling.samplers import Sampler, sample


class Generation(NamedTuple):
    tokens: jax.Array      # int32 [B, M]; slots past `lengths` hold pad_id
    logprobs: jax.Array    # f32 [B, M]; sampler log pi of each generated token, 0 past `lengths`
    lengths: jax.Array     # int32 [B]; generated tokens incl. the stop token
    stopped: jax.Array     # bool [B]; ended on a stop token (False: hit its token limit)
    cache: dict | None = None  # the cache holding prompt + generated tokens (`generate`: only with return_cache)


_PREDRAW_MAX_ELEMENTS = 1 << 22  # decode pre-draws all steps' sampling noise up to this size (16 MiB f32)


def bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= n (and >= minimum): static shapes without a compile per length."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.partial(xla_options.jit, static_argnames=("dtype",))
def cast_params(params, *, dtype):
    """`params` with their floating leaves in `dtype` (the decoding copy `rollout_params` makes): an `xla_options`
    program, so that on a CPU host the weight-sized copy is checked against the memory left before it is made."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def rollout_params(params, cfg: Qwen3Config, *, mesh: Mesh | None = None, compute_dtype=None):
    """The decoding copy of `params` (the rollouts' and `generate`'s): floating leaves cast to
    `compute_dtype` (None, or the dtype they already have: not cast) and, on a `mesh`, placed per
    `sharding.ROLLOUT_RULES` (split over tensor, replicated over the batch axes; already there: no copy).
    Neither: `params` itself. Works on traced params too (inside a user's jit: a sharding constraint)."""
    if compute_dtype is not None:
        dt = jnp.dtype(compute_dtype)
        if not jnp.issubdtype(dt, jnp.floating):
            raise ValueError(f"compute_dtype must be a floating dtype, got {dt}")
        if any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt for x in jax.tree.leaves(params)):
            params = cast_params(params, dtype=dt)
    if mesh is not None:
        params = jax.device_put(params, shd.shardings_for(qwen3.logical_axes(cfg), params, mesh, shd.ROLLOUT_RULES))
    return params


def append(params, cfg: Qwen3Config, cache, tokens_BxT, n_valid_B, *, kv_window=None, mesh=None):
    """Appends each row's first n_valid tokens to its cache; returns (next-token logits [B, V], cache).

    Rows with n_valid = 0 are left unchanged and return the logits of a stale slot (callers keep
    their own last logits for such rows). `params` (or `ops.prepare`'s), `kv_window`, `mesh`: see
    `qwen3.forward`.
    """
    last = jnp.maximum(n_valid_B - 1, 0)
    logits, cache = qwen3.forward(params, cfg, tokens_BxT, cache=cache, n_valid=n_valid_B, logits_index=last,
                                  kv_window=kv_window, mesh=mesh)
    return logits[:, 0], cache


class _DecodeCarry(NamedTuple):
    """The token loop's state over its rows (all B, or the compacted ones)."""
    step: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    done: jax.Array
    stopped: jax.Array
    logits: jax.Array
    cache: dict
    key: jax.Array


def _compact_levels(compact_rows, b: int) -> tuple[int, ...]:
    """`decode`'s compact_rows as a tuple of row counts, each in [1, the previous) (ValueError otherwise)."""
    levels = (() if compact_rows is None else tuple(compact_rows) if isinstance(compact_rows, (tuple, list))
              else (compact_rows,))
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in levels) or any(
            not 1 <= c < w for c, w in zip(levels, (b,) + levels)):
        raise ValueError(f"compact_rows must be an int in [1, {b}) or a decreasing tuple of them for {b} rows, "
                         f"got {compact_rows!r}")
    return levels


def _decode_step(c: _DecodeCarry, max_new, rows, *, params, cfg, sampler, stop, pad_id, predrawn, kv_window, mesh):
    """One token for each live row of the loop: `rows` are the batch rows it runs over (None: all B) and
    `max_new` their token limits; `predrawn` [max_steps, B, V]: every step's Gumbel noise, or None."""
    key = c.key
    if sampler.greedy:
        tok, lp = sample(None, c.logits, sampler)
    elif predrawn is not None:
        noise = predrawn[c.step] if rows is None else predrawn[c.step][rows]
        tok, lp = sample(None, c.logits, sampler, gumbel_BxV=noise)
    else:
        key, sub = jax.random.split(c.key)
        tok, lp = sample(sub, c.logits, sampler)
    live = ~c.done
    tok = jnp.where(live, tok, pad_id)
    tokens = c.tokens.at[:, c.step].set(tok)
    logprobs = c.logprobs.at[:, c.step].set(jnp.where(live, lp, 0.0))
    lengths = c.lengths + live
    hit_stop = live & jnp.isin(tok, stop)
    done = c.done | hit_stop | (lengths >= max_new)
    logits, cache = append(params, cfg, c.cache, tok[:, None], live.astype(jnp.int32), kv_window=kv_window,
                           mesh=mesh)
    logits = jnp.where(live[:, None], logits, c.logits)
    return _DecodeCarry(c.step + 1, tokens, logprobs, lengths, done, c.stopped | hit_stop, logits, cache, key)


def _going(c: _DecodeCarry, max_steps: int):
    """Whether the loop takes another step: buffer left and a row still generating."""
    return (c.step < max_steps) & ~jnp.all(c.done)


def _token_loop(c: _DecodeCarry, step_fn, max_steps: int, rows, max_new, levels: tuple[int, ...]) -> _DecodeCarry:
    """The token loop from `c` over the batch rows `rows` (None: all) with their limits `max_new`. With `levels`
    (`_compact_levels`), once at most levels[0] rows are live it goes on over levels[0] rows only (every live one
    and finished ones: their cache rows and buffers gathered, scattered back after), and so on down the levels.
    `step_fn(c, max_new, rows)`: one token (`_decode_step`)."""
    body = lambda c: step_fn(c, max_new, rows)  # noqa: E731
    if not levels:
        return jax.lax.while_loop(lambda c: _going(c, max_steps), body, c)
    wide = jax.lax.while_loop(lambda c: _going(c, max_steps) & (jnp.sum(~c.done) > levels[0]), body, c)
    sel = jnp.argsort(wide.done, stable=True)[:levels[0]]  # every live row (False sorts first)
    take = lambda x: x[sel]  # noqa: E731
    narrow = _token_loop(_DecodeCarry(wide.step, *map(take, wide[1:7]), jax.tree.map(take, wide.cache), wide.key),
                         step_fn, max_steps, sel if rows is None else rows[sel], max_new[sel], levels[1:])
    put = lambda full, part: full.at[sel].set(part)  # noqa: E731
    return _DecodeCarry(narrow.step, *(put(f, n) for f, n in zip(wide[1:7], narrow[1:7])),
                        jax.tree.map(put, wide.cache, narrow.cache), narrow.key)


def decode(params, cfg: Qwen3Config, cache, logits_BxV, key, max_new_B, *, max_steps: int,
           sampler: Sampler, stop_ids: Sequence[int], pad_id: int = 0, active_B=None,
           kv_window: int | None = None, mesh=None,
           compact_rows: int | tuple[int, ...] | None = None) -> Generation:
    """Samples up to max_new_B[b] (<= max_steps, traced) tokens per row from `logits_BxV` onwards.

    Every generated token, the stop token included, is written to the cache, so the next turn can
    append directly after it. Rows with active_B False generate nothing. `kv_window`: see
    `qwen3.forward` (the caller guarantees length + max_steps <= kv_window for active rows).
    `params` are prepared for decoding here (`ops.prepare(decoding=True)`), once per call, outside
    the token loop; params the caller prepared pass through. `mesh`: see `qwen3.forward`.

    `compact_rows` C (static, 1 <= C < B; one device): once at most C rows are still generating, the loop goes on
    over C rows only (those and as many finished ones): a decode step costs about in proportion to its rows, and a
    batch's longest replies otherwise keep every finished row stepping (the tail, `rollout.host_timing`). A
    decreasing tuple (C1, C2, ...) compacts again to C2 of the C1 rows, and so on. Each row's tokens are those of
    the uncompacted loop where its sampling noise is the same: greedy, and pre-drawn noise (gathered with the rows);
    with noise drawn per step the compacted rows draw theirs at width C (the same distribution, other numbers).
    """
    b = logits_BxV.shape[0]
    levels = _compact_levels(compact_rows, b)
    check_sampling_options("decode", sampler, stop_ids)
    params = ops.prepare(params, cfg, decoding=True)
    stop = jnp.asarray(tuple(stop_ids), jnp.int32)
    max_new_B = jnp.minimum(jnp.broadcast_to(jnp.asarray(max_new_B, jnp.int32), (b,)), max_steps)
    active = jnp.ones((b,), bool) if active_B is None else active_B
    done0 = ~active | (max_new_B <= 0)

    # One Gumbel draw for every step (when it is small) instead of one per step: each threefry call in
    # the loop costs as much as a small policy's model step on CPU.
    v = logits_BxV.shape[-1]
    predrawn = None
    if not sampler.greedy and max_steps * b * v <= _PREDRAW_MAX_ELEMENTS:
        predrawn = jax.random.gumbel(key, (max_steps, b, v), jnp.float32)
    step_fn = functools.partial(_decode_step, params=params, cfg=cfg, sampler=sampler, stop=stop, pad_id=pad_id,
                                predrawn=predrawn, kv_window=kv_window, mesh=mesh)
    init = _DecodeCarry(jnp.int32(0), jnp.full((b, max_steps), pad_id, jnp.int32),
                        jnp.zeros((b, max_steps), jnp.float32), jnp.zeros((b,), jnp.int32), done0,
                        jnp.zeros((b,), bool), logits_BxV, cache, key)
    out = _token_loop(init, step_fn, max_steps, None, max_new_B, levels)
    return Generation(out.tokens, out.logprobs, out.lengths, out.stopped, out.cache)


def right_align(tokens_BxL, mask_BxL):
    """Moves each row's real tokens (mask 1) to the front, keeping order: any padding side -> right."""
    order = jnp.argsort(~mask_BxL.astype(bool), axis=1, stable=True)
    return jnp.take_along_axis(tokens_BxL, order, axis=1), mask_BxL.astype(jnp.int32).sum(1)


def _constrain_cache(cache, cfg: Qwen3Config, mesh, rules):
    """Pins the cache to its rule-table sharding (batch over data/fsdp, KV heads over tensor)."""
    if mesh is None:
        return cache
    shardings = shd.shardings_for(qwen3.cache_logical_axes(cfg), cache, mesh, rules)
    return jax.lax.with_sharding_constraint(cache, shardings)


@functools.partial(xla_options.jit, static_argnames=("cfg", "max_steps", "cache_len", "sampler", "stop_ids", "pad_id",
                                             "mesh", "rules"))
def generate_jit(params, prompt_BxL, mask_BxL, key, max_new_B, *, cfg, max_steps, cache_len, sampler, stop_ids,
                 pad_id, mesh=None, rules=None):
    """The jitted program `generate` runs (prefill of the right-aligned prompts into an empty cache of
    `cache_len` slots, then `decode`); public for callers that lower it (the AOT analysis). The cache is one of
    its outputs whether or not the caller keeps it: XLA:TPU carries a cache that is no output through the token
    loop in another layout than the prefill writes, so it holds two copies (R_single's plan generation on
    Qwen3-0.6B, 128 rows x 583 slots for v5p: 21.8 GiB without the output, 13.2 GiB with it; docs/aot.md)."""
    rules = None if rules is None else dict(rules)
    tokens, n = right_align(prompt_BxL, mask_BxL)
    cache = qwen3.init_cache(cfg, tokens.shape[0], cache_len, jax.tree.leaves(params)[0].dtype)
    cache = _constrain_cache(cache, cfg, mesh, rules)
    act_mesh = mesh if rules is None else None  # activation constraints follow sharding.RULES
    logits, cache = append(params, cfg, cache, tokens, n, kv_window=tokens.shape[1], mesh=act_mesh)  # empty cache
    cache = _constrain_cache(cache, cfg, mesh, rules)
    return decode(params, cfg, cache, logits, key, max_new_B, max_steps=max_steps, sampler=sampler,
                  stop_ids=stop_ids, pad_id=pad_id, mesh=act_mesh)



def check_sampling_options(where: str, sampler, stop_ids) -> None:
    """A `Sampler` and a sequence of int stop ids (a TypeError naming the argument otherwise)."""
    if not isinstance(sampler, Sampler):
        raise TypeError(f"{where}: sampler must be a jaxagent.sampling.Sampler (Sampler(temperature=0.7, top_p=0.95), "
                        f"Sampler(greedy=True)); got {type(sampler).__name__} {sampler!r}")
    if isinstance(stop_ids, np.ndarray) and stop_ids.ndim == 1:
        stop_ids = stop_ids.tolist()
    if isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, collections.abc.Sequence) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in stop_ids):
        raise TypeError(f"{where}: stop_ids must be a sequence of token ids, e.g. (2,) or tok.eos_ids; got "
                        f"{type(stop_ids).__name__} {stop_ids!r}")


def _check_generate_args(params, cfg, prompt_BxL, prompt_mask_BxL, max_new_tokens, key, sampler, stop_ids):
    """`generate`'s arguments by type, shape and dtype (`jaxagent.checks`: shapes only, so traced inputs too)."""
    where = "generate"
    if not isinstance(cfg, Qwen3Config):
        raise TypeError(f"{where}: cfg must be a Qwen3Config; got {type(cfg).__name__}")
    qwen3.check_params(params, cfg, where)
    check_sampling_options(where, sampler, stop_ids)
    checks.arrays(where, [("prompt_BxL", prompt_BxL, "BL", "integer"),
                          ("prompt_mask_BxL", prompt_mask_BxL, "BL", "number")])
    checks.array(where, "max_new_tokens", max_new_tokens, "B"[:np.ndim(max_new_tokens)], "integer")
    checks.key(where, "key", key)


def generate(params, cfg: Qwen3Config, prompt_BxL, key, *, max_new_tokens, prompt_mask_BxL=None,
             max_steps: int | None = None, sampler: Sampler = Sampler(), stop_ids: Sequence[int] = (),
             pad_id: int = 0, cache_len: int | None = None, mesh: Mesh | None = None,
             rules: Mapping[str, shd.MeshAxes] | None = None, compute_dtype=None,
             return_cache: bool = False) -> Generation:
    """Samples continuations of a batch of prompts (padding on either side, given by the mask).

    The prompt width is bucketed to a power of two and `max_new_tokens` (int or [B]) is a traced
    value bounded by the static buffer `max_steps` (default: bucket(max(max_new_tokens))), so new
    prompt lengths and token limits reuse the compiled program.

    `mesh` (optional, with `rules`, default `sharding.RULES`): decodes on that mesh as the rollouts do.
    The params (in any layout on the mesh, e.g. FSDP-sharded by `weights.load(path, mesh=mesh)`) are
    laid out for decoding first (`rollout_params`: per `sharding.ROLLOUT_RULES`, one gather per call,
    none per token); the batch is split over the rules' batch axes and the KV cache is pinned to its
    rule-table sharding instead of whatever the compiler propagates (with the default rules, the
    model's activations too: `qwen3.forward(mesh=)`). `compute_dtype` (optional): decode with the
    floating params cast to it (`rollout_params`), as the rollouts do with the preset's compute dtype.
    `return_cache`: also return the KV cache of prompt + generated tokens (`Generation.cache`, to go on with
    `append` / `decode`); by default it is dropped as the call returns, so its memory ends with the call (under a
    transformation: the cache is no output of the caller's program).

    Inside a user's `jax.jit` / `eval_shape` / `vmap` (traced prompt, mask or token limits) only the
    shape checks run (the value checks need concrete inputs) and `max_steps` must be given: it is the
    static size of the new-token buffer, which sets the compiled program's shapes, while
    `max_new_tokens` is only a traced value there. Arguments of the wrong kind, rank or dtype (float
    prompts, a mask of another shape, a seed instead of a key) raise TypeError / ValueError naming them.
    """
    _check_generate_args(params, cfg, prompt_BxL, prompt_mask_BxL, max_new_tokens, key, sampler, stop_ids)
    if mesh is not None or compute_dtype is not None:
        params = rollout_params(params, cfg, mesh=mesh, compute_dtype=compute_dtype)
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((prompt_BxL, prompt_mask_BxL, max_new_tokens))):
        return _generate_traced(params, cfg, prompt_BxL, key, max_new_tokens, prompt_mask_BxL, max_steps, sampler,
                                stop_ids, pad_id, cache_len, mesh, rules, return_cache)
    prompt = np.asarray(prompt_BxL)
    if prompt.ndim != 2 or prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [B, L] with B, L >= 1, got shape {prompt.shape}")
    mask = np.ones_like(prompt, bool) if prompt_mask_BxL is None else np.asarray(prompt_mask_BxL, bool)
    if mask.shape != prompt.shape:
        raise ValueError(f"prompt_mask shape {mask.shape} != prompt shape {prompt.shape}")
    if not mask.any(axis=1).all():
        raise ValueError("every prompt needs at least one real token")
    real = prompt[mask]  # only real tokens are range-checked: padding may hold any id
    if real.min() < 0 or real.max() >= cfg.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {cfg.vocab_size}), got ids in "
                         f"[{int(real.min())}, {int(real.max())}]")
    max_new = np.asarray(max_new_tokens)
    if max_new.ndim > 1 or (max_new.ndim == 1 and max_new.shape[0] != prompt.shape[0]):
        raise ValueError(f"max_new_tokens must be an int or a [B={prompt.shape[0]}] array, got shape "
                         f"{max_new.shape}")
    max_new = np.broadcast_to(max_new.astype(np.int32), (prompt.shape[0],))
    if (max_new < 0).any():
        raise ValueError("max_new_tokens must be >= 0")
    if max_steps is None:
        max_steps = bucket(int(max_new.max()), 8)
    elif int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    max_steps = int(max_steps)
    if max_new.max() > max_steps:
        raise ValueError(f"max_new_tokens {int(max_new.max())} exceeds the buffer max_steps={max_steps}")
    width = bucket(prompt.shape[1])
    pad = width - prompt.shape[1]
    prompt = np.pad(prompt, ((0, 0), (0, pad)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (0, pad)))
    cache_len = cache_len or width + max_steps
    if cache_len < width + max_steps:
        raise ValueError(f"cache_len {cache_len} < prompt bucket {width} + max_steps {max_steps}")
    prompt, mask, max_new = jnp.asarray(prompt, jnp.int32), jnp.asarray(mask), jnp.asarray(max_new)
    if mesh is not None:
        b = prompt.shape[0]
        prompt, mask = (jax.device_put(x, shd.batch_sharding(mesh, 2, rules, batch_size=b)) for x in (prompt, mask))
        max_new = jax.device_put(max_new, shd.batch_sharding(mesh, 1, rules, batch_size=b))
        key = jax.device_put(key, shd.replicated(mesh))
    gen = generate_jit(params, prompt, mask, key, max_new, cfg=cfg, max_steps=max_steps, cache_len=cache_len,
                       sampler=sampler, stop_ids=tuple(int(s) for s in stop_ids), pad_id=pad_id, mesh=mesh,
                       rules=None if rules is None else tuple(sorted(rules.items())))
    return gen if return_cache else gen._replace(cache=None)


def _generate_traced(params, cfg, prompt_BxL, key, max_new_tokens, prompt_mask_BxL, max_steps, sampler, stop_ids,
                     pad_id, cache_len, mesh, rules, return_cache) -> Generation:
    """`generate` for traced inputs: the same program, with the checks that need only shapes."""
    shape = np.shape(prompt_BxL)
    if len(shape) != 2 or 0 in shape:
        raise ValueError(f"prompt must be [B, L] with B, L >= 1, got shape {shape}")
    if prompt_mask_BxL is not None and np.shape(prompt_mask_BxL) != shape:
        raise ValueError(f"prompt_mask shape {np.shape(prompt_mask_BxL)} != prompt shape {shape}")
    if np.ndim(max_new_tokens) > 1 or (np.ndim(max_new_tokens) == 1 and np.shape(max_new_tokens)[0] != shape[0]):
        raise ValueError(f"max_new_tokens must be an int or a [B={shape[0]}] array, got shape "
                         f"{np.shape(max_new_tokens)}")
    if max_steps is None or int(max_steps) < 1:
        raise ValueError(f"generate under a jax transformation needs an explicit max_steps >= 1, got {max_steps}")
    max_steps, width = int(max_steps), bucket(shape[1])
    cache_len = cache_len or width + max_steps
    if cache_len < width + max_steps:
        raise ValueError(f"cache_len {cache_len} < prompt bucket {width} + max_steps {max_steps}")
    mask = jnp.ones(shape, bool) if prompt_mask_BxL is None else jnp.asarray(prompt_mask_BxL, bool)
    pad = ((0, 0), (0, width - shape[1]))
    prompt = jnp.pad(jnp.asarray(prompt_BxL, jnp.int32), pad, constant_values=pad_id)
    max_new = jnp.clip(jnp.broadcast_to(jnp.asarray(max_new_tokens, jnp.int32), (shape[0],)), 0, max_steps)
    gen = generate_jit(params, prompt, jnp.pad(mask, pad), key, max_new, cfg=cfg, max_steps=max_steps,
                       cache_len=cache_len, sampler=sampler, stop_ids=tuple(int(s) for s in stop_ids), pad_id=pad_id,
                       mesh=mesh, rules=None if rules is None else tuple(sorted(rules.items())))
    return gen if return_cache else gen._replace(cache=None)
