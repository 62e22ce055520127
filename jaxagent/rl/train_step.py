"""The sharded RL train step: a loss (`train_loss.make_policy_loss`, `with_value_loss`) summed over micro-batches,
global-norm clipping, AdamW and a non-finite guard (`optim.make_optimizer`), compiled as ONE `jax.jit` with
explicit shardings over a (data, fsdp, tensor) mesh and a donated state (`make_train_step`); `build_train_step`
assembles the study's step from settings and a `MemoryPlan`.

Dimension legend: B sequences, S tokens (context slots), V vocab, Mb micro-batches.

Micro-batches: row i goes to micro-batch i mod Mb, and each micro-batch's loss is re-weighted by (its aggregation
denominator / the global one), so the sum over micro-batches is exactly the full-batch loss and Mb = 1, 2, 4 give
the same gradient (to float rounding); token-mean metrics are weighted by token counts, *_max metrics take the max.
Memory (`memory_plan.MemoryPlan`): log-probs from the final hidden states in chunks of `logits_chunk` positions
under `jax.checkpoint` (the f32 logits [B, S, V] never exist), at the positions its `LogitsPlan` names; `remat`
names the model's per-layer checkpoint policy; `micro_batches` bounds the rows in flight. Why the split is strided,
and each mode's denominator: docs/aot.md, "Memory design" (Micro-batches).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent import sharding, xla_options
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import optim
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rl.train_loss import make_policy_loss, with_value_loss
from jaxagent.rl.train_state import LossSettings, TrainState, ValueSettings, critic_config, state_shardings


class TrainStep:
    """A jitted `step(state, batch) -> (state, metrics)` whose batch is checked on the host (one-line ValueErrors:
    the loss's keys, shapes and reference, rows that split into the micro-batches and the mesh's batch shards)
    before each call and lowering; other attributes (trace, eval_shape, ...) are the jit's."""

    def __init__(self, jitted, loss_fn, micro_batches: int, divisor: int):
        self._jit, self._loss_fn, self._micro, self._divisor = jitted, loss_fn, micro_batches, divisor
        functools.update_wrapper(self, jitted.__wrapped__)  # the step function, as `aot.coverage.unjit` reads it

    def check(self, state, batch):
        self._loss_fn.check(state, batch, self._micro)
        b, mb = batch["tokens"].shape[0], self._micro
        if b % mb:
            raise ValueError(f"batch size {b} is not divisible by micro_batches={mb}")
        if (b // mb) % self._divisor:
            raise ValueError(f"micro-batch size {b // mb} is not divisible by the mesh's "
                             f"batch axes (data x fsdp = {self._divisor})")

    def __call__(self, state, batch):
        self.check(state, batch)
        return self._jit(state, batch)

    def lower(self, state, batch):
        self.check(state, batch)
        return self._jit.lower(state, batch)

    def __getattr__(self, name: str):  # trace, eval_shape, _cache_size, ...: the jit's
        if name in ("_jit", "_loss_fn", "_micro", "_divisor"):
            raise AttributeError(name)
        return getattr(self._jit, name)


def make_train_step(loss_fn, optimizer: optax.GradientTransformation, *, mesh: Optional[Mesh] = None,
                    micro_batches: int = 1, shardings: Optional[TrainState] = None, critic_optimizer=None,
                    compiler_options: Optional[dict] = None) -> TrainStep:
    """`step(state, batch) -> (state, metrics)`: gradients of `loss_fn` summed over `micro_batches` with lax.scan
    (module doc), `optimizer` applied to state.params (with `critic_optimizer`, `loss_fn` takes (params,
    critic_params) and that optimizer updates the critic), one jax.jit with the state donated.

    `loss_fn` (`train_loss.PolicyLoss` / `ValueLoss`): `loss_fn(params, batch) -> (loss, metrics)` on one
    micro-batch, whose batch holds its rows and `loss_fn.context(state, batch)` (made once on the whole batch);
    `loss_fn.check(state, batch, micro_batches)` runs on the host first, `loss_fn.presplit` names the entries
    already split per micro-batch, `loss_fn.summary(batch, context)` adds whole-batch metrics. With a mesh: the
    state on `shardings` (`train_state.state_shardings`), batch rows over ('data', 'fsdp'), metrics replicated.
    Metrics add grad_norm (before clipping), skipped (1 if the update was skipped for non-finite gradients),
    skipped_total, and with a critic critic_grad_norm, critic_skipped.
    """
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    critic = critic_optimizer is not None
    row_axes = None if mesh is None else sharding.batch_axes(mesh)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    add = lambda a, b: jax.tree.map(jnp.add, a, b)  # noqa: E731
    pin = lambda g: g if mesh is None else jax.lax.with_sharding_constraint(g, shardings.params)  # noqa: E731

    def split(x):  # [B, ...] -> [Mb, B/Mb, ...], row i -> micro-batch i mod Mb
        x = jnp.swapaxes(x.reshape((x.shape[0] // micro_batches, micro_batches) + x.shape[1:]), 0, 1)
        return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, row_axes)))

    def body(trainable, ctx, carry, mb):
        acc, m_acc = carry
        (_, m), g = grad_fn(trainable, {**mb, **ctx})
        # the policy's summed gradient stays on its sharding; the critic's is added after the metrics
        acc = (pin(add(acc[0], g[0])), acc[1]) if critic else pin(add(acc, g))
        m_acc = {k: jnp.maximum(m_acc[k], v) if k.endswith("_max") else m_acc[k] + v for k, v in m.items()}
        return ((acc[0], add(acc[1], g[1])) if critic else acc, m_acc), None

    def step(state: TrainState, batch: dict):
        batch = dict(batch)
        presplit = {k: batch.pop(k) for k in loss_fn.presplit if k in batch}  # [Mb, ...]: one entry per micro-batch
        ctx = loss_fn.context(state, batch)
        trainable = (state.params, state.critic_params) if critic else state.params
        if micro_batches == 1:
            (_, metrics), grads = grad_fn(trainable, {**batch, **{k: v[0] for k, v in presplit.items()}, **ctx})
        else:
            mbs = {**jax.tree.map(split, batch), **presplit}
            m0 = jax.eval_shape(lambda: grad_fn(trainable, {**jax.tree.map(lambda x: x[0], mbs), **ctx})[0][1])
            init = (jax.tree.map(jnp.zeros_like, trainable), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0))
            (grads, metrics), _ = jax.lax.scan(functools.partial(body, trainable, ctx), init, mbs)
        grads, cgrads = grads if critic else (grads, None)
        grads = pin(grads)
        metrics["grad_norm"] = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        new = state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                            step=state.step + 1)
        metrics["skipped"] = optim.last_step_skipped(opt_state).astype(jnp.float32)
        metrics["skipped_total"] = optim.nonfinite_count(opt_state).astype(jnp.float32)
        metrics.update(loss_fn.summary(batch, ctx))
        if critic:
            metrics["critic_grad_norm"] = optax.tree.norm(cgrads)
            cupd, copt_state = critic_optimizer.update(cgrads, state.critic_opt_state, state.critic_params)
            new = new.replace(critic_params=optax.apply_updates(state.critic_params, cupd),
                              critic_opt_state=copt_state)
            metrics["critic_skipped"] = optim.last_step_skipped(copt_state).astype(jnp.float32)
        return new, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    kw = {} if mesh is None else dict(in_shardings=(shardings, sharding.row_sharding(mesh)),
                                      out_shardings=(shardings, sharding.replicated(mesh)))
    return TrainStep(xla_options.jit(step, donate_argnums=(0,), compiler_options=compiler_options,
                                     sequence=True, **kw),
                     loss_fn, micro_batches, sharding.batch_divisor(mesh))


