"""The chip's measured peaks, printed beside its datasheet figures (`devices`): what a big bf16 matmul and a big
device copy reach on this chip, with this JAX and XLA. Every roofline fraction of the accelerator benchmark is
given against both: the datasheet's (what the vendor promises) and the measured one (what a program can reach).

  - matmul: `reps` chained products x <- x @ w of bf16 [n, n] matrices (f32 accumulation, bf16 result, w scaled
    by 1/sqrt(n) so the values stay O(1)) in one jitted `fori_loop`; FLOPs = 2 n^3 reps;
  - copy: `reps` passes x <- x * s over a bf16 array of `nbytes` bytes (s a traced scalar, so XLA cannot fold the
    passes away) in one jitted `fori_loop`; bytes moved = 2 nbytes reps (each pass reads and writes the array).
Timing: `timing.timed` (one warm-up call that compiles, then the median of `repeats`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from jaxagent.bench.timing import timed


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Measured bf16 matmul FLOP/s and device-copy bytes/s (None where not measured)."""

    flops: Optional[float]
    bytes_per_s: Optional[float]


@functools.partial(jax.jit, static_argnames=("reps",))
def _matmul_chain(x, w, *, reps):
    return jax.lax.fori_loop(0, reps, lambda _, x: jnp.dot(x, w, preferred_element_type=jnp.float32)
                             .astype(jnp.bfloat16), x)


@functools.partial(jax.jit, static_argnames=("reps",))
def _copy_passes(x, s, *, reps):
    return jax.lax.fori_loop(0, reps, lambda _, x: x * s, x)


def matmul_peak(n: int, reps: int, repeats: int, seed: int = 0) -> dict:
    """bf16 [n, n] @ [n, n] FLOP/s (module docstring)."""
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n, n), jnp.bfloat16)
    w = (jax.random.normal(kw, (n, n), jnp.float32) / n ** 0.5).astype(jnp.bfloat16)
    t, _ = timed(lambda _: _matmul_chain(x, w, reps=reps), repeats=repeats)
    flops = 2.0 * n ** 3 * reps
    return {"matmul_n": n, "matmul_reps": reps, "matmul_s": t.median_s, "matmul_spread": t.spread,
            "matmul_flops": flops, "measured_tflops": flops / t.median_s / 1e12}


def copy_peak(nbytes: int, reps: int, repeats: int) -> dict:
    """Device copy bytes/s over a bf16 array of `nbytes` bytes (module docstring)."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    s = jnp.asarray(1.0, jnp.bfloat16)
    t, _ = timed(lambda _: _copy_passes(x, s, reps=reps), repeats=repeats)
    moved = 2.0 * (nbytes // 2) * 2 * reps
    return {"copy_bytes": (nbytes // 2) * 2, "copy_reps": reps, "copy_s": t.median_s, "copy_spread": t.spread,
            "copy_bytes_moved": moved, "measured_hbm_gbps": moved / t.median_s / 1e9}


def measure(*, matmul_n: int, copy_bytes: int, reps: int = 8, repeats: int = 5, spec=None) -> tuple[dict, Peaks]:
    """(the `peaks` record, the Peaks) of this chip: the matmul and the copy, each beside the datasheet figure of
    `spec` (a `devices.DeviceSpec`, or None) and its fraction of it."""
    mm, cp = matmul_peak(matmul_n, reps, repeats), copy_peak(copy_bytes, reps, repeats)
    rec = {**mm, **cp}
    if spec is not None:
        rec.update(datasheet_tflops=spec.peak_flops / 1e12, datasheet_hbm_gbps=spec.hbm_bytes_per_s / 1e9,
                   matmul_frac_datasheet=mm["measured_tflops"] * 1e12 / spec.peak_flops,
                   copy_frac_datasheet=cp["measured_hbm_gbps"] * 1e9 / spec.hbm_bytes_per_s)
    return rec, Peaks(mm["measured_tflops"] * 1e12, cp["measured_hbm_gbps"] * 1e9)
