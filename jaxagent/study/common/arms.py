"""The RL arms both studies train: an arm's settings (`ArmSettings`, `ARMS`; `arm_settings` from a preset), its
jitted train step (`make_arm_step`) as the runtimes call it (`placed_step`: placed on the mesh, packed policy
positions), the pieces a runtime holds (`ArmRuntime`: the study's rollout beside the step), the train state
(`init_arm_state`, `abstract_arm_state`) and the RL stage itself (`train_rl`).

Device mesh: with an optional (data, fsdp, tensor) `mesh` (`sharding.make_mesh`), parameters and optimizer state
live sharded per `sharding.RULES`, batches are split over the rules' batch axes, and the train step is the sharded
`build_train_step(mesh=...)`; mesh=None runs everything on the default device.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
from jax.sharding import Mesh

from jaxagent import sharding
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.logits_plan import PACKED_KEY
from jaxagent.rl.logprobs import packed_policy_positions
from jaxagent.rl.loop import RLSettings, iterate
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rl.optim import make_optimizer
from jaxagent.rl.train_state import (LossSettings, ValueSettings, abstract_train_state, init_train_state,
                                     state_shardings, train_state_init_fn)
from jaxagent.rl.train_step import build_train_step


@dataclasses.dataclass(frozen=True)
class ArmSettings:
    """One RL arm: the estimator settings plus optimisation."""

    name: str
    rl: RLSettings
    iterations: int = 30
    lr: float = 1e-4
    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: str = "k3"          # the KL term: sampled k1/k2/k3 (`losses.kl_penalty`) or "exact" (`losses.exact_kl`)
    entropy_coef: float = 0.0
    critic_lr: float = 1e-3


ARMS = {
    "grpo": RLSettings(estimator="grpo"),
    "budgetmix": RLSettings(estimator="grpo", budget_mode="budgetmix"),
    "gigpo": RLSettings(estimator="gigpo"),
    "ppo": RLSettings(estimator="ppo", group_size=8),
    "grpo_oracle": RLSettings(estimator="process"),
    # finding 7: GRPO and the oracle arm trained at the tightest tier (T = max(1, ceil(T_max / 4)))
    "grpo_tight": RLSettings(estimator="grpo", budget_mode="tight"),
    "grpo_oracle_tight": RLSettings(estimator="process", budget_mode="tight"),
}


@dataclasses.dataclass(frozen=True)
class ArmRuntime:
    """Compiled pieces of an arm, shared by every seed (and by arms with the same settings).

    With a mesh, `train_step` (and `values_fn`, `logprobs_fn`) place their inputs on `state_shardings` /
    the batch-row sharding first (a no-op for arrays already there); `rollout_fn` runs on a copy of the
    params laid out per `sharding.ROLLOUT_RULES`, episodes split over the batch axes, under the mesh
    context, and returns replicated arrays (readable on every host).
    """

    rollout_fn: Callable
    train_step: Callable
    optimizer: object
    critic_optimizer: object
    values_fn: Optional[Callable]
    value_settings: Optional[ValueSettings]
    mesh: Optional[Mesh] = None
    state_shardings: Any = None        # a TrainState of NamedShardings when mesh is given
    with_ref_params: bool = False
    logprobs_fn: Optional[Callable] = None  # with TIS: the trainer's pre-update log-probs (`rl_iteration`)


def shared_key(arm: ArmSettings):
    """What an arm's compiled pieces (`make_arm_step`, `make_arm_runtime`) depend on: arms with equal keys share
    them (one compile). Everything but the name, the estimator's settings and the iteration count, and whether
    the estimator trains a critic."""
    return dataclasses.replace(arm, name="", rl=None, iterations=0), arm.rl.estimator == "ppo"


@dataclasses.dataclass(frozen=True)
class ArmStep:
    """An arm's jitted train step and what its TrainState holds (`make_arm_step`): the FrozenLake and host
    runtimes call `jit`, and the AOT check (experiments/aot_check.py) lowers it on `abstract_state`, so the
    program checked is the program run."""

    jit: Callable                       # (TrainState, batch) -> (TrainState, metrics), `build_train_step`
    optimizer: object
    critic_optimizer: object = None     # PPO's critic; None without one
    value_settings: Optional[ValueSettings] = None
    with_ref_params: bool = False       # the state carries the reference params (kl_coef > 0)

    def state_shardings(self, cfg: Qwen3Config, mesh: Mesh):
        return state_shardings(cfg, self.optimizer, mesh, with_ref_params=self.with_ref_params,
                               value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)

    def abstract_state(self, cfg: Qwen3Config, mesh: Optional[Mesh] = None):
        """ShapeDtypeStructs of the arm's TrainState (sharded on `mesh` when given); allocates nothing."""
        return abstract_train_state(cfg, self.optimizer, mesh=mesh, with_ref_params=self.with_ref_params,
                                    value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)

    def init_jit(self, cfg: Qwen3Config, mesh: Optional[Mesh] = None):
        """The jitted (key, params, critic_params) -> TrainState that `init_arm_state` runs on the run's `mesh`
        (None: one device), `train_state.train_state_init_fn`."""
        return train_state_init_fn(cfg, self.optimizer, mesh=mesh, with_ref_params=self.with_ref_params,
                                   value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)


