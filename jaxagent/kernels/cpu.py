"""Compiled CPU kernels for the model's hot paths, called from jitted code through XLA's FFI.

The kernels (`cpu_kernels.cc`), for the paths XLA:CPU runs slowly at decoding and rollout shapes:
- `rows_matmul(x [B, T, K], n_valid [B], w_packed, n) -> [B, T, n]`: x @ w for each row's first n_valid tokens
  (0 for the rest), over weights packed once by `pack_panels` into column panels of 16 ([n / 16, K, 16]);
- `mlp(x, n_valid, gate_up_packed, down_packed)`: the SwiGLU block of many rows in one call;
- `norm_rope(qkv, n_valid, q_norm, k_norm, cos, sin, eps, heads)`: q / k RMS norms and RoPE in one pass;
- `attention(q [B, T, H, E], kt [B, K, E, S], v [B, K, S, E], mask [B, T, S], window, reference, n_valid)
  -> [B, T, H, E]`: softmax(q k^T / sqrt(E) + mask) v over the first `window` slots, `ops.attention`'s semantics,
  its gradient the XLA implementation's (`jax.custom_vjp`).
Built on first use with `$CXX` (default g++) into `$JAXAGENT_KERNEL_CACHE` (default ~/.cache/jaxagent/kernels).
Without a compiler, or with `JAXAGENT_CPU_KERNELS=0`, `available()` is False (`unavailable_reason()` says why) and
the model keeps its XLA paths. The model reaches them only through `jaxagent.models.ops`, chosen when a program is
lowered for CPU: GPU and TPU programs never contain them. Why each kernel, the cache key, and sharded programs:
docs/performance.md, "The CPU kernels".
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

PANEL = 16  # columns per weight panel; must equal kNr in cpu_kernels.cc
_SOURCE = Path(__file__).with_name("cpu_kernels.cc")
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
_TARGETS = {"jaxagent_rows_matmul": "JaxagentRowsMatmul", "jaxagent_mlp": "JaxagentMlp",
            "jaxagent_norm_rope": "JaxagentNormRope",
            "jaxagent_attention": "JaxagentAttention",
            "jaxagent_pack_panels": "JaxagentPackPanels"}


def _cpu_signature() -> str:
    """The CPU's feature flags (Linux), so a shared cache never serves a -march=native build to another CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_key(compiler: str) -> str:
    h = hashlib.sha256()
    for part in (_SOURCE.read_bytes(), jax.__version__.encode(), compiler.encode(), " ".join(_FLAGS).encode(),
                 platform.machine().encode(), _cpu_signature().encode()):
        h.update(part)
    return h.hexdigest()[:20]


def _cache_dir() -> Path:
    return Path(os.environ.get("JAXAGENT_KERNEL_CACHE") or Path.home() / ".cache" / "jaxagent" / "kernels")


