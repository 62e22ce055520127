"""Settings and state of the RL train step: the loss and critic settings, the `TrainState` pytree,
its NamedShardings on a (data, fsdp, tensor) mesh, and its initialisation (concrete or abstract).

Dimension legend: B sequences, S tokens, D model width.

Shardings: params per `qwen3.logical_axes` and `sharding.RULES`, every optimizer-state leaf like the
parameter it tracks (optax.tree_map_params), scalars replicated; a separate critic likewise
(`critic.logical_axes`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from jaxagent import sharding
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic as critic_lib
from jaxagent.rl import losses


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Scalars of the policy loss (see `losses.policy_loss`); hashable, a static jit argument."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    norm_len: Optional[int] = None
    tis_cap: Optional[float] = None   # truncated importance sampling cap C (None: off)

    def __post_init__(self):
        if self.agg_mode not in losses.AGG_MODES:
            raise ValueError(f"agg_mode must be one of {losses.AGG_MODES}, got {self.agg_mode!r}")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"tis_cap must be > 0 (or None for off), got {self.tis_cap}")
        if self.kl_estimator not in losses.KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {losses.KL_ESTIMATORS}, "
                             f"got {self.kl_estimator!r}")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip_low/clip_high must be >= 0, got {self.clip_low}, {self.clip_high}")
        if self.norm_len is not None and self.norm_len <= 0:
            raise ValueError(f"norm_len must be positive, got {self.norm_len}")


@dataclasses.dataclass(frozen=True)
class ValueSettings:
    """The PPO critic: clipped value loss (`losses.value_loss`) and where its backbone lives.

    shared_backbone=False: a separate Qwen3 critic (`critic_cfg`) with its own optimizer, trained on
    L_V alone. shared_backbone=True: the head sits on the policy's hidden states and the policy
    minimises L_pi + vf_coef * L_V (vf_coef is unused for a separate critic).
    """

    clip_eps: float = 0.2
    vf_coef: float = 0.5
    agg_mode: str = "token-mean"
    shared_backbone: bool = False

    def __post_init__(self):
        if self.agg_mode not in losses.AGG_MODES:
            raise ValueError(f"agg_mode must be one of {losses.AGG_MODES}, got {self.agg_mode!r}")
        if self.clip_eps < 0 or self.vf_coef < 0:
            raise ValueError(f"clip_eps and vf_coef must be >= 0, got {self.clip_eps}, {self.vf_coef}")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["params", "opt_state", "step", "rng", "data_pos", "ref_params",
                                "critic_params", "critic_opt_state"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a run needs to continue exactly (a pytree; optional parts are None).

    step: int32 count of train-step calls (skipped ones included). rng: a typed PRNG key the train
    step does not consume (the loop's: sampling, shuffles; see `split_rng`). data_pos: int32
    position in the task/data stream, advanced by the caller (`advance_data`).
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    data_pos: jax.Array
    ref_params: Any = None
    critic_params: Any = None
    critic_opt_state: Any = None

    def replace(self, **kw) -> "TrainState":
        return dataclasses.replace(self, **kw)


def split_rng(state: TrainState) -> tuple[TrainState, jax.Array]:
    """(state with a fresh key, a key to use now): keys are split at the call site, never reused."""
    new, use = jax.random.split(state.rng)
    return state.replace(rng=new), use


def advance_data(state: TrainState, n) -> TrainState:
    return state.replace(data_pos=state.data_pos + jnp.asarray(n, jnp.int32))


# ----------------------------------------------------------------------------- shardings
def opt_state_shardings(optimizer, abstract_opt_state, param_shardings, mesh):
    """NamedShardings of an optax state: each leaf that tracks a parameter like it, the rest replicated."""
    return optax.tree_map_params(
        optimizer, lambda _, s: s, abstract_opt_state, param_shardings,
        transform_non_params=lambda _: sharding.replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding))


def state_shardings(cfg: Qwen3Config, optimizer, mesh: Mesh, *, with_ref_params: bool = False,
                    value_settings: Optional[ValueSettings] = None,
                    critic_cfg: Optional[Qwen3Config] = None, critic_optimizer=None) -> TrainState:
    """A TrainState of NamedShardings: params per `qwen3.logical_axes` and `sharding.RULES`, each
    optimizer-state leaf like the parameter it tracks (optax.tree_map_params), scalars replicated."""
    shapes = qwen3.param_shapes(cfg)
    p_sh = sharding.shardings_for(qwen3.logical_axes(cfg), shapes, mesh)
    o_sh = opt_state_shardings(optimizer, jax.eval_shape(optimizer.init, shapes), p_sh, mesh)
    rep = sharding.replicated(mesh)
    c_sh = co_sh = None
    if value_settings is not None:
        shared = value_settings.shared_backbone
        ccfg = critic_config(cfg, value_settings, critic_cfg)
        c_shapes = critic_lib.param_shapes(ccfg, shared_backbone=shared)
        c_sh = sharding.shardings_for(critic_lib.logical_axes(ccfg, shared_backbone=shared),
                                      c_shapes, mesh)
        copt = critic_optimizer if critic_optimizer is not None else optimizer
        co_sh = opt_state_shardings(copt, jax.eval_shape(copt.init, c_shapes), c_sh, mesh)
    return TrainState(params=p_sh, opt_state=o_sh, step=rep, rng=rep, data_pos=rep,
                      ref_params=p_sh if with_ref_params else None, critic_params=c_sh,
                      critic_opt_state=co_sh)


def critic_config(cfg, value_settings, critic_cfg):
    """The critic's model config: the policy's `cfg` for a shared-backbone critic (a different `critic_cfg` is
    a ValueError), else `critic_cfg` (default: `cfg`)."""
    if value_settings.shared_backbone:
        if critic_cfg is not None and critic_cfg != cfg:
            raise ValueError("a shared-backbone critic uses the policy config; do not pass a "
                             "different critic_cfg")
        return cfg
    return cfg if critic_cfg is None else critic_cfg


# ----------------------------------------------------------------------------- init
def init_train_state(cfg: Qwen3Config, optimizer, key: jax.Array, *, mesh: Optional[Mesh] = None,
                     params=None, with_ref_params: bool = False,
                     value_settings: Optional[ValueSettings] = None,
                     critic_cfg: Optional[Qwen3Config] = None, critic_optimizer=None,
                     critic_params=None, data_pos: int = 0) -> TrainState:
    """A fresh TrainState (random params unless given), placed on the mesh's shardings if any.

    `key` may be a typed key (jax.random.key) or a raw uint32 key. ref_params start as a copy of
    params (the frozen KL reference). The state's rng is derived from `key`, not equal to it.
    """
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    build = train_state_init_fn(cfg, optimizer, mesh=mesh, with_ref_params=with_ref_params,
                                value_settings=value_settings, critic_cfg=critic_cfg,
                                critic_optimizer=critic_optimizer, data_pos=data_pos)
    return build(key, params, critic_params)


def train_state_init_fn(cfg: Qwen3Config, optimizer, *, mesh: Optional[Mesh] = None, with_ref_params: bool = False,
                        value_settings: Optional[ValueSettings] = None, critic_cfg: Optional[Qwen3Config] = None,
                        critic_optimizer=None, data_pos: int = 0):
    """The jitted `(key, params, critic_params) -> TrainState` that `init_train_state` runs (params or
    critic_params None: initialised at random), its output on the mesh's state shardings when there is a mesh;
    public for the AOT check, which lowers it on abstract params."""
    copt = critic_optimizer if critic_optimizer is not None else optimizer

    def build(key, params, critic_params):
        k_model, k_critic, k_state = jax.random.split(key, 3)
        if params is None:
            params = qwen3.init(cfg, k_model)
        cp = co = None
        if value_settings is not None:
            ccfg = critic_config(cfg, value_settings, critic_cfg)
            cp = critic_params
            if cp is None:
                cp = critic_lib.init(ccfg, k_critic, shared_backbone=value_settings.shared_backbone)
            co = copt.init(cp)
        ref = jax.tree.map(jnp.copy, params) if with_ref_params else None
        return TrainState(params=params, opt_state=optimizer.init(params),
                          step=jnp.zeros((), jnp.int32), rng=k_state,
                          data_pos=jnp.asarray(data_pos, jnp.int32), ref_params=ref,
                          critic_params=cp, critic_opt_state=co)

    if mesh is None:
        return jax.jit(build)
    out = state_shardings(cfg, optimizer, mesh, with_ref_params=with_ref_params,
                          value_settings=value_settings, critic_cfg=critic_cfg,
                          critic_optimizer=critic_optimizer)
    return jax.jit(build, out_shardings=out)


def abstract_train_state(cfg: Qwen3Config, optimizer, *, mesh: Optional[Mesh] = None,
                         **kw) -> TrainState:
    """ShapeDtypeStructs (with shardings when a mesh is given) of `init_train_state`'s result:
    the restore target for `checkpoint.restore_latest`. Allocates nothing."""
    shapes = jax.eval_shape(
        lambda k: init_train_state(cfg, optimizer, k, **kw), jax.random.key(0))
    if mesh is None:
        return shapes
    sh = state_shardings(cfg, optimizer, mesh, with_ref_params=kw.get("with_ref_params", False),
                         value_settings=kw.get("value_settings"), critic_cfg=kw.get("critic_cfg"),
                         critic_optimizer=kw.get("critic_optimizer"))
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, sh)
