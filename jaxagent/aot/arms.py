"""The programs of the RL arms that the FrozenLake and host-domain lists share, on abstract arguments:
  train steps        `stages.make_arm_step`'s jit (arms whose settings and rows are equal share one)
  train_state_init   the making of an arm's TrainState from the base params (`stages.init_arm_state`)
  params_finite      the finiteness check of the params after each update (`common.run_checks.nonfinite_leaves`)
  init_params        random params of a model without a checkpoint (`qwen3.init`: the toy and CI presets)
and the abstract pieces every list builds on (`params_abstract`, `abstract_key`). Each program carries the
`coverage.Call` it lowers, the jitted function and arguments the run calls.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from jaxagent import sharding
from jaxagent.aot.analytic import analytic_flops
from jaxagent.aot.coverage import Call
from jaxagent.aot.record import Program
from jaxagent.models import qwen3
from jaxagent.rl import train_loss
from jaxagent.rl.logits_plan import PACKED_KEY
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.sampling.generate import cast_params
from jaxagent.study import stages
from jaxagent.study.common.run_checks import all_finite_leaves_jit


SHARED = ("init_params", "train_state_init", "params_finite", "params_cast")  # the programs both lists may hold


def program(name: str, call: Call, flops: float, note: str, family: tuple = (), **kw) -> Program:
    """A `Program` that compiles `call` and stands for it and the other calls of its `family`."""
    return Program(name, call.lower, flops, note, calls=(call, *family), **kw)


def abstract_key(sharding=None):
    """A typed PRNG key as an abstract argument."""
    return jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=sharding)


def params_abstract(cfg, mesh, dtype=jnp.float32, rules=None):
    """The Qwen3 params of `cfg` as ShapeDtypeStructs in `dtype`, on their shardings over `mesh` per `rules`
    (default `sharding.RULES`)."""
    shapes = qwen3.param_shapes(cfg)
    shs = sharding.shardings_for(qwen3.logical_axes(cfg), shapes, mesh, rules)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh), shapes, shs)


def compute_dtype_of(name):
    """The dtype of a preset's forward passes (`stages.resolve_compute_dtype`; float32 when none)."""
    return stages.resolve_compute_dtype(name) or jnp.float32


def _groups(arms, rows_of=lambda arm: 0, name=lambda arm: "") -> dict:
    """Arms by (`stages.shared_key`, rows, name): the arms of one group share one compiled step and state."""
    groups: dict = {}
    for arm in arms:
        groups.setdefault((stages.shared_key(arm), rows_of(arm), name(arm)), []).append(arm)
    return groups