def _compile(compiler: str, out: Path) -> None:
    """Builds the shared library into `out` atomically (a temporary file, then a rename), so concurrent
    processes (test workers) never load a half-written library."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", str(_SOURCE), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Optional[ctypes.CDLL], str]:
    """(library, '') once built, loaded and registered with XLA; (None, reason) otherwise. Cached per process."""
    if os.environ.get("JAXAGENT_CPU_KERNELS", "1") == "0":
        return None, "disabled by JAXAGENT_CPU_KERNELS=0"
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not found; set CXX)"
    try:
        name = f"cpu_kernels-{_build_key(compiler)}.so"
        path = _cache_dir() / name
        if not path.exists():
            try:
                _compile(compiler, path)
            except OSError:  # the cache directory is not writable: a per-user temporary one
                path = Path(tempfile.gettempdir()) / f"jaxagent-kernels-{os.getuid()}" / name
                if not path.exists():
                    _compile(compiler, path)
        lib = ctypes.cdll.LoadLibrary(str(path))
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
        return None, f"build or load failed: {e}"
    return lib, ""


def available() -> bool:
    """True when the kernels are built and registered (for XLA's CPU platform; whether a program uses
    them is decided when it is lowered, see `jaxagent.models.ops`)."""
    return _load()[0] is not None


def unavailable_reason() -> str:
    """Why `available()` is False ('' when it is True)."""
    return _load()[1]


def _require() -> None:
    """Builds and registers the kernels if needed; a clear error where they cannot be used."""
    if not available():
        raise RuntimeError(f"jaxagent CPU kernels unavailable: {unavailable_reason()}")


def pack_panels(*ws_KxN: jax.Array) -> jax.Array:
    """w = [w_0 | w_1 | ...] (matrices [K, N_i] side by side, N = sum N_i) as the flat panel layout
    `rows_matmul` and `mlp` read: full 16-column panels [N // 16, K, 16], then the last N % 16 columns as
    [K, N % 16]. One pass by the kernel (XLA's transpose is slower here)."""
    k = ws_KxN[0].shape[0]
    if any(w.ndim != 2 or w.shape[0] != k for w in ws_KxN):
        raise ValueError(f"pack_panels: expects matrices [K, N_i] with one K, got {[w.shape for w in ws_KxN]}")
    n = sum(w.shape[1] for w in ws_KxN)
    _require()
    call = jax.ffi.ffi_call("jaxagent_pack_panels", jax.ShapeDtypeStruct((k * n,), jnp.float32),
                            vmap_method="sequential")
    return call(*(w.astype(jnp.float32) for w in ws_KxN))


def pack_panels_reference(w_KxN) -> np.ndarray:
    """`pack_panels` of one matrix in numpy: the layout's definition, for tests."""
    w = np.asarray(w_KxN)
    k, n = w.shape
    full = n // PANEL * PANEL
    panels = w[:, :full].reshape(k, full // PANEL, PANEL).transpose(1, 0, 2).reshape(-1)
    return np.concatenate([panels, w[:, full:].reshape(-1)])


def rows_matmul(x_BxTxK: jax.Array, n_valid_B: jax.Array, w_packed: jax.Array, n: int) -> jax.Array:
    """y [B, T, n]: y[b, t] = x[b, t] @ w for t < n_valid[b] (clipped to [0, T]), 0 for the other rows;
    w given as `pack_panels(w)`. Only the valid rows are computed (right-padded batches, finished rows).
    Not differentiable."""
    if x_BxTxK.ndim != 3 or n_valid_B.shape != x_BxTxK.shape[:1] or w_packed.shape != (x_BxTxK.shape[2] * n,):
        raise ValueError(f"rows_matmul: x {x_BxTxK.shape}, n_valid {n_valid_B.shape} and packed w "
                         f"{w_packed.shape} do not make [B, T, {n}]")
    _require()
    call = jax.ffi.ffi_call("jaxagent_rows_matmul", jax.ShapeDtypeStruct(x_BxTxK.shape[:2] + (n,), jnp.float32),
                            vmap_method="sequential")
    return call(x_BxTxK.astype(jnp.float32), n_valid_B.astype(jnp.int32), w_packed.astype(jnp.float32))


def mlp(x_BxTxD: jax.Array, n_valid_B: jax.Array, gate_up_packed: jax.Array, down_packed: jax.Array) -> jax.Array:
    """SwiGLU y [B, T, D] = (silu(x @ gate) * (x @ up)) @ down for each row's first n_valid tokens (0 for
    the others), the weights given as `pack_panels(gate, up)` and `pack_panels(down)`; the intermediate
    never leaves the cache. Not differentiable."""
    b, t, d = x_BxTxD.shape
    f = down_packed.shape[0] // d if d else 0
    if n_valid_B.shape != (b,) or gate_up_packed.shape != (2 * f * d,) or f * d != down_packed.shape[0] or f % 8:
        raise ValueError(f"mlp: x {x_BxTxD.shape}, n_valid {n_valid_B.shape}, packed [gate | up] "
                         f"{gate_up_packed.shape} and down {down_packed.shape} do not fit (F a multiple of 8)")
    _require()
    call = jax.ffi.ffi_call("jaxagent_mlp", jax.ShapeDtypeStruct(x_BxTxD.shape, jnp.float32), vmap_method="sequential")
    return call(x_BxTxD.astype(jnp.float32), n_valid_B.astype(jnp.int32), gate_up_packed.astype(jnp.float32),
                down_packed.astype(jnp.float32))


def norm_rope(qkv_BxTxNxE, n_valid_B, q_norm_E, k_norm_E, cos_BxTxE, sin_BxTxE, eps: float, heads: int):
    """(q [B, T, H, E], k [B, T, K, E]) from the fused [q | k | v] product (N = H + 2K heads): the q and k
    heads RMS-normalised (`ops.rms_norm`) and rotated (`ops.rope`, half-split) for each row's first
    n_valid tokens, 0 for the others. Not differentiable."""
    b, t, n, e = qkv_BxTxNxE.shape
    kv = (n - heads) // 2
    if heads + 2 * kv != n or e % 2 or n_valid_B.shape != (b,) or cos_BxTxE.shape != (b, t, e) or \
            sin_BxTxE.shape != (b, t, e) or q_norm_E.shape != (e,) or k_norm_E.shape != (e,):
        raise ValueError(f"norm_rope: qkv {qkv_BxTxNxE.shape} with {heads} query heads, tables {cos_BxTxE.shape} "
                         f"and norms {q_norm_E.shape}, {k_norm_E.shape} do not fit")
    _require()
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    call = jax.ffi.ffi_call("jaxagent_norm_rope", (jax.ShapeDtypeStruct((b, t, heads, e), jnp.float32),
                                                   jax.ShapeDtypeStruct((b, t, kv, e), jnp.float32)),
                            vmap_method="sequential")
    return call(f32(qkv_BxTxNxE), jnp.asarray(n_valid_B, jnp.int32), f32(q_norm_E), f32(k_norm_E), f32(cos_BxTxE),
                f32(sin_BxTxE), eps=np.float32(eps))


def attention(q_BxTxHxE, kt_BxKxExS, v_BxKxSxE, mask_BxTxS, window, reference, n_valid_B=None):
    """softmax(q k^T / sqrt(E) + mask) v over cache slots [0, window), as
    `reference(q, kt, v, mask, traced_window=window)` computes it (`ops.attention`). `window` (int32
    scalar, may be traced) is read at run time. `n_valid_B` [B] (optional): only each row's first
    n_valid queries are computed, the others' outputs are 0 (right-padded appends). Forward by the
    kernel; gradient by autodiff of `reference`. A window outside [1, S] is an error at run time."""
    _require()
    b, t = q_BxTxHxE.shape[:2]
    n = jnp.full((b,), t, jnp.int32) if n_valid_B is None else jnp.asarray(n_valid_B, jnp.int32)
    return _attention(reference, q_BxTxHxE, kt_BxKxExS, v_BxKxSxE, mask_BxTxS, jnp.asarray(window, jnp.int32), n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(reference, q, kt, v, mask, window, n_valid):
    call = jax.ffi.ffi_call("jaxagent_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32),
                            vmap_method="sequential")
    return call(q, kt, v, mask.astype(bool), window, n_valid)


def _attention_fwd(reference, q, kt, v, mask, window, n_valid):
    return _attention(reference, q, kt, v, mask, window, n_valid), (q, kt, v, mask, window, n_valid)


def _attention_bwd(reference, res, g):
    q, kt, v, mask, window, n_valid = res
    t = jnp.arange(q.shape[1])  # the zeroed (padded) queries have no gradient
    g = jnp.where((t[None, :] < n_valid[:, None])[:, :, None, None], g, 0)
    _, vjp = jax.vjp(lambda q, kt, v: reference(q, kt, v, mask, traced_window=window), q, kt, v)
    return (*vjp(g), None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)
