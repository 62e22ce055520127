"""One process of the two-process CPU run in tests/test_multihost.py, and the shared `run` that the
single-process reference calls too.

As a script (JAX_PLATFORMS=cpu, XLA_FLAGS=--xla_force_host_platform_device_count=4 set by the
parent): gloo CPU collectives, `jax.distributed.initialize` on 127.0.0.1, one (2, 2, 2) mesh over
the 8 global devices, the same global batch on every process (`jax.make_array_from_callback` from a
fixed seed), two sharded train steps; writes losses, a params checksum and the gathered params.
"""
import os
import sys

import numpy as np
from jaxagent.rl import train_state

CFG_KW = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8)
B, S, STEPS = 8, 12, 2
MESH = (2, 2, 2)


def global_batch(step: int) -> dict:
    rng = np.random.default_rng(1000 + step)
    mask = (np.arange(S)[None] >= 3) & (rng.random((B, S)) < 0.8)
    return {"tokens": rng.integers(0, CFG_KW["vocab_size"], (B, S)).astype(np.int32),
            "policy_mask": mask,
            "advantages": rng.normal(size=(B, S)).astype(np.float32),
            "old_logprobs": (-4.0 + 0.3 * rng.normal(size=(B, S))).astype(np.float32)}


def run():
    """Trains STEPS sharded steps on the global mesh; returns (losses, checksum, params as numpy)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxagent import sharding
    from jaxagent.models import qwen3
    from jaxagent.models.config import Qwen3Config
    from jaxagent.rl import optim
    from jaxagent.rl import train_step as ts
    from jaxagent.rl.memory_plan import MemoryPlan

    cfg = Qwen3Config(**CFG_KW)
    tx = optim.make_optimizer(1e-2, weight_decay=0.01, max_grad_norm=1.0)
    mesh = sharding.make_mesh(*MESH)
    rng = np.random.default_rng(0)
    params_np = jax.tree.map(lambda s: (1.0 + 0.1 * rng.normal(size=s.shape) if s.ndim == 1
                                        else 0.3 * rng.normal(size=s.shape)).astype(np.float32),
                             qwen3.param_shapes(cfg))
    p_sh = train_state.state_shardings(cfg, tx, mesh).params
    # every process holds the same host copy; each device takes its slice
    params = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                          params_np, p_sh)
    state = train_state.init_train_state(cfg, tx, jax.random.key(0), mesh=mesh, params=params)
    step = ts.build_train_step(cfg, tx, train_state.LossSettings(clip_high=0.28), MemoryPlan(
        micro_batches=2, compiler_options={"xla_backend_optimization_level": 0}), mesh)
    row_sh = NamedSharding(mesh, P(("data", "fsdp")))
    losses = []
    for i in range(STEPS):
        batch = {k: jax.make_array_from_callback(v.shape, row_sh, lambda idx, v=v: v[idx])
                 for k, v in global_batch(i).items()}
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))  # metrics are replicated: readable on every process
    checksum = float(jax.jit(lambda p: sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(p)),
                             out_shardings=sharding.replicated(mesh))(state.params))
    gathered = multihost_utils.process_allgather(state.params, tiled=True)
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(gathered)[0]}
    return np.asarray(losses), checksum, flat


def main(argv=None):
    from tests.multiprocess import init_worker
    out = init_worker(argv)
    import jax
    losses, checksum, flat = run()
    np.savez(out, losses=losses, checksum=checksum, process_count=jax.process_count(), **flat)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
