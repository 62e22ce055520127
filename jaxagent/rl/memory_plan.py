"""How a train step trades compute for memory, named once (`MemoryPlan`) and passed whole.

A plan changes what the step holds at a time, never its update (to float rounding): rows in flight
(`micro_batches`), the per-layer `jax.checkpoint` policy (`remat`), the positions unembedded at a time
(`logits_chunk`), where the vocabulary is projected (`policy_tokens`, `packed_policy`; `logits_plan.LogitsPlan`),
the dtype of the forward passes (`compute_dtype`), the layers' loop (`scan_layers`) and the XLA options of the
step's `jax.jit`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp
from jax.sharding import Mesh

from jaxagent.models.config import Qwen3Config
from jaxagent.rl.logits_plan import LogitsPlan
from jaxagent.rl.logprobs import DEFAULT_LOGITS_CHUNK


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The memory knobs of a train step (module doc).

    micro_batches: gradient-accumulation micro-batches per update (row i goes to micro-batch i mod Mb).
    remat: the model's per-layer checkpoint policy (`qwen3.hidden_states(remat=)`; None keeps every activation).
    compute_dtype: the dtype the params are cast to for the forward passes (a name or a jnp dtype; float32 and
      None: no cast; the master params and Adam moments keep theirs), held as a jnp dtype or None.
    logits_chunk: positions per unembedding chunk (`logprobs.next_token_stats`; None: one pass).
    policy_tokens: the most policy tokens a row holds: the vocabulary is projected at each row's policy
      positions only (`LogitsPlan` 'per-row'). packed_policy: at each micro-batch's packed list of them,
      batch['policy_index'] ('packed'). At most one of the two.
    compiler_options: (name, value) XLA options of the step's jax.jit (a dict is taken as its items).
    scan_layers: the forwards run the layers as one `lax.scan` (`qwen3.hidden_states`): one layer compiled,
      and the backward's recomputation bounded to a layer at a time on every platform.
    """

    micro_batches: int = 1
    remat: Optional[str] = None
    compute_dtype: Any = None
    logits_chunk: Optional[int] = DEFAULT_LOGITS_CHUNK
    policy_tokens: Optional[int] = None
    packed_policy: bool = False
    compiler_options: tuple = ()
    scan_layers: bool = False

    def __post_init__(self):
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
        p = self.policy_tokens
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ValueError(f"policy_tokens must be an integer >= 1 or None, got {p!r}")
        if self.packed_policy and p is not None:
            raise ValueError("packed_policy and policy_tokens are two ways to choose the unembedded positions: give one")
        object.__setattr__(self, "compute_dtype", resolve_compute_dtype(self.compute_dtype))
        options = self.compiler_options
        object.__setattr__(self, "compiler_options", tuple((options or {}).items()) if isinstance(options, dict)
                           else tuple(options or ()))

    def options(self) -> Optional[dict]:
        """The compiler options as jax.jit takes them (None: none)."""
        return dict(self.compiler_options) or None

    def logits_plan(self, cfg: Qwen3Config, mesh: Optional[Mesh] = None) -> LogitsPlan:
        """Where and how the step computes its per-token log-probs and entropies."""
        mode = "packed" if self.packed_policy else "full" if self.policy_tokens is None else "per-row"
        return LogitsPlan(cfg, mode=mode, policy_tokens=self.policy_tokens, logits_chunk=self.logits_chunk,
                          remat=self.remat, compute_dtype=self.compute_dtype, mesh=mesh, scan_layers=self.scan_layers)


def resolve_compute_dtype(dtype):
    """None for float32 (the master dtype: nothing to cast) or no dtype; else the jnp dtype."""
    if dtype is None:
        return None
    try:
        dt = jnp.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"compute_dtype {dtype!r} is not a dtype name (e.g. 'float32', 'bfloat16')") from e
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"compute_dtype must be a floating dtype, got {dt}")
    return None if dt == jnp.float32 else dt