def train_step_programs(cfg, mesh, run_mesh, arms, *, seq: int, name: Callable, memory: MemoryPlan = MemoryPlan(),
                        tis_cap: Optional[float] = None, packed_sizes: tuple = ()) -> list[Program]:
    """The RL train steps of a run's `arms` (`stages.ArmSettings`) as the study builds them
    (`stages.make_arm_step` on the run's mesh `run_mesh`, None for one device, with the run's `memory`): one
    program per distinct step (arms whose loss and optimiser settings and rows are equal share one, as the study's
    runtimes do), named `name(arm)`, lowered on `ArmStep.abstract_state` (placed on `mesh`) and a batch of
    rl.batch_size / rl.minibatches rows (one update) of `seq` tokens on the rows' sharding. Analytic
    FLOPs: the policy's forward and backward (+ the recomputed forward under remat), a PPO critic's the
    same without the unembedding, and the reference's forward when the state carries it (kl_coef > 0). With
    `memory.policy_tokens` the unembedding runs at min(policy_tokens, seq) positions per row (the reference's too
    with the exact KL); with `memory.packed_policy` at the N positions of each micro-batch's `policy_index`
    [micro_batches, N], N the largest of `packed_sizes` (the others: the program's family)."""
    chunk, micro_batches, remat = memory.logits_chunk, memory.micro_batches, memory.remat
    progs = []
    groups = _groups(arms, lambda arm: arm.rl.batch_size // arm.rl.minibatches, name)
    for ((_, ppo), rows, prog_name), group in groups.items():
        arm = group[0]
        step = stages.make_arm_step(cfg, arm, mesh=run_mesh, memory=memory, tis_cap=tis_cap)
        state = step.abstract_state(cfg, mesh)
        dtypes = {"tokens": jnp.int32, "policy_mask": jnp.bool_}
        row = sharding.row_sharding(mesh)
        batch = {k: jax.ShapeDtypeStruct((rows, seq), dtypes.get(k, jnp.float32), sharding=row)
                 for k in train_loss.BATCH_KEYS + (train_loss.PPO_KEYS if ppo else ())}
        calls, policy_tokens = [Call(step.jit, (state, batch))], memory.policy_tokens
        if memory.packed_policy:  # one call per length N, the widest compiled (last)
            calls = [Call(step.jit, (state, {**batch, PACKED_KEY: jax.ShapeDtypeStruct(
                (micro_batches, n), jnp.int32, sharding=row)})) for n in packed_sizes]
            policy_tokens = max(packed_sizes) * micro_batches // rows
        at = seq if policy_tokens is None else min(policy_tokens, seq)  # unembedded positions per row
        fl = analytic_flops(cfg, rows, seq, backward=True, remat=remat, recompute_unembed=chunk is not None and at > chunk,
                            unembed_positions=rows * at)
        if ppo:  # a separate critic of the same shape: its layers trained too, no unembedding
            fl += analytic_flops(cfg, rows, seq, backward=True, remat=remat, unembed_positions=0)
        if step.with_ref_params:  # the reference's forward (no gradient): its log-probs, or its logits (exact KL)
            fl += analytic_flops(cfg, rows, seq, backward=False,
                                 unembed_positions=rows * (at if arm.kl_estimator == "exact" else seq))
        cdt = memory.compute_dtype or jnp.float32
        progs.append(program(prog_name, calls[-1], fl,
                             f"arms {', '.join(a.name for a in group)}: {rows} rows x {seq} tokens, {micro_batches} "
                             f"micro-batches, remat={remat}, logits chunk {chunk}"
                             f"{'' if policy_tokens is None else f' at <= {policy_tokens} policy tokens per row'}"
                             f"{f' (packed, {max(packed_sizes)} per micro-batch)' if memory.packed_policy else ''}, "
                             f"{jnp.dtype(cdt).name} forward, "
                             f"kl_coef {arm.kl_coef} ({arm.kl_estimator}"
                             f"{', reference in the state' if step.with_ref_params else ''})"
                             f"{', layers scanned' if memory.scan_layers else ''}", tuple(calls[:-1])))
    return progs


def state_programs(cfg, mesh, run_mesh, arms, **step_kw) -> list[Program]:
    """`train_state_init`: each distinct arm's TrainState made from the base params (f32 on `sharding.RULES`, as
    loaded or placed) by `ArmStep.init_jit` on the run's mesh, a PPO critic at random; `params_finite`: the check
    of the policy's params (and a critic's, its family) on the state's shardings after every update; `params_cast`
    (a compute dtype other than f32): the rollouts' copy of the base's and a policy's params in it
    (`generate.cast_params`, as `rollout_params` makes it before placing it)."""
    rep = sharding.replicated(mesh)
    progs, critic = [], None
    base = params_abstract(cfg, mesh)
    for ((_, ppo), _, _), group in _groups(arms).items():
        arm = group[0]
        step = stages.make_arm_step(cfg, arm, mesh=run_mesh, **step_kw)
        call = Call(step.init_jit(cfg, run_mesh), (abstract_key(rep), base, None))
        state = step.abstract_state(cfg, mesh)
        critic = critic or state.critic_params
        progs.append(program("train_state_init", call, 0.0, f"arm {arm.name}'s TrainState from the f32 base params"
                             f"{', a PPO critic at random' if ppo else ''}"
                             f"{', the KL reference a copy' if step.with_ref_params else ''}", flops_checked=False))
    family = () if critic is None else (Call(all_finite_leaves_jit, (critic,)),)
    progs.append(program("params_finite", Call(all_finite_leaves_jit, (state.params,)), 0.0,
                         "one bool per params leaf" + (" (and the critic's)" if family else ""), family,
                         flops_checked=False))
    memory = step_kw.get("memory")
    dtype = None if memory is None or memory.compute_dtype is None else jnp.dtype(memory.compute_dtype)
    if dtype is not None and dtype != jnp.float32:
        progs.append(program("params_cast", Call(cast_params, (base,), dict(dtype=dtype)), 0.0,
                             f"the rollouts' {dtype.name} copy of the f32 params", (Call(cast_params, (state.params,),
                                                                                         dict(dtype=dtype)),),
                             flops_checked=False))
    return progs


def init_params_program(cfg, mesh) -> Program:
    """`qwen3.init(cfg, key)`: the f32 random params of a model without a checkpoint."""
    return program("init_params", Call(qwen3.init, (cfg, abstract_key(sharding.replicated(mesh)))), 0.0,
                   "random f32 params (no checkpoint)", flops_checked=False)
