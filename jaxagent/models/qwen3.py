"""Dense Qwen3: one XLA model as pure functions over a plain params pytree.

NNX modules declare the parameters (shapes, initialisation, logical sharding axes); the computation is plain
functions over `params` (a nested dict of arrays), composing with `jax.jit`, `vmap`, `grad`, `checkpoint`, `lax.scan`.
Platform-dependent operations go through the ops seam (`jaxagent.models.ops`; `ops.prepare(params, cfg)`).

Dimension legend: B batch, T new tokens, S cache slots, D model width, F MLP width, H query heads,
K key/value heads, Q = H / K query heads per KV head, E head dim, V vocab (CONVENTIONS.md).

KV cache (`init_cache`): {'k': [n_layers x (B, K, E, S)], 'v': [n_layers x (B, K, S, E)], 'length': int32[B]}, keys
stored transposed (`ops.attention`). Row b holds its tokens in slots [0, length[b]); a call writes its T tokens at
slots length[b] .. length[b]+T-1 and advances length by n_valid[b] (<= T). Positions (RoPE) equal slot indices, so
right-padded batches, per-row decode and appending an env's reply to a cached history share one path; slots past
`length` may hold stale values, which the causal mask never reads. With a mesh, the residual stream is pinned to
`RESIDUAL_AXES` and the logits to `LOGITS_AXES` (`sharding.RULES`; why: docs/performance.md, "Optimisations").
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent import checks
from jaxagent import sharding as shd
from jaxagent.models import ops
from jaxagent.models.config import Qwen3Config
from jaxagent.models.ops import KVWindows

Params = dict[str, Any]
Cache = dict[str, Any]

# Per-block activation checkpointing (`jax.checkpoint`) policies by name, for `hidden_states(remat=)`.
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only each block's input; recompute the rest
    "dots": jax.checkpoint_policies.checkpoint_dots,  # keep every matmul output
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep the projections' outputs
}
RESIDUAL_AXES = ("activation_batch", "activation_seq", "activation_embed")
LOGITS_AXES = ("activation_batch", "activation_seq", "activation_vocab")


def _normal(rngs: nnx.Rngs, shape, std=0.02):
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


def _param(value, *axes):
    return nnx.Param(value, logical_axes=tuple(axes))


# ------------------------------------------------------------------ parameters (definitions only)
# The NNX modules declare the parameters, their initialisation and their logical sharding axes; the
# computation below is plain functions over the params pytree.
class RMSNorm(nnx.Module):
    def __init__(self, dim: int, axis: str):
        self.weight = _param(jnp.ones((dim,), jnp.float32), axis)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        d, h, k, e = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = _param(_normal(rngs, (d, h, e)), "embed", "q_heads", "head_dim")
        self.k_proj = _param(_normal(rngs, (d, k, e)), "embed", "kv_heads", "head_dim")
        self.v_proj = _param(_normal(rngs, (d, k, e)), "embed", "kv_heads", "head_dim")
        self.o_proj = _param(_normal(rngs, (h, e, d)), "q_heads", "head_dim", "embed")
        if cfg.attention_bias:
            self.q_bias = _param(jnp.zeros((h, e)), "q_heads", "head_dim")
            self.k_bias = _param(jnp.zeros((k, e)), "kv_heads", "head_dim")
            self.v_bias = _param(jnp.zeros((k, e)), "kv_heads", "head_dim")
            self.o_bias = _param(jnp.zeros((d,)), "embed")
        self.q_norm = RMSNorm(e, "head_dim")
        self.k_norm = RMSNorm(e, "head_dim")


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(_normal(rngs, (d, f)), "embed", "mlp")
        self.up_proj = _param(_normal(rngs, (d, f)), "embed", "mlp")
        self.down_proj = _param(_normal(rngs, (f, d)), "mlp", "embed")


class Block(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(cfg.hidden_size, "embed")
        self.attn = Attention(cfg, rngs)
        self.post_norm = RMSNorm(cfg.hidden_size, "embed")
        self.mlp = MLP(cfg, rngs)


class Qwen3(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.embed = _param(_normal(rngs, (cfg.vocab_size, cfg.hidden_size)), "vocab", "embed")
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, "embed")
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(_normal(rngs, (cfg.hidden_size, cfg.vocab_size)), "embed", "vocab")


# ------------------------------------------------------------------ computation
def _norm(cfg: Qwen3Config, p_norm, x):
    return ops.rms_norm(x, p_norm["weight"].astype(x.dtype), cfg.rms_norm_eps)


def _block(cfg: Qwen3Config, window, causal_only: bool, p, x_BxTxD, kv_cache, tok, mask_BxTxS, write_slots_BxT,
           query_index):
    """One decoder block: x + attn(norm(x)), then + mlp(norm(.)); returns (x, (k cache, v cache) or None).
    `causal_only`: without a cache, `mask_BxTxS` is the plain causal mask (no padding hidden).

    Keys and values of all T tokens (written to the cache); queries of all T, or with `query_index` [B]
    of that one token per row (output [B, 1, D]). `tok`: the token-side value (`ops.tokens`)."""
    pa = p["attn"]
    q, k, v = ops.qkv(cfg, pa, _norm(cfg, p["input_norm"], x_BxTxD), tok, query_index)
    tok_q = ops.at_query(tok, query_index)
    if query_index is not None:
        mask_BxTxS = ops.rows(mask_BxTxS, query_index)
    if kv_cache is not None:
        k_cache, v_cache = kv_cache  # k [B, K, E, S], v [B, K, S, E]: attention reads them without a transpose
        b_idx = jnp.arange(k.shape[0])[:, None]
        # [b, :, :, slot] / [b, :, slot] indexing takes values [B, T, K, E]; writes past the cache end are
        # dropped (mode='drop'): callers bound lengths on the host.
        k_cache = k_cache.at[b_idx, :, :, write_slots_BxT].set(k.astype(k_cache.dtype), mode="drop")
        v_cache = v_cache.at[b_idx, :, write_slots_BxT].set(v.astype(v_cache.dtype), mode="drop")
        kv_cache = (k_cache, v_cache)
        out = ops.attend_cached(cfg, q, k_cache, v_cache, mask_BxTxS, window, tok_q)
    else:
        out = ops.causal_attention(cfg, q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask_BxTxS,
                                   causal_only=causal_only)
    # As one [B*T, H*E] @ [H*E, D] GEMM: with the 3-D einsum XLA chose to contract (e, h) and copied
    # the whole o_proj weight into that order on every decode step.
    b, t = out.shape[:2]
    a = ops.out_proj(cfg, pa, out.reshape(b, t, -1), tok_q)
    if cfg.attention_bias:
        a = a + pa["o_bias"]
    x = (x_BxTxD if query_index is None else ops.rows(x_BxTxD, query_index)) + a
    return x + ops.mlp(p["mlp"], _norm(cfg, p["post_norm"], x), tok_q), kv_cache


# ------------------------------------------------------------------ pure API
@functools.lru_cache(maxsize=32)
def _abstract(cfg: Qwen3Config):
    """(graphdef, abstract state) of the module for `cfg`; traced once per config, no arrays made."""
    return nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, nnx.Rngs(0))))


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def init(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32) -> Params:
    """Random weights (normal(0, 0.02) matrices, unit norms, as HF's init) as a nested dict."""
    state = nnx.state(Qwen3(cfg, nnx.Rngs(params=key)))
    return jax.tree.map(lambda x: x.astype(dtype), nnx.to_pure_dict(state))


def param_shapes(cfg: Qwen3Config) -> Params:
    """The params pytree as `jax.ShapeDtypeStruct`s (f32), without allocating."""
    return nnx.to_pure_dict(_abstract(cfg)[1])


def logical_axes(cfg: Qwen3Config) -> Params:
    """Logical axis names of every parameter (same pytree as params); the one source for shardings."""
    state = _abstract(cfg)[1]
    axes = jax.tree.map(lambda v: v.get_metadata()["logical_axes"], state,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(axes)


def untied(params: Params, cfg: Qwen3Config) -> tuple[Params, Qwen3Config]:
    """(params, cfg) with a tied LM head made explicit: lm_head = embed^T, a [D, V] copy.

    Same logits; the head then has its own parameter (to fine-tune or shard apart from the embeddings).
    Untied models pass through.
    """
    if not cfg.tie_word_embeddings:
        return params, cfg
    return {**params, "lm_head": params["embed"].T}, dataclasses.replace(cfg, tie_word_embeddings=False)


def init_cache(cfg: Qwen3Config, batch: int, max_len: int, dtype=jnp.float32) -> Cache:
    """An empty KV cache with `max_len` slots per row."""
    k_shape = (batch, cfg.num_key_value_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
    return {"k": [jnp.zeros(k_shape, dtype) for _ in range(cfg.num_hidden_layers)],
            "v": [jnp.zeros(v_shape, dtype) for _ in range(cfg.num_hidden_layers)],
            "length": jnp.zeros((batch,), jnp.int32)}


CACHE_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")     # values
KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_seq")  # keys, stored transposed


def cache_logical_axes(cfg: Qwen3Config) -> Cache:
    return {"k": [KEY_CACHE_AXES] * cfg.num_hidden_layers, "v": [CACHE_AXES] * cfg.num_hidden_layers,
            "length": ("batch",)}


def hidden_states(params: Params, cfg: Qwen3Config, tokens_BxT, *, positions=None, attention_mask=None,
                  cache: Optional[Cache] = None, n_valid=None,
                  kv_window: Union[int, KVWindows, None] = None, index=None, remat: Optional[str] = None,
                  mesh=None, scan_layers: bool = False):
    """Final-norm hidden states [B, T, D] and the updated cache (see `forward` for the arguments);
    with `index` [B], only that token's hidden state per row ([B, 1, D]); the cache gets every token.

    `remat`: None (keep every activation for the backward), or a `REMAT_POLICIES` name: each decoder
    block runs under `jax.checkpoint` with that policy ('full': save only the block's input and
    recompute the rest in the backward; 'dots': save every matmul output; 'dots_no_batch': save the
    matmuls without batch dimensions, i.e. the projections, and recompute attention). Same values and
    gradients, less activation memory. `mesh`: pins the residual stream to `RESIDUAL_AXES`.
    `scan_layers` (without a cache): the layers (all but an `index`ed last one) run as one `lax.scan` over their
    weights stacked per call: one layer is traced and compiled instead of all, and under `remat` the backward
    recomputes a layer only when its gradient arrives (XLA:CPU otherwise schedules every layer's recomputation
    up front, so an unrolled train step holds each layer's attention temporaries at once). Same values to f32
    rounding; the stacked copy of the layer weights is held for the call."""
    if remat is not None and remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r}: expected None or one of {sorted(REMAT_POLICIES)}")
    b, t = tokens_BxT.shape
    tokens_BxT = jnp.clip(tokens_BxT, 0, cfg.vocab_size - 1)  # out-of-range ids never index garbage
    if cache is None:
        slots_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        mask = slots_BxT[:, :, None] >= slots_BxT[:, None, :]
        if attention_mask is not None:
            mask = mask & attention_mask.astype(bool)[:, None, :]
        write_slots = None
    else:
        s = cache["v"][0].shape[2]
        slots_BxT = cache["length"][:, None] + jnp.arange(t, dtype=jnp.int32)
        mask = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= slots_BxT[:, :, None]
        write_slots = slots_BxT
    positions = slots_BxT if positions is None else positions
    if kv_window is not None:
        sizes = kv_window.sizes if isinstance(kv_window, KVWindows) else (kv_window,)
        if cache is None or not all(0 < w <= cache["v"][0].shape[2] for w in sizes):
            raise ValueError(f"kv_window={sizes} needs a cache with at least that many slots")
    if index is not None and t == 1:
        index = None  # one token per row already: decode steps skip the gathers
    n = jnp.full((b,), t, jnp.int32) if n_valid is None else jnp.clip(n_valid.astype(jnp.int32), 0, t)

    block = functools.partial(_block, cfg, kv_window, attention_mask is None)
    if remat is not None:
        block = jax.checkpoint(block, policy=REMAT_POLICIES[remat])
    # Python loop over layers, not lax.scan: the choice and its measurement are in docs/performance.md.
    # With index only that token's output is wanted: the last layer still writes every token's keys
    # and values but runs attention queries, o_proj and the MLP for that token alone.
    # FSDP: the table gathered over its embed dimension first (as every weight is), so the lookup is
    # a vocab-parallel gather, not an all-to-all of the rows
    embed = shd.constrain(params["embed"], ("vocab", None), mesh)
    x = shd.constrain(jnp.take(embed, tokens_BxT, axis=0), RESIDUAL_AXES, mesh)
    tok = ops.tokens(params, ops.rope_tables(positions, cfg.head_dim, cfg.rope_theta), None if cache is None else n)
    new_k, new_v = [], []
    scanned = cfg.num_hidden_layers - (index is not None) if scan_layers and cache is None else 0
    if scanned:
        stacked = jax.tree.map(lambda *w: jnp.stack(w), *[params["layers"][i] for i in range(scanned)])

        def scan_body(x_BxTxD, p):
            x_BxTxD, _ = block(p, x_BxTxD, None, tok, mask, None, None)
            return shd.constrain(x_BxTxD, RESIDUAL_AXES, mesh), None
        x, _ = jax.lax.scan(scan_body, x, stacked)
    for i in range(scanned, cfg.num_hidden_layers):
        kv = None if cache is None else (cache["k"][i], cache["v"][i])
        last = i == cfg.num_hidden_layers - 1
        x, kv = block(params["layers"][i], x, kv, tok, mask, write_slots, index if last else None)
        x = shd.constrain(x, RESIDUAL_AXES, mesh)
        if kv is not None:
            new_k.append(kv[0])
            new_v.append(kv[1])
    h = _norm(cfg, params["norm"], x)
    if cache is not None:
        cache = {"k": new_k, "v": new_v, "length": cache["length"] + n}
    return h, cache


def unembed(params: Params, cfg: Qwen3Config, h_BxTxD, *, mesh=None):
    """Logits [B, T, V] in f32 from hidden states. `mesh`: pins them to `LOGITS_AXES`."""
    return shd.constrain(ops.unembed(cfg, params, h_BxTxD), LOGITS_AXES, mesh)


PARAM_KEYS = ("embed", "layers", "norm")  # what every params dict of the model has (`init`, `weights.load`)


def check_params(params, cfg: Qwen3Config, where: str = "qwen3.forward") -> None:
    """The params dict of `cfg`'s model: its top-level keys, the embedding's shape and a floating dtype (one
    TypeError / ValueError naming what is wrong; shapes and dtypes only, so at trace time too)."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params must be the model's params dict (qwen3.init / weights.load); got "
                        f"{type(params).__name__}")
    missing = [k for k in PARAM_KEYS if k not in params]
    if missing:
        raise TypeError(f"{where}: params lacks {missing} (it has {sorted(map(str, params))[:8]}): pass the "
                        "model's params dict (qwen3.init / weights.load)")
    embed = params["embed"]
    if tuple(getattr(embed, "shape", ())) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"{where}: params['embed'] is {list(getattr(embed, 'shape', ()))} but cfg says [V={cfg.vocab_size}, "
                         f"D={cfg.hidden_size}]: params and cfg belong to different models")
    for name, w in (("params['embed']", embed), *(("params['norm']", x) for x in jax.tree.leaves(params["norm"]))):
        dtype = getattr(w, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"{where}: the weights must be floating-point (float32, bfloat16, float16); "
                            f"{name} is {checks.describe(w)}")


def check_token_range(where: str, name: str, tokens, vocab_size: int) -> None:
    """ValueError when concrete token ids fall outside [0, vocab_size). Traced ids (under `jax.jit`, `vmap`,
    `eval_shape`) are not checked: no value exists while tracing, and a check in the program would change it;
    the model clips them into range there (`hidden_states`)."""
    if isinstance(tokens, jax.core.Tracer) or not getattr(tokens, "size", 0):
        return
    if isinstance(tokens, jax.Array) and not tokens.is_fully_addressable:
        return  # another host's rows: each process checks its own
    with jax.ensure_compile_time_eval():  # concrete ids inside a trace (a constant of a jitted caller): eager
        lo, hi = (int(v) for v in jax.device_get((jnp.min(tokens), jnp.max(tokens))))
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{where}: {name} holds token ids in [{lo}, {hi}] but the vocabulary has {vocab_size} "
                         f"(ids 0..{vocab_size - 1})")


def _check_forward_args(params, cfg, tokens_BxT, positions, attention_mask, cache, n_valid, logits_index):
    """`forward`'s arguments by type, shape and dtype (`jaxagent.checks`: at trace time, free when compiled), and
    the token ids' range when they are concrete (`check_token_range`)."""
    where = "qwen3.forward"
    if not isinstance(cfg, Qwen3Config):
        raise TypeError(f"{where}: cfg must be a Qwen3Config; got {type(cfg).__name__}")
    check_params(params, cfg, where)
    if cache is not None and not (isinstance(cache, dict) and "length" in cache):
        raise TypeError(f"{where}: cache must be a dict from qwen3.init_cache; got {type(cache).__name__}")
    for name, x in (("tokens_BxT", tokens_BxT), ("positions", positions), ("attention_mask", attention_mask),
                    ("n_valid", n_valid), ("logits_index", logits_index)):
        if x is not None and not hasattr(x, "shape"):  # as jax.numpy: a list is no array
            raise TypeError(f"{where}: {name} must be an array (jnp.asarray(x, jnp.int32)); got {type(x).__name__}")
    checks.arrays(where, [("tokens_BxT", tokens_BxT, "BT", "integer"), ("positions", positions, "BT", "integer"),
                          ("attention_mask", attention_mask, "BT", "number"), ("n_valid", n_valid, "B", "integer"),
                          ("logits_index", logits_index, "B", "integer"),
                          ("cache['length']", None if cache is None else cache["length"], "B", "integer")])
    check_token_range(where, "tokens_BxT", tokens_BxT, cfg.vocab_size)


def forward(params: Params, cfg: Qwen3Config, tokens_BxT, *, positions=None, attention_mask=None,
            cache: Optional[Cache] = None, n_valid=None, logits_index=None,
            kv_window: Union[int, KVWindows, None] = None, remat: Optional[str] = None, mesh=None):
    """Logits [B, T, V] (f32) and the updated cache.

    Without a cache: causal attention over the T tokens; `attention_mask` [B, T] (1 = real token)
    hides padding keys; `positions` [B, T] overrides RoPE positions (default 0..T-1), e.g. for
    left-padded batches. With a cache: the T tokens are appended at each row's `cache['length']`,
    attend to the row's history, and `length` advances by `n_valid` [B] (default T): rows of a
    right-padded batch, finished rows (n_valid 0) and multi-turn appends all take this path.
    `logits_index` [B]: return only the logits at that token index per row ([B, 1, V]); the last
    layer then computes attention queries, o_proj and the MLP for that token only.
    `kv_window` (static int, with a cache): attend only to the first kv_window slots; the caller
    guarantees length + T <= kv_window for every row whose outputs it uses (rows past it read a
    truncated history). Writes still go to the full cache. Saves attention work when the cache is
    mostly empty (prefill, early turns). A `KVWindows` (see `ops.choose_window`) picks one of a few static
    windows at run time: a `lax.switch` around each layer's attention core (the CPU kernel reads the
    window at run time instead).
    `params` may be `ops.prepare(params, cfg)`'s: a program lowered for CPU then runs the projections by
    the GEMM kernel, which (with a cache and `n_valid`) computes only each row's first n_valid tokens:
    their logits equal the XLA path's up to f32 rounding, the other positions' are unspecified (0
    there). Programs for other platforms compute the same as with `params`. Not differentiable.
    `remat`, `mesh`: see `hidden_states` (`mesh` also pins the logits to `LOGITS_AXES`).
    Arguments of the wrong kind, rank or dtype (e.g. float tokens, a list, integer weights) raise TypeError /
    ValueError naming them; concrete token ids outside [0, V) raise ValueError. Under `jax.jit` (traced ids)
    out-of-range ids are clipped into range instead: a check there would need a value the trace does not have.
    """
    _check_forward_args(params, cfg, tokens_BxT, positions, attention_mask, cache, n_valid, logits_index)
    h, cache = hidden_states(params, cfg, tokens_BxT, positions=positions, attention_mask=attention_mask,
                             cache=cache, n_valid=n_valid, kv_window=kv_window, index=logits_index, remat=remat,
                             mesh=mesh)
    # a cached append's valid positions per row: later positions' logits are unspecified
    logits = ops.unembed(cfg, params, h, None if cache is None else n_valid)
    return shd.constrain(logits, LOGITS_AXES, mesh), cache

