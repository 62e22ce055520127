"""One timed RL iteration of a study preset for the accelerator benchmark (`jaxagent.bench.accel`): the preset's
runtime built as the study builds it (toy or Qwen3-tokenizer FrozenLake, or a host environment), random or SFT base
weights, one warm-up iteration (it compiles), then `plan.rl_iterations` timed ones (`jaxagent.bench.rl`), and the
split of the median one."""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from typing import Callable, Iterable, Mapping


def rl_setup(plan, mesh_override, tmp: str, preset, host: bool, arm):
    """(runtime, settings, sample_tasks_fn, t_max, n_groups, cfg, base params, description, on-trace record) of
    the RL preset `preset` (`host`: a host-environment preset), as the study builds them, with the study's GRPO arm
    settings `arm` of the preset."""
    import jax

    from jaxagent import sharding
    from jaxagent.bench.models import CONFIG_NAMES, model_config
    from jaxagent.models import qwen3
    from jaxagent.study import stages

    p = preset
    mesh_shape = tuple(mesh_override or p.mesh)
    mesh = None if mesh_shape == (1, 1, 1) else sharding.make_mesh(*mesh_shape)
    note = {"preset": p.name, "mesh": list(mesh_shape), "compute_dtype": p.compute_dtype,
            "micro_batches": p.micro_batches, "remat": p.remat}
    if host:
        from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
        from jaxagent.study.host import stages as host_stages
        arm = dataclasses.replace(arm, temperature=p.temperature)
        cfg = p.tiny_model if p.tiny_model is not None else model_config(CONFIG_NAMES[p.aot_model])
        world = host_stages.make_host_world(p.task, Tokenizer.from_dir(qwen3_tokenizer_dir()))
        traces = []
        rt = host_stages.make_host_arm_runtime(world, cfg, p.task, arm, mesh=mesh, compute_dtype=p.compute_dtype,
                                               micro_batches=p.micro_batches, remat=p.remat,
                                               compiler_options=dict(p.compiler_options) or None,
                                               on_trace=traces.append)
        sample = host_stages.task_sampler(len(world.train_tasks))
        n_groups, t_max = p.task.overlap_groups, p.task.t_max
        note.update(world=f"{p.task.domain} (real Qwen3 tokenizer)", episode_groups=n_groups)
    else:
        world = frozenlake_world(p, plan.rl_world, tmp)
        cfg = (model_config(CONFIG_NAMES[p.aot_model]) if p.aot_model else p.model)
        cfg = dataclasses.replace(cfg, vocab_size=max(cfg.vocab_size, world.tokenizer.vocab_size)
                                  if p.aot_model else world.tokenizer.vocab_size)
        rt = stages.make_arm_runtime(world, cfg, p.task, arm, mesh=mesh, compute_dtype=p.compute_dtype,
                                     micro_batches=p.micro_batches, remat=p.remat, tis_cap=p.tis_cap)
        sample, n_groups, t_max, traces = p.task.sample, 1, p.task.t_max, None
        note.update(world=f"FrozenLake {p.task.size}x{p.task.size} ({plan.rl_world} tokenizer)")
    note.update(model_params=cfg.num_params(), episodes=arm.rl.batch_size, t_max=t_max,
                max_action_tokens=p.task.max_action_tokens, max_context=p.task.max_context)
    if plan.rl_base == "sft":  # the study's base stage: SFT on the noisy expert (`stages.train_base`)
        base = stages.train_base(world, cfg, jax.random.key(plan.seed), p.task, p.base, mesh=mesh)[0]
        note.update(base="sft", base_sft_steps=p.base.steps)
    else:
        base = stages.place_params(qwen3.init(cfg, jax.random.key(plan.seed)), cfg, mesh)
        note.update(base="random")
    return rt, arm, sample, t_max, n_groups, cfg, base, mesh, note, traces


def frozenlake_world(preset, which: str, tmp: str):
    from jaxagent.study.toy import make_toy_world
    if which == "toy":
        return make_toy_world(os.path.join(tmp, "toy_tokenizer"), size=preset.task.size)
    from jaxagent.envs.jax.frozenlake import FrozenLake
    from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
    from jaxagent.rollout import budget_format, chat_layout, env_codec
    from jaxagent.study.toy import ToyWorld
    tok = Tokenizer.from_dir(qwen3_tokenizer_dir())
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=False)
    return ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size), chat_layout(tok, FrozenLake.system_prompt()),
                    budget_format(codec))


def rl_runner(presets_fn: Callable[[], Mapping], host_names_fn: Callable[[], Iterable[str]],
              arm_settings: Callable) -> Callable:
    """`rl_record` over the study's presets by name (`presets_fn()`; `host_names_fn()`: the host-environment ones;
    `arm_settings(preset)`: the study's GRPO arm settings of a preset), as `accel.run_jax`'s `rl_record(plan, log)`.
    The study is imported when the RL iteration runs: a missing package is that record's error, not the run's."""
    def record(plan, log: Callable) -> dict:
        p = presets_fn()[plan.rl_preset]
        with tempfile.TemporaryDirectory() as tmp:  # the toy world's tokenizer files
            return rl_record(plan, tmp, log, preset=p, host=plan.rl_preset in set(host_names_fn()),
                             arm=arm_settings(p))
    return record


def rl_record(plan, tmp: str, log: Callable, *, preset, host: bool, arm) -> dict:
    """One warm-up iteration (compiles), then `rl_iterations` timed ones; the split of the median iteration."""
    import jax

    from jaxagent.bench.rl import timed_iteration
    from jaxagent.rl.logprobs import make_logprobs_fn
    from jaxagent.study import stages
    rt, arm, sample, t_max, n_groups, cfg, base, mesh, note, traces = rl_setup(plan, plan.mesh, tmp, preset, host, arm)
    cdt = None if note["compute_dtype"] == "float32" else jax.numpy.dtype(note["compute_dtype"])
    old_fn = make_logprobs_fn(cfg, mesh=mesh, micro_batches=note["micro_batches"], remat=note["remat"],
                              compute_dtype=cdt)
    if mesh is not None:
        from jaxagent import sharding
        jit_old = old_fn
        old_fn = lambda params, toks: jit_old(params, jax.device_put(toks, sharding.row_sharding(mesh)))  # noqa: E731
    state = stages.init_arm_state(rt, cfg, jax.random.key(plan.seed), base)
    recs = []
    for i in range(1 + plan.rl_iterations):
        state, rec = timed_iteration(state, rt, arm.rl, sample, t_max, n_groups=n_groups, old_logprobs_fn=old_fn)
        if traces:  # the host loop's own count of the same rollout's slots (`HostTiming.decode`)
            rec.update({f"host_{k}": v for k, v in traces[-1].timing.summary().items() if k.startswith("decode")})
        log(f"rl {plan.rl_preset} iteration {i}{' (warm-up)' if i == 0 else ''}: {rec['iteration_s']:.2f} s, "
            f"rollout {rec['rollout_share']:.2f}, finished-episode slots {rec['decode_finished_share']}")
        recs.append(rec)
    warm, timed_recs = recs[0], recs[1:]
    times = [r["iteration_s"] for r in timed_recs]
    mid = sorted(timed_recs, key=lambda r: r["iteration_s"])[len(timed_recs) // 2]
    return {**note, **mid, "iteration_median_s": statistics.median(times), "iteration_min_s": min(times),
            "iteration_max_s": max(times), "iteration_spread": (max(times) - min(times)) / statistics.median(times),
            "iterations_timed": len(times), "warmup_iteration_s": warm["iteration_s"]}