def make_arm_step(cfg: Qwen3Config, arm: ArmSettings, *, mesh: Optional[Mesh] = None,
                  memory: MemoryPlan = MemoryPlan(), tis_cap: Optional[float] = None) -> ArmStep:
    """The train step of `arm`: PPO-clip with the arm's clip / KL (`arm.kl_estimator`, the reference params in
    the state when kl_coef > 0) / entropy settings, AdamW at `arm.lr` with gradient clipping at 1.0, and with
    estimator 'ppo' a critic (`ValueSettings()`, AdamW at `arm.critic_lr`); `memory`: the step's `MemoryPlan`;
    `tis_cap`: see `make_arm_runtime` (`build_train_step`)."""
    ppo = arm.rl.estimator == "ppo"
    opt = make_optimizer(arm.lr, max_grad_norm=1.0)
    vs = ValueSettings() if ppo else None
    copt = make_optimizer(arm.critic_lr, max_grad_norm=1.0) if ppo else None
    with_ref = arm.kl_coef > 0
    jit = build_train_step(cfg, opt, LossSettings(clip_low=arm.clip_low, clip_high=arm.clip_high,
                                                  kl_coef=arm.kl_coef, kl_estimator=arm.kl_estimator,
                                                  entropy_coef=arm.entropy_coef, tis_cap=tis_cap),
                           memory, mesh, with_ref_params=with_ref, value_settings=vs, critic_optimizer=copt)
    return ArmStep(jit, opt, copt, vs, with_ref)


def placed_step(arm_step: ArmStep, cfg: Qwen3Config, *, mesh: Optional[Mesh] = None,
                memory: MemoryPlan = MemoryPlan(), pack_bucket: Optional[int] = None):
    """(step, state shardings or None): the arm's train step as the runtimes call it, step(state, batch) ->
    (state, metrics). With a `mesh`, the state and the batch rows are placed on `arm_step.state_shardings` / the
    row sharding first (a no-op for arrays already there). `memory.packed_policy`: the batch's policy tokens
    packed into one list per micro-batch, in multiples of `pack_bucket` positions
    (`logprobs.packed_policy_positions`); a token the lists missed is a RuntimeError. `memory.policy_tokens`: a
    batch with more policy tokens in a row than the step computes is a ValueError. Neither, and no mesh:
    `arm_step.jit` itself."""
    packed, policy_tokens, micro_batches = memory.packed_policy, memory.policy_tokens, memory.micro_batches
    if packed and pack_bucket is None:
        raise ValueError("placed_step with a packed MemoryPlan needs pack_bucket, the multiple of its positions "
                         "per list")
    if mesh is None and not packed and policy_tokens is None:
        return arm_step.jit, None
    jit_step, st_sh, row_sh = arm_step.jit, None, None
    if mesh is not None:
        st_sh, row_sh = arm_step.state_shardings(cfg, mesh), sharding.row_sharding(mesh)

    def step(state, batch):
        if packed:
            batch = {**batch, PACKED_KEY: packed_policy_positions(batch["policy_mask"], pack_bucket, micro_batches)}
        if mesh is not None:
            state, batch = jax.device_put(state, st_sh), jax.device_put(batch, row_sh)
        state, metrics = jit_step(state, batch)
        if packed and int(metrics["policy_tokens_over"]):  # a defect of the lists, never the data
            raise RuntimeError(f"the packed policy positions missed {int(metrics['policy_tokens_over'])} tokens")
        if policy_tokens is not None and int(metrics["policy_tokens_over"]):
            raise ValueError(f"the rollout's rows hold {int(metrics['policy_tokens_over'])} policy tokens beyond "
                             f"policy_tokens = {policy_tokens}: their log-probs were not computed")
        return state, metrics

    return step, st_sh


