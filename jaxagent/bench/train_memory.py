"""Memory of the study's GRPO train step on one chip, and the largest model whose step fits (`--train-model auto`).

Per parameter (N = `Qwen3Config.num_params`), the arm step (`stages.make_arm_step`: f32 master weights, AdamW,
bf16 compute, gradients accumulated over micro-batches, per-layer remat, no KL reference at the GRPO arm):
  state (donated: the new state reuses its buffers)   f32 params 4 B + Adam's two moments 8 B   = 12 B
  step temporaries                                   f32 gradient sum 4 B + the bf16 copy 2 B   =  6 B
and activations of one micro-batch of r = rows / micro_batches rows x T tokens (`activation_bytes`): the saved
block inputs under full remat, L r T D x 2 B, one block's backward (the dense path's f32 attention scores and
probabilities 2 r H T^2 x 4 B, the MLP's r T F x 3 x 4 B) and one log-prob chunk of 512 positions x V x 4 B x 3.
`step_bytes` sums them; `compiled_step_bytes` is the compiled step's `memory_analysis()` on any device (a
compile-only GPU's too). `pick` keeps a model when its `step_bytes` estimate (the activations' terms are upper
bounds) is at most `HEADROOM` = 0.9 of JAX's pool (XLA_PYTHON_CLIENT_MEM_FRACTION of the memory CUDA reports).
tests/test_bench_train_memory.py compiles the step on this CPU at depth 1 and 2 of a small shape and checks the
state's bytes against `step_bytes`. The sizes and pools at the benchmark's shape: docs/performance.md, "The
prepared run" (Memory).
"""
from __future__ import annotations

from typing import Optional

from jaxagent.models.config import Qwen3Config

STATE_BYTES_PER_PARAM = 12   # f32 params + Adam's two f32 moments
TEMP_BYTES_PER_PARAM = 6     # f32 gradient accumulator + the bf16 compute copy
LOGITS_CHUNK = 512           # `rl.logprobs.DEFAULT_LOGITS_CHUNK`: positions unembedded at once
HEADROOM = 0.9


def activation_bytes(cfg: Qwen3Config, *, rows: int, seq: int, micro_batches: int) -> float:
    """Activations of one micro-batch under full remat (module docstring)."""
    r = rows // micro_batches
    saved = cfg.num_hidden_layers * r * seq * cfg.hidden_size * 2
    block = 2 * r * cfg.num_attention_heads * seq * seq * 4 + 3 * r * seq * cfg.intermediate_size * 4
    logits = 3 * min(seq, LOGITS_CHUNK) * r * cfg.vocab_size * 4
    return float(saved + block + logits)


def step_bytes(cfg: Qwen3Config, *, rows: int, seq: int, micro_batches: int) -> dict:
    """{'state', 'temporaries', 'activations', 'total'} bytes of the train step (module docstring)."""
    n = cfg.num_params()
    out = {"state": float(STATE_BYTES_PER_PARAM * n), "temporaries": float(TEMP_BYTES_PER_PARAM * n),
           "activations": activation_bytes(cfg, rows=rows, seq=seq, micro_batches=micro_batches)}
    out["total"] = sum(out.values())
    return out


def compiled_step_bytes(cfg: Qwen3Config, *, rows: int, seq: int, micro_batches: int, device=None,
                        remat: Optional[str] = "full") -> dict:
    """`memory_analysis()` of the GRPO arm step compiled on abstract state and batch (nothing allocated), for
    `device` (default: the first local one; a compile-only device of another platform, e.g. a GPU's from
    `jax.experimental.topologies.get_topology_desc`, compiles for that chip): {'argument', 'output', 'alias',
    'temp'} bytes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from jaxagent.rl.memory_plan import MemoryPlan
    from jaxagent.rl.train_state import init_train_state
    from jaxagent.study import stages
    sh = SingleDeviceSharding(device or jax.devices()[0])
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6)
    step = stages.make_arm_step(cfg, arm, memory=MemoryPlan(compute_dtype="bfloat16", micro_batches=micro_batches,
                                                            remat=remat))
    state = jax.eval_shape(lambda k: init_train_state(cfg, step.optimizer, k), jax.random.key(0))
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), state)
    dtypes = {"tokens": jnp.int32, "policy_mask": jnp.bool_, "advantages": jnp.float32, "old_logprobs": jnp.float32}
    batch = {k: jax.ShapeDtypeStruct((rows, seq), v, sharding=sh) for k, v in dtypes.items()}
    m = step.jit.compile(state, batch).memory_analysis()
    return {k: float(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}


def pick(name: Optional[str], pool_bytes: Optional[float], **shape) -> tuple[str, dict]:
    """(model name, why) for the train step: `name` itself unless it is "auto"; then the first of
    `accel_plan.TRAIN_MODELS` (largest first) whose `step_bytes` total is at most HEADROOM x `pool_bytes` (JAX's
    memory pool, `memory_stats()['bytes_limit']`), or the smallest when the pool is unknown (a CPU host) or none
    fits."""
    from jaxagent.bench.accel_plan import TRAIN_MODELS
    from jaxagent.bench.models import model_config
    if name != "auto":
        return name, {"why": "named on the command line", "need_gb": step_bytes(model_config(name), **shape)["total"]
                      / 1e9 if name in TRAIN_MODELS else None, "pool_gb": pool_bytes and pool_bytes / 1e9}
    if not pool_bytes:
        return TRAIN_MODELS[-1], {"why": "the device reports no memory pool: the smallest", "need_gb": None,
                                  "pool_gb": None}
    for cand in TRAIN_MODELS:
        need = step_bytes(model_config(cand), **shape)["total"]
        if need <= HEADROOM * pool_bytes:
            return cand, {"why": f"the largest whose step ({need / 1e9:.1f} GB) fits {HEADROOM:g} x the pool "
                          f"({pool_bytes / 1e9:.1f} GB)", "need_gb": need / 1e9, "pool_gb": pool_bytes / 1e9}
    return TRAIN_MODELS[-1], {"why": "none fits the pool: the smallest", "need_gb": None, "pool_gb": pool_bytes / 1e9}