def build_train_step(cfg: Qwen3Config, optimizer: optax.GradientTransformation, loss_settings: LossSettings,
                     memory: MemoryPlan = MemoryPlan(), mesh: Optional[Mesh] = None, *,
                     with_ref_params: bool = False, value_settings: Optional[ValueSettings] = None,
                     critic_cfg: Optional[Qwen3Config] = None,
                     critic_optimizer: Optional[optax.GradientTransformation] = None) -> TrainStep:
    """The study's step: `make_policy_loss(loss_settings, memory.logits_plan(cfg, mesh), reference)` (reference
    'params' when `with_ref_params`: the state carries the KL reference's params), with `value_settings` (PPO) plus
    the critic's value loss (`with_value_loss`; a separate Qwen3 critic of `critic_cfg`, default `cfg`, or a head
    on the policy's backbone), in `make_train_step` with `memory`'s micro-batches and compiler options (on top of the CPU options
    `xla_options.options` chooses for the step's devices). `critic_optimizer` defaults to `optimizer`.

    Metrics: the losses' (`make_policy_loss`, `with_value_loss`), the step's (`make_train_step`), tokens (policy
    tokens in the batch) and, with `memory.policy_tokens`, policy_tokens_over: the batch's policy tokens beyond
    that bound (their log-probs read 0: a caller must stop on a nonzero count). A packed plan needs one batch
    shard (its lists cross rows).
    """
    if memory.packed_policy and sharding.batch_divisor(mesh) > 1:
        raise ValueError(f"packed_policy needs one batch shard (the list crosses rows); this mesh has "
                         f"{sharding.batch_divisor(mesh)}: use policy_tokens")
    if not isinstance(memory, MemoryPlan):
        raise ValueError(f"memory must be a MemoryPlan, got {type(memory).__name__}")
    loss = make_policy_loss(loss_settings, memory.logits_plan(cfg, mesh), "params" if with_ref_params else "batch")
    copt = None
    if value_settings is not None:
        loss = with_value_loss(loss, value_settings, critic_config(cfg, value_settings, critic_cfg))
        copt = critic_optimizer if critic_optimizer is not None else optimizer
    st_sh = None if mesh is None else state_shardings(
        cfg, optimizer, mesh, with_ref_params=with_ref_params, value_settings=value_settings, critic_cfg=critic_cfg,
        critic_optimizer=copt)
    return make_train_step(loss, optimizer, mesh=mesh, micro_batches=memory.micro_batches, shardings=st_sh,
                           critic_optimizer=copt, compiler_options=memory.options())


def make_ppo_train_step(cfg: Qwen3Config, optimizer, loss_settings: LossSettings,
                        value_settings: ValueSettings = ValueSettings(), memory: MemoryPlan = MemoryPlan(),
                        mesh: Optional[Mesh] = None, **kw) -> TrainStep:
    """`build_train_step` with a PPO critic: the batch adds returns and old_values [B, S] and the critic (separate
    Qwen3 or shared-backbone head, `ValueSettings`) is updated with the clipped value loss in the same jitted step."""
    return build_train_step(cfg, optimizer, loss_settings, memory, mesh, value_settings=value_settings, **kw)