def place_params(params, cfg: Qwen3Config, mesh=None):
    """`params` on the mesh's parameter shardings (`qwen3.logical_axes` + `sharding.RULES`); a no-op
    without a mesh (or params None) and for params already placed so."""
    if mesh is None or params is None:
        return params
    return sharding.shard(params, sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh))


def init_arm_state(rt: ArmRuntime, cfg: Qwen3Config, key, base_params):
    """A fresh TrainState of the arm from the base params, on the runtime's mesh when it has one."""
    return init_train_state(cfg, rt.optimizer, key, mesh=rt.mesh, params=place_params(base_params, cfg, rt.mesh),
                            value_settings=rt.value_settings, critic_optimizer=rt.critic_optimizer,
                            with_ref_params=rt.with_ref_params)


def abstract_arm_state(rt: ArmRuntime, cfg: Qwen3Config, key, base_params):
    """ShapeDtypeStructs of `init_arm_state`'s result, with the mesh shardings when the runtime has a mesh
    (the restore target of a checkpoint: arrays come back sharded as the train step expects)."""
    shapes = jax.eval_shape(lambda: init_arm_state(rt, cfg, key, base_params))
    if rt.mesh is None:
        return shapes
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, rt.state_shardings)


def train_rl(runtime: ArmRuntime, arm: ArmSettings, sample_tasks: Callable, t_max: int, state,
             callback: Optional[Callable[[int, dict, object], None]] = None):
    """Returns (state, history): `arm.iterations` RL iterations (`rl.loop.iterate`) from `state` (a fresh
    `init_arm_state` or a restored checkpoint, resumed at iteration data_pos / n_tasks) with the runtime's compiled
    pieces, tasks drawn by `sample_tasks(key, n)` (FrozenLake maps, or a host split's task indices) and budgets up
    to `t_max`. callback(iteration, metrics, state) runs after every iteration (progress, checkpoints, R_single)."""
    return iterate(state, iterations=arm.iterations, rollout_fn=runtime.rollout_fn, sample_tasks_fn=sample_tasks,
                   train_step=runtime.train_step, settings=arm.rl, t_max=t_max, values_fn=runtime.values_fn,
                   logprobs_fn=runtime.logprobs_fn, callback=callback)


def arm_settings(preset, arm: str, temperature: float = 1.0) -> ArmSettings:
    """Arm `arm` of a study preset (either study's): the estimator settings of `ARMS[arm]` with the preset's batch
    (n_tasks, group_size, epochs, minibatches), its iterations and optimisation (lr, KL coefficient and estimator,
    entropy), sampling its training rollouts at `temperature`."""
    p = preset
    rl = dataclasses.replace(ARMS[arm], n_tasks=p.n_tasks, group_size=p.group_size, epochs=p.epochs,
                             minibatches=p.minibatches)
    return ArmSettings(name=arm, rl=rl, iterations=p.iterations, lr=p.lr, kl_coef=p.kl_coef,
                       kl_estimator=p.kl_estimator, entropy_coef=p.entropy_coef, temperature=temperature)
