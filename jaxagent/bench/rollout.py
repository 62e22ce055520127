"""Rollout throughput: jaxagent's jitted FrozenLake env and multi-turn rollout vs gymnasium + transformers.

    python -m experiments.bench_rollout --json             # one JSON line, both sides measured in this run
    python -m experiments.bench_rollout --json --profile   # + where the JAX rollout's time goes

`env_ratio` / `env_text_obs_ratio`: steps/s (envs x steps / median time) of `FrozenLake.step_action` vmapped in a
jitted scan vs gymnasium's `SyncVectorEnv` of FrozenLake-v1 on the same maps. `rollout_ratio`: episodes/s (batch /
median time) of `jaxagent.rollout.rollout` vs a PyTorch + gymnasium loop with KV-cache reuse
(`experiments.peers.torch_rollout`, at its best thread count and OpenMP policy), at the study's policy shape and a
~1M-parameter one, on the same random weights, maps and budgets; a replay of JAX's replies through the torch loop
checks tokens and log-probs (`*_replay_*`). `*_frac_peak` = 2 x params x real tokens / time / `matmul_peak_gflops`.
On a busy machine (`jaxagent.bench.harness`) every `*_ratio` is null and reported as `*_ratio_busy`.
What each side runs and times, and `--profile`: docs/performance.md, "What `bench_rollout` compares".

Legend: B episodes, N turns (T_max), S cache slots, W chunk width, M action tokens, V vocab, L map side.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.bench.harness import (LoadMeter, flag_busy, jax_matmul_gflops, median_time, peer_settings, per_setting,
                                    pick_best, setting_fields, time_call)
from jaxagent.envs.jax import frozenlake as fl
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout.episode import max_chunk
from jaxagent.rollout.jax_loop import RolloutConfig, rollout
from jaxagent.sampling import Sampler
from jaxagent.study.stages import TaskSettings
from jaxagent.study.toy import ToyWorld, make_toy_world

GYM_TIME_LIMIT = 100  # gymnasium registers FrozenLake-v1 (4x4) with max_episode_steps=100
ONE_M_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32)


# ------------------------------------------------------------------ 1. env stepping
def make_jax_env_run(env: fl.FrozenLake, env_params, n_steps: int, text_obs: bool):
    """jitted (maps [E, L, L], key) -> checksum: E envs x n_steps random-action steps with autoreset.

    `text_obs` False: the step's observation is not consumed, so XLA compiles its text rendering away
    and the step is the dynamics alone (gymnasium's FrozenLake returns an int cell index, no text);
    True: the rendered tokens feed the checksum, so every step renders the text observation too.
    """
    step = jax.vmap(env.step_action, in_axes=(0, 0, None))

    @jax.jit
    def run(maps_ExLxL, key):
        n = maps_ExLxL.shape[0]
        k_reset, k_steps = jax.random.split(key)
        states, _ = jax.vmap(env.reset, in_axes=(0, 0, None))(jax.random.split(k_reset, n), maps_ExLxL, env_params)
        start_E = states.pos

        def body(carry, k):
            st, acc = carry
            out = step(st, jax.random.randint(k, (n,), 0, fls.N_ACTIONS), env_params)
            new = out.state
            reset = new.done | (new.t >= GYM_TIME_LIMIT)
            new = new._replace(pos=jnp.where(reset, start_E, new.pos), t=jnp.where(reset, 0, new.t),
                               done=jnp.zeros_like(new.done), success=jnp.zeros_like(new.success))
            acc = acc + jnp.sum(out.reward) + jnp.sum(new.pos)
            if text_obs:
                acc = acc + jnp.sum(out.obs.length) + jnp.sum(out.obs.tokens[:, -1])
            return (new, acc), None

        (_, acc), _ = jax.lax.scan(body, (states, jnp.float32(0)), jax.random.split(k_steps, n_steps))
        return acc

    return run


def bench_env(world: ToyWorld, ts: TaskSettings, args, peer) -> dict:
    """Env stepping, JAX vs the peer's vector env (`peer.gym_vector(maps, seed, steps)` -> (run, envs, close)),
    repeats interleaved."""
    maps = ts.sample(jax.random.key(args.seed + 7), args.env_batch)
    runs = {"dyn": make_jax_env_run(world.env, ts.env_params(), args.env_steps, text_obs=False),
            "text": make_jax_env_run(world.env, ts.env_params(), args.env_steps, text_obs=True)}
    t0 = time.perf_counter()
    for run in runs.values():
        run(maps, jax.random.key(0)).block_until_ready()
    compile_s = time.perf_counter() - t0

    gym_run, n_gym, gym_close = peer.gym_vector(np.asarray(maps)[: args.gym_envs], args.seed, args.gym_steps)
    gym_run()  # warm-up
    times = {"dyn": [], "text": [], "gym": []}
    for r in range(args.repeats):  # interleaved: every side sees the same machine load
        for name, run in runs.items():
            times[name].append(time_call(lambda: run(maps, jax.random.key(r + 1)).block_until_ready()))
        times["gym"].append(time_call(gym_run))
    gym_close()
    jax_sps = args.env_batch * args.env_steps / statistics.median(times["dyn"])
    text_sps = args.env_batch * args.env_steps / statistics.median(times["text"])
    gym_sps = n_gym * args.gym_steps / statistics.median(times["gym"])
    return {"env_batch": args.env_batch, "env_steps": args.env_steps, "gym_envs": n_gym,
            "gym_steps": args.gym_steps, "jax_env_compile_s": compile_s, "jax_env_steps_per_s": jax_sps,
            "jax_env_text_obs_steps_per_s": text_sps, "gym_env_steps_per_s": gym_sps,
            "env_ratio": jax_sps / gym_sps, "env_text_obs_ratio": text_sps / gym_sps}


# ------------------------------------------------------------------ 2. the rollout
def tokens_processed(lengths, sys_len: int) -> int:
    """Real tokens through the model: the shared system prompt once + every episode's own tokens."""
    return int(sys_len + np.sum(np.asarray(lengths) - sys_len))


def bench_jax_shape(name: str, cfg: Qwen3Config, world: ToyWorld, ts: TaskSettings, args, workdir: str,
                    peer) -> tuple:
    """The JAX rollout of one shape, timed, and the replay check; writes the weights and maps the
    peer workers read; `peer.replay` is the replay check. Returns (partial results, the shape's worker spec)."""
    params = qwen3.init(cfg, jax.random.key(args.seed))
    model_dir, tasks_npy = os.path.join(workdir, f"model_{name}"), os.path.join(workdir, f"tasks_{name}.npy")
    weights.save(model_dir, cfg, params)
    rcfg = RolloutConfig(t_max=ts.t_max, max_action_tokens=ts.max_action_tokens, max_context=ts.max_context,
                         sampler=Sampler(temperature=args.temperature))
    env_params = ts.env_params()
    tasks = ts.sample(jax.random.key(args.seed + 1), args.batch)
    np.save(tasks_npy, np.asarray(tasks))
    budgets = np.full((args.batch,), ts.t_max, np.int32)

    def jax_run(k):
        r = rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, jax.random.key(k), env_params,
                    rcfg)
        return jax.block_until_ready(r)

    t0 = time.perf_counter()
    jx = jax_run(1000)
    compile_s = time.perf_counter() - t0
    check = peer.replay(model_dir, world, tasks, budgets, jx, rcfg, args.temperature)
    jax_t, jax_tok = [], []
    sys_len = len(world.layout.system)
    for r in range(args.repeats):
        t0 = time.perf_counter()
        jx = jax_run(r)
        jax_t.append(time.perf_counter() - t0)
        jax_tok.append(tokens_processed(jx.length, sys_len))
    jt = statistics.median(jax_t)
    out = {"params": cfg.num_params(), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
           "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
           "vocab": cfg.vocab_size, "jax_compile_s": compile_s, "jax_episodes_per_s": args.batch / jt, "jax_s": jt,
           "jax_tokens_per_episode": statistics.mean(jax_tok) / args.batch,
           "jax_success_rate": float(np.mean(np.asarray(jx.success))), **check}
    if args.profile:
        out["profile"] = profile_jax(params, cfg, world, ts, rcfg, tasks, budgets, jt, args)
    return out, {"model_dir": model_dir, "tasks_npy": tasks_npy}


