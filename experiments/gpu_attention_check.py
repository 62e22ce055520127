"""On an NVIDIA GPU: cuDNN's fused attention (the model's CUDA branch, `jaxagent.models.ops_gpu`) against the dense
attention every other platform runs, values, gradients and time; exit status 1 when they differ beyond bf16 tolerance.

    python -m experiments.gpu_attention_check [--json]

Cases (bf16, Qwen3-8B's heads: H 32, K 8, E 128): plain causal attention (the train step's, T = S), with its
gradients; a cached append (each row's queries at its own offset in the cache: the mask as the kernel's bias); then
the milliseconds of forward + backward at 4096 tokens, fused and dense. A tolerance: the largest |fused - dense|
over the largest |dense| (both in f32), at most 2e-2 (bf16 has 8 bits of mantissa: 3.9e-3 per rounding).
"""
from __future__ import annotations

import json
import sys
import time

from experiments import cli
from jaxagent.models.config import Qwen3Config

# JAX and the model's ops are imported by the functions that use them: --help answers without loading them.

CFG = Qwen3Config(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
TOLERANCE = 2e-2


def _inputs(key, b, t, s):
    import jax
    import jax.numpy as jnp
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (b, t, CFG.num_attention_heads, CFG.head_dim), jnp.bfloat16)
    kt = jax.random.normal(kk, (b, CFG.num_key_value_heads, CFG.head_dim, s), jnp.bfloat16)
    v = jax.random.normal(kv, (b, CFG.num_key_value_heads, s, CFG.head_dim), jnp.bfloat16)
    return q, kt, v


def _error(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def causal_case(key, b=2, t=1024) -> dict:
    """Forward and gradients of plain causal attention, fused vs dense."""
    import jax
    import jax.numpy as jnp
    from jaxagent.models import ops, ops_gpu
    q, kt, v = _inputs(key, b, t, t)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))

    def fused(q, kt, v):
        return ops_gpu.attention(q, kt, v, mask, causal_only=True)

    def dense(q, kt, v):
        return ops.attention(CFG, q, kt, v, mask)
    cot = jax.random.normal(jax.random.fold_in(key, 1), q.shape, jnp.bfloat16)
    out = {}
    for name, fn in (("fused", fused), ("dense", dense)):
        y, vjp = jax.jit(lambda q, kt, v, fn=fn: jax.vjp(fn, q, kt, v))(q, kt, v)
        out[name] = (y, *vjp(cot))
    errs = {f"{n}_error": _error(f, d) for n, f, d in zip(("out", "dq", "dkt", "dv"), out["fused"], out["dense"])}
    return {"case": f"causal {b}x{t}", **errs}


def append_case(key, b=4, t=256, s=1024) -> dict:
    """A cached append: row r's queries at slots length[r] .. length[r] + t - 1 of an s-slot cache."""
    import jax
    import jax.numpy as jnp
    from jaxagent.models import ops, ops_gpu
    q, kt, v = _inputs(key, b, t, s)
    length = jnp.arange(b) * ((s - t) // max(b - 1, 1))
    mask = jnp.arange(s)[None, None, :] <= (length[:, None] + jnp.arange(t))[:, :, None]
    fused = jax.jit(lambda q, kt, v, m: ops_gpu.attention(q, kt, v, m))(q, kt, v, mask)
    dense = jax.jit(lambda q, kt, v, m: ops.attention(CFG, q, kt, v, m))(q, kt, v, mask)
    return {"case": f"append {b}x{t} into {s} slots", "out_error": _error(fused, dense)}


def timing_case(key, b=1, t=4096, repeats=10) -> dict:
    """Median milliseconds of forward + backward, fused and dense."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxagent.models import ops, ops_gpu
    q, kt, v = _inputs(key, b, t, t)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    fns = {"fused": lambda q, kt, v: ops_gpu.attention(q, kt, v, mask, causal_only=True),
           "dense": lambda q, kt, v: ops.attention(CFG, q, kt, v, mask)}
    rec = {"case": f"time fwd+bwd {b}x{t}"}
    for name, fn in fns.items():
        step = jax.jit(jax.grad(lambda q, kt, v, fn=fn: fn(q, kt, v).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
        jax.block_until_ready(step(q, kt, v))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(step(q, kt, v))
            times.append(time.perf_counter() - t0)
        rec[f"{name}_ms"] = round(1e3 * float(np.median(times)), 3)
    return rec


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m experiments.gpu_attention_check", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line per case")
    args = p.parse_args(argv)
    import jax
    from jaxagent.models import ops_gpu
    if jax.default_backend() != "gpu":
        raise SystemExit(f"needs an NVIDIA GPU (jax's default backend here: {jax.default_backend()})")
    if not ops_gpu.available():
        raise SystemExit("cuDNN attention cannot be built here: install jax[cuda12] (it brings cuDNN)")
    key = jax.random.key(0)
    recs = [causal_case(key), append_case(jax.random.fold_in(key, 2)), timing_case(jax.random.fold_in(key, 3))]
    ok = True
    for rec in recs:
        errs = [v for k, v in rec.items() if k.endswith("_error")]
        rec["ok"] = all(e <= TOLERANCE for e in errs)
        ok &= rec["ok"]
        rec["device"] = jax.devices()[0].device_kind
        print(json.dumps(rec) if args.json else "  ".join(f"{k} {v}" for k, v in rec.items()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
