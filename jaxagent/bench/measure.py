"""The accelerator benchmark's measurements: prefill, decode over a filled cache, the study's GRPO train step, and
greedy tokens for the peer comparison (`prefill`, `decode_steps`, `train_step`, `greedy_tokens`). Each returns one
record (a dict of JSON-ready numbers); the caller adds the run's common fields and prints it.

Dimension legend (CONVENTIONS.md): B batch rows, T tokens per row, S cache slots, V vocab.

Each times its own jitted call (`timing.timed`: warm-up calls, then each timed call alone, blocked on its whole
output): prefill, one `sampling.append` of B x T tokens into an empty cache; decode, one `sampling.decode` of
`steps` greedy tokens per row from a cache already holding `context` tokens, the clock over the token loop alone,
never a prefill; the train step, `stages.make_arm_step` compiled ahead of time, then run, with its compiled and
measured memory. Figures: `roofline` (model FLOPs, bytes, MFU, the HBM fraction), each against the datasheet's peak
(a `devices.DeviceSpec`, when there is one) and against the chip's measured one (`peaks.Peaks`, `*_measured_peak`).
What each call holds and the timing rules: docs/performance.md, "The prepared run" (the records; "Rules").
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import sharding as shd
from jaxagent import xla_options
from jaxagent.bench import roofline
from jaxagent.bench.data import prompts, train_batch
from jaxagent.bench.devices import DeviceSpec
from jaxagent.bench.harness import rate
from jaxagent.bench.timing import timed
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.sampling import GREEDY, append, decode, generate, rollout_params


# ----------------------------------------------------------------------------- placement
def _context(mesh):
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _rows(x, mesh):
    """A host array [B, ...] on the default device, or its rows over the mesh's batch axes."""
    x = jnp.asarray(x)
    return x if mesh is None else jax.device_put(x, shd.batch_sharding(mesh, x.ndim, batch_size=x.shape[0]))


def _pin_cache(cache, cfg: Qwen3Config, mesh):
    """The cache in its rule-table sharding on `mesh` (rows over the batch axes, KV heads over tensor)."""
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, shd.shardings_for(qwen3.cache_logical_axes(cfg), cache, mesh))


def decoding_params(params, cfg: Qwen3Config, dtype, mesh=None):
    """The decoding copy the study's rollouts use (`sampling.rollout_params`: cast to `dtype`, on a mesh laid out
    per `sharding.ROLLOUT_RULES`)."""
    return rollout_params(params, cfg, mesh=mesh, compute_dtype=dtype)


def _itemsize(tree) -> int:
    return jax.tree.leaves(tree)[0].dtype.itemsize


# ----------------------------------------------------------------------------- prefill
@functools.partial(xla_options.jit, static_argnames=("cfg", "mesh"))
def _prefill(params, tokens_BxT, *, cfg, mesh=None):
    b, t = tokens_BxT.shape
    cache = _pin_cache(qwen3.init_cache(cfg, b, t, jax.tree.leaves(params)[0].dtype), cfg, mesh)
    return append(params, cfg, cache, tokens_BxT, jnp.full((b,), t, jnp.int32), mesh=mesh)


def prefill(params, cfg: Qwen3Config, *, batch: int, context: int, repeats: int, warmup: int = 1,
            spec: Optional[DeviceSpec] = None, peaks=None, mesh=None, seed: int = 0) -> dict:
    """Prefill of `batch` rows x `context` tokens: time, tokens/s and MFU against the datasheet and the measured
    matmul peak (model FLOPs `roofline.prefill_flops`: what the program computes, the last token's logits)."""
    tokens = _rows(prompts(cfg.vocab_size, batch, context, seed), mesh)
    with _context(mesh):
        t, _ = timed(lambda _: _prefill(params, tokens, cfg=cfg, mesh=mesh), repeats=repeats, warmup=warmup)
    flops = roofline.prefill_flops(cfg, batch, context)
    n = batch * context
    return {"bench": "prefill", "batch": batch, "context": context, "tokens": n, **t.fields(),
            "tokens_per_s": rate(n, t.median_s), "model_flops": flops, "tflops_per_s": flops / t.median_s / 1e12,
            **fractions("mfu", flops, t.median_s, spec and spec.peak_flops, peaks and peaks.flops)}