def finish_shape(name: str, out: dict, peer: dict, args, peak: float) -> dict:
    """Adds the peer's figures at its best setting for this shape; keys prefixed with the shape name."""
    runs = {s: r["shapes"][name] for s, r in peer.items()}
    best = pick_best({s: r["s"] for s, r in runs.items()})
    tr, jt = runs[best], out["jax_s"]
    n_params = out["params"]
    jax_gflops = 2 * n_params * out["jax_tokens_per_episode"] * args.batch / jt / 1e9
    torch_gflops = 2 * n_params * tr["tokens"] / tr["s"] / 1e9
    out = {**out, **setting_fields(best),
           "torch_settings": per_setting(runs, lambda r: {"s": r["s"], "min_s": r["min_s"],
                                                          "episodes_per_s": args.batch / r["s"]}),
           "torch_warmup_s": tr["warmup_s"], "torch_episodes_per_s": args.batch / tr["s"],
           "rollout_ratio": tr["s"] / jt, "torch_s": tr["s"], "torch_tokens_per_episode": tr["tokens"] / args.batch,
           "jax_model_gflops": jax_gflops, "torch_model_gflops": torch_gflops,
           "jax_frac_peak": jax_gflops / peak, "torch_frac_peak": torch_gflops / peak,
           "torch_success_rate": tr["success_rate"]}
    return {f"{name}_{k}": v for k, v in out.items()}


