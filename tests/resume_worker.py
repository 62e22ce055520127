"""Subprocess for tests/test_checkpoint.py: train a tiny Qwen3 to --steps, checkpointing every step,
optionally killing itself (SIGKILL) right after checkpoint --kill-after is on disk; on start it
resumes from the latest checkpoint in --dir if there is one. Writes the final state to --out.

The batch of each step is a function of the data position and of a key split from the state's
PRNG key, so an exact resume needs both restored.
"""
import argparse
import os
import signal
import sys

os.environ["XLA_FLAGS"] = ""  # one CPU device, whatever the parent had
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxagent.models import qwen3  # noqa: E402
from jaxagent.models.config import Qwen3Config  # noqa: E402
from jaxagent.rl import checkpoint, optim  # noqa: E402
from jaxagent.rl import train_step as ts  # noqa: E402
from jaxagent.rl.memory_plan import MemoryPlan  # noqa: E402
from jaxagent.rl import train_state

CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
TX = optim.make_optimizer(3e-2, schedule="linear_warmup_cosine", warmup_steps=2, total_steps=10,
                          weight_decay=0.01, max_grad_norm=1.0)
B, S = 4, 10


def initial_params():
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: jnp.asarray(1.0 + 0.1 * rng.normal(size=s.shape) if s.ndim == 1
                                              else 0.3 * rng.normal(size=s.shape), jnp.float32),
                        qwen3.param_shapes(CFG))


def batch_for(data_pos: int, key) -> dict:
    rng = np.random.default_rng([data_pos, *np.asarray(jax.random.key_data(key)).tolist()])
    mask = np.arange(S)[None] >= 3
    return {"tokens": jnp.asarray(rng.integers(0, CFG.vocab_size, (B, S)), jnp.int32),
            "policy_mask": jnp.asarray(np.broadcast_to(mask, (B, S))),
            "advantages": jnp.asarray(rng.normal(size=(B, S)), jnp.float32),
            "old_logprobs": jnp.asarray(-4.0 + 0.3 * rng.normal(size=(B, S)), jnp.float32)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="checkpoint directory (none: no checkpoints)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--kill-after", type=int, default=0)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    state, resumed = None, -1
    manager = None
    if args.dir:
        manager = checkpoint.make_manager(args.dir, max_to_keep=args.keep)
        abstract = train_state.abstract_train_state(CFG, TX, params=initial_params())
        state = checkpoint.restore_latest(manager, abstract, cfg=CFG)
        resumed = -1 if state is None else int(state.step)
    if state is None:
        state = train_state.init_train_state(CFG, TX, jax.random.key(42), params=initial_params())
    step = ts.build_train_step(CFG, TX, train_state.LossSettings(clip_high=0.28),
                               MemoryPlan(compiler_options={"xla_backend_optimization_level": 0}))
    losses = []
    while int(state.step) < args.steps:
        state, key = train_state.split_rng(state)
        state, metrics = step(state, batch_for(int(state.data_pos), key))
        state = train_state.advance_data(state, B)
        losses.append(float(metrics["loss"]))
        if manager is not None:
            checkpoint.save(manager, state, CFG)
            if int(state.step) == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # abrupt: no cleanup, no flush
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]}
    np.savez(args.out, step=int(state.step), data_pos=int(state.data_pos), resumed=resumed,
             rng=np.asarray(jax.random.key_data(state.rng)), losses=np.asarray(losses), **flat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