def fractions(name: str, work: float, seconds: float, datasheet: Optional[float], measured: Optional[float]) -> dict:
    """{name: work / seconds / the datasheet peak, name_measured_peak: ... / the chip's measured peak}, each None
    without its peak."""
    return {name: roofline.fraction(work, seconds, datasheet or None),
            f"{name}_measured_peak": roofline.fraction(work, seconds, measured or None)}


# ----------------------------------------------------------------------------- decode
@functools.partial(xla_options.jit, static_argnames=("cfg", "batch", "slots", "context", "dtype", "mesh"))
def _filled_cache(key, *, cfg, batch, slots, context, dtype, mesh=None):
    """A cache of `slots` slots per row holding `context` tokens: random floating leaves (keys, values), the
    integer leaves (lengths) = context. Written against `qwen3.init_cache`'s leaves, whatever their layout."""
    empty = qwen3.init_cache(cfg, batch, slots, dtype)
    leaves, tree = jax.tree.flatten(empty)
    keys = jax.random.split(key, len(leaves))
    filled = [jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
              else jnp.full(x.shape, context, x.dtype) for k, x in zip(keys, leaves)]
    return _pin_cache(jax.tree.unflatten(tree, filled), cfg, mesh)


@functools.partial(xla_options.jit, static_argnames=("context",), donate_argnames=("cache",))
def _rewind(cache, *, context):
    """The cache's lengths set back to `context` (the keys and values stay): every timed decode starts alike."""
    return jax.tree.map(lambda x: x if jnp.issubdtype(x.dtype, jnp.floating) else jnp.full_like(x, context), cache)


@functools.partial(xla_options.jit, static_argnames=("cfg", "steps", "mesh"), donate_argnames=("cache",))
def _decode_steps(params, cache, logits_BxV, key, *, cfg, steps, mesh=None):
    return decode(params, cfg, cache, logits_BxV, key, steps, max_steps=steps, sampler=GREEDY, stop_ids=(),
                  pad_id=0, mesh=mesh)


def decode_steps(params, cfg: Qwen3Config, *, batch: int, context: int, steps: int, repeats: int,
                 warmup: int = 1, spec: Optional[DeviceSpec] = None, peaks=None, mesh=None, seed: int = 0) -> dict:
    """Greedy decode of `steps` tokens per row after `context` cached ones: ms per step, tokens/s, and the
    fraction of the HBM roofline: `roofline.decode_step_bytes` (weights + the keys and values of the mean
    context, context + (steps - 1) / 2) / step time / HBM bytes/s, the datasheet's and the measured copy's."""
    dtype = jax.tree.leaves(params)[0].dtype
    key = jax.random.key(seed)
    with _context(mesh):
        state = {"cache": _filled_cache(key, cfg=cfg, batch=batch, slots=context + steps, context=context,
                                        dtype=dtype, mesh=mesh)}
        logits = _rows(jax.random.normal(jax.random.fold_in(key, 1), (batch, cfg.vocab_size), jnp.float32), mesh)

        def setup():
            state["cache"] = _rewind(state.pop("cache"), context=context)
            return state["cache"]

        def run(cache):
            state.pop("cache", None)  # donated: the output's cache replaces it
            gen = _decode_steps(params, cache, logits, key, cfg=cfg, steps=steps, mesh=mesh)
            state["cache"] = gen.cache
            return gen

        t, gen = timed(run, repeats=repeats, warmup=warmup, setup=setup)
    got = np.asarray(gen.lengths)
    if not (got == steps).all():
        raise RuntimeError(f"decode generated {sorted(set(got.tolist()))} tokens per row, expected {steps}")
    step_s = t.median_s / steps
    mean_ctx = context + (steps - 1) / 2
    b = roofline.decode_step_bytes(cfg, batch, mean_ctx, _itemsize(params), _itemsize(gen.cache))
    flops = roofline.decode_step_flops(cfg, batch, mean_ctx)
    out = {"bench": "decode", "batch": batch, "context": context, "steps": steps, **t.fields("loop"),
           "ms_per_step": step_s * 1e3, "tokens_per_s": rate(batch, step_s), **b,
           **fractions("hbm_roofline_frac", b["bytes"], step_s, spec and spec.hbm_bytes_per_s,
                       peaks and peaks.bytes_per_s),
           **fractions("mfu", flops, step_s, spec and spec.peak_flops, peaks and peaks.flops)}
    if spec is not None:
        bound = roofline.roofline_seconds(flops, b["bytes"], spec.peak_flops, spec.hbm_bytes_per_s)
        out.update(roofline_ms_per_step=bound["roofline_s"] * 1e3, roofline_tokens_per_s=batch / bound["roofline_s"],
                   roofline_bound=bound["bound"])
    return out


