"""Value model for PPO: a Qwen3 backbone with a scalar head, as pure functions over a params dict.

Dimension legend: B sequences, T tokens, D model width.

Params: {'backbone': qwen3 params, 'value_head': {'kernel': [D], 'bias': []}}; `logical_axes`
gives the same tree of logical axis names for `sharding.shardings_for`.

Alignment. Values are indexed like `train_step.token_logprobs`: values[:, t] is the value of the
state in which token t was chosen, i.e. of the prefix tokens[:t], read from the hidden state at
position t - 1; values[:, 0] = 0 (no prefix; never a policy token). So the per-token arrays
(logp, old_logp, advantages, values, returns) all share one index: the action token.

Shared backbone. `head_values(value_head, h_BxTxD)` applies the head to any hidden states. With
`ValueSettings(shared_backbone=True)` the train step runs the policy forward once, applies the head
to the policy's own hidden states, and minimises L_pi + vf_coef * L_V: the policy params get the
gradient of both terms, and the critic params are just {'value_head': ...} with their own optimizer.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxagent import sharding, xla_options
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config

CriticParams = dict[str, Any]


def init_head(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32) -> dict:
    """Scalar head: kernel ~ N(0, 0.02^2) [D] (as the backbone's init), bias 0."""
    kernel = 0.02 * jax.random.normal(key, (cfg.hidden_size,), jnp.float32)
    return {"kernel": kernel.astype(dtype), "bias": jnp.zeros((), dtype)}


def init(cfg: Qwen3Config, key: jax.Array, *, dtype=jnp.float32, backbone=None,
         shared_backbone: bool = False) -> CriticParams:
    """Critic params. `backbone` (e.g. the policy's initial params) replaces the random backbone;
    shared_backbone=True returns only {'value_head': ...} (the policy's backbone is used)."""
    k_backbone, k_head = jax.random.split(key)
    head = init_head(cfg, k_head, dtype)
    if shared_backbone:
        return {"value_head": head}
    if backbone is None:
        backbone = qwen3.init(cfg, k_backbone, dtype)
    return {"backbone": backbone, "value_head": head}


def logical_axes(cfg: Qwen3Config, *, shared_backbone: bool = False) -> dict:
    head = {"kernel": ("embed",), "bias": ()}
    if shared_backbone:
        return {"value_head": head}
    return {"backbone": qwen3.logical_axes(cfg), "value_head": head}


def param_shapes(cfg: Qwen3Config, *, shared_backbone: bool = False) -> dict:
    head = {"kernel": jax.ShapeDtypeStruct((cfg.hidden_size,), jnp.float32),
            "bias": jax.ShapeDtypeStruct((), jnp.float32)}
    if shared_backbone:
        return {"value_head": head}
    return {"backbone": qwen3.param_shapes(cfg), "value_head": head}


def head_values(value_head: dict, h_BxTxD: jax.Array) -> jax.Array:
    """Aligned values [B, T] (module doc) from hidden states: v[:, t] = w . h[:, t-1] + b, v[:, 0] = 0."""
    raw_BxT = jnp.einsum("btd,d->bt", h_BxTxD, value_head["kernel"].astype(h_BxTxD.dtype),
                         preferred_element_type=jnp.float32) + value_head["bias"].astype(jnp.float32)
    return jnp.pad(raw_BxT[:, :-1], ((0, 0), (1, 0)))


def values(critic_params: CriticParams, cfg: Qwen3Config, tokens_BxT: jax.Array, *,
           remat: Optional[str] = None, mesh=None, micro_batches: int = 1, scan_layers: bool = False) -> jax.Array:
    """V [B, T] (f32) of a separate-backbone critic, aligned to the action token (module doc).
    `remat` / `mesh` / `scan_layers`: the backbone's per-layer checkpoint policy, activation-sharding mesh and
    layer loop (`qwen3.hidden_states`); the critic never computes vocabulary logits. `micro_batches` M: the rows
    go through the backbone in M chunks (`sharding.map_row_chunks`), which bounds activation memory
    (e.g. the attention scores of B / M rows); the values are the same per row."""
    if "backbone" not in critic_params:
        raise ValueError("critic params have no 'backbone' (shared-backbone critic): apply "
                         "head_values to the policy's hidden states instead")
    if tokens_BxT.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens_BxT.shape}")

    def one(toks_BxT):
        h_BxTxD, _ = qwen3.hidden_states(critic_params["backbone"], cfg, toks_BxT, remat=remat, mesh=mesh,
                                         scan_layers=scan_layers)
        return head_values(critic_params["value_head"], h_BxTxD)

    return sharding.map_row_chunks(one, tokens_BxT, micro_batches, mesh)


def make_values_fn(cfg: Qwen3Config, *, mesh=None, micro_batches: int = 1, remat: Optional[str] = None,
                   compute_dtype=None):
    """`values_fn(critic_params, tokens_BxT) -> V [B, T]`: `values` as one jitted program (PPO's old
    values for GAE, `rl.loop.rl_iteration`). `compute_dtype` (e.g. jnp.bfloat16): floating params cast
    for the forward (as the train step computes the new values). With a `mesh`: params on their
    `logical_axes` shardings (`sharding.RULES`), rows in and out over the mesh's batch axes
    (`sharding.row_sharding`), the residual stream pinned per row (`values(mesh=)`): every chip scores
    only its rows, B / (data x fsdp) / micro_batches at a time. Callers place their arguments on
    those shardings first (`jax.device_put`); `.lower` takes ShapeDtypeStructs carrying them."""

    def fn(cp, tokens_BxT):
        if compute_dtype is not None:
            cp = jax.tree.map(lambda x: x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                              cp)
        return values(cp, cfg, tokens_BxT, remat=remat, mesh=mesh, micro_batches=micro_batches)

    if mesh is None:
        return xla_options.jit(fn, sequence=True)
    p_sh = sharding.shardings_for(logical_axes(cfg), param_shapes(cfg), mesh)
    row = sharding.row_sharding(mesh)
    return xla_options.jit(fn, in_shardings=(p_sh, row), out_shardings=row, sequence=True)