# ------------------------------------------------------------------ profile of the JAX rollout
def profile_jax(params, cfg, world: ToyWorld, ts: TaskSettings, rcfg: RolloutConfig, tasks, budgets, total_s,
                args) -> dict:
    """Where one JAX rollout's time goes, from whole-rollout variants (each compiled, then timed):
    the scripted noisy expert instead of the model (chunk building + env + bookkeeping, no model), and
    the same rollout with twice the cache slots (same episodes and tokens; only the attention window
    and cache size double: the difference is the time that scales with max_context)."""
    from jaxagent.envs.jax.experts import NoisyExpert

    reps = max(args.repeats, 3)
    env_params = ts.env_params()

    def timed(p, c, r):
        run = lambda k: jax.block_until_ready(rollout(p, c, world.env, world.layout, world.fmt, tasks, budgets,
                                                      jax.random.key(k), env_params, r))
        run(0)
        return median_time(lambda: run(1), reps)

    no_model = timed({"unused": np.zeros((), np.float32)}, None,
                     dataclasses.replace(rcfg, expert_fn=NoisyExpert(0.25)))
    wide = timed(params, cfg, dataclasses.replace(rcfg, max_context=2 * rcfg.max_context))
    w = max_chunk(world.layout, world.fmt, world.env, rcfg.t_max)
    return {"rollout_s": total_s, "no_model_rollout_s": no_model, "rollout_2x_context_s": wide,
            "chunk_width": w, "padded_tokens_per_episode": rcfg.t_max * (w + rcfg.max_action_tokens)}


# ------------------------------------------------------------------ the run
def run(args, preset, peer, meter: LoadMeter) -> dict:
    """One run: `args` holds the command line's settings (batch, t_max, max_context, temperature, shapes, repeats,
    env_batch, env_steps, gym_envs, gym_steps, matmul_n, torch_threads, skip_env, profile, seed), `preset` the study
    preset whose task settings and model are used (quick), `peer` the PyTorch + gymnasium side
    (`experiments.peers.torch_rollout`), `meter` the run's load window. Returns the record."""
    shapes = [s for s in args.shapes.split(",") if s]
    ts = preset.task
    with tempfile.TemporaryDirectory() as d:
        world = make_toy_world(os.path.join(d, "tokenizer"), size=ts.size)
        if args.t_max:
            ts = dataclasses.replace(ts, t_max=args.t_max)
        need = len(world.layout.system) + ts.t_max * (max_chunk(world.layout, world.fmt, world.env, ts.t_max)
                                                       + ts.max_action_tokens)
        if args.max_context:
            ts = dataclasses.replace(ts, max_context=args.max_context)
        elif args.t_max and need > ts.max_context:
            ts = dataclasses.replace(ts, max_context=-(-need // 64) * 64)
        vocab = world.tokenizer.vocab_size
        cfgs = {"default": dataclasses.replace(preset.model, vocab_size=vocab),
                "1m": Qwen3Config(vocab_size=vocab, **ONE_M_SHAPE)}

        jax_peak = jax_matmul_gflops(args.matmul_n, 5)
        result = {"batch": args.batch, "t_max": ts.t_max, "max_action_tokens": ts.max_action_tokens,
                  "max_context": ts.max_context, "map_size": ts.size, "temperature": args.temperature,
                  "repeats": args.repeats, "jax_backend": jax.devices()[0].platform,  # recorded, not a path choice
                  "loadavg_start": list(meter.start_sample.loadavg), "jax_matmul_peak_gflops": jax_peak}
        if not args.skip_env:
            result.update(bench_env(world, ts, args, peer))
        jax_side, spec = {}, {"tokenizer_dir": os.path.join(d, "tokenizer"), "map_size": ts.size, "t_max": ts.t_max,
                              "max_action_tokens": ts.max_action_tokens, "max_context": ts.max_context,
                              "format_penalty": float(ts.env_params().format_penalty),
                              "temperature": args.temperature, "seed": args.seed, "repeats": args.repeats,
                              "matmul_n": args.matmul_n, "budgets": [ts.t_max] * args.batch, "shapes": {}}
        for name in shapes:
            jax_side[name], spec["shapes"][name] = bench_jax_shape(name, cfgs[name], world, ts, args, d, peer)
        peer_runs = peer.run_peer(spec, peer_settings(len(meter.cpus), threads=args.torch_threads))
    torch_peak = max(r["matmul_gflops"] for r in peer_runs.values())
    peak = max(jax_peak, torch_peak)
    result.update(torch_matmul_peak_gflops=torch_peak, matmul_peak_gflops=peak)
    ratios = {}
    for name in shapes:
        r = finish_shape(name, jax_side[name], peer_runs, args, peak)
        ratios[name] = r[f"{name}_rollout_ratio"]
        result.update(r)
    head = min(ratios, key=ratios.get)
    result["torch_threads"] = result[f"{head}_torch_threads"]
    result["omp_wait_policy"] = result[f"{head}_omp_wait_policy"]
    result["rollout_ratio"] = ratios[head]
    result.update(meter.fields())
    result["loadavg_end"] = list(os.getloadavg())
    ratio_keys = ["env_ratio", "env_text_obs_ratio", "rollout_ratio"] + [f"{n}_rollout_ratio" for n in shapes]
    return flag_busy(result, ratio_keys)