def greedy_tokens(params, cfg: Qwen3Config, prompt_BxL: np.ndarray, new_tokens: int) -> np.ndarray:
    """`generate`'s greedy continuation (no stop token) of each prompt: int [B, new_tokens]."""
    gen = generate(params, cfg, jnp.asarray(prompt_BxL, jnp.int32), jax.random.key(0), max_new_tokens=new_tokens,
                   sampler=GREEDY, stop_ids=())
    return np.asarray(gen.tokens)[:, :new_tokens]


# ----------------------------------------------------------------------------- train step
def memory_fields(compiled=None) -> dict:
    """The compiled program's `memory_analysis()` (argument / output / alias / temp bytes, and its peak where the
    backend reports one) and the first device's `memory_stats()` (peak_bytes_in_use: the process's high-water
    mark so far; bytes_limit), each None where the backend has none (XLA:CPU keeps no device statistics)."""
    out = {}
    if compiled is not None:
        try:
            m = compiled.memory_analysis()
        except Exception:  # noqa: BLE001 -- not every backend implements it
            m = None
        for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                  "peak_memory_in_bytes"):
            out[f"program_{k.replace('_size_in_bytes', '_bytes').replace('_in_bytes', '_bytes')}"] = (
                None if m is None else getattr(m, k, None))
    stats = jax.devices()[0].memory_stats() or {}
    out["device_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    out["device_bytes_limit"] = stats.get("bytes_limit")
    return out


def train_step(cfg: Qwen3Config, state, arm_step, *, rows: int, seq: int, prompt: int, repeats: int,
               warmup: int = 1, spec: Optional[DeviceSpec] = None, peaks=None, mesh=None, seed: int = 0) -> dict:
    """The study's train step (`arm_step`, from `stages.make_arm_step`) from `state` (`init_train_state`'s,
    donated: the caller's reference is spent) on a GRPO batch of rows x seq tokens: step time, tokens/s, MFU
    against the datasheet and the measured matmul peak (`roofline.train_flops`: 6 N per token plus attention,
    recompute not counted), the first step's loss, memory (`memory_fields`)."""
    batch = {k: _rows(v, mesh) for k, v in train_batch(cfg.vocab_size, rows, seq, prompt, seed).items()}
    t0 = time.perf_counter()
    compiled = arm_step.jit.compile(state, batch)
    compile_s = time.perf_counter() - t0
    holder, losses = {"state": state}, []

    def run(_):
        new, m = compiled(holder.pop("state"), batch)  # the state is donated
        holder["state"] = new
        losses.append(m["loss"])
        return new, m

    t, (_, metrics) = timed(run, repeats=repeats, warmup=warmup)
    flops = roofline.train_flops(cfg, rows, seq)
    n = rows * seq
    return {"bench": "train_step", "rows": rows, "seq": seq, "prompt": prompt, "tokens": n, "compile_s": compile_s,
            **t.fields("step"), "tokens_per_s": rate(n, t.median_s), "model_flops": flops,
            "tflops_per_s": flops / t.median_s / 1e12,
            **fractions("mfu", flops, t.median_s, spec and spec.peak_flops, peaks and peaks.flops),
            "first_loss": float(losses[0]), "skipped_total": float(metrics["skipped_total"]), **memory_fields(compiled)}
