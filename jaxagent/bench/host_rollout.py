"""A toy host preset's training rollout with and without compacted decoding (the command line is
`python -m experiments.bench_host_rollout`).

The rollouts: `n` training rollouts of the run's SFT base (`n_tasks` x `group_size` episodes of the preset's train
tasks, full budgets, temperature 1), rollout i sampled with key `seed + i`, the same keys in both settings, after one
compiling rollout each:
  full_rows   every row of a group steps until the group's longest reply ends (`compact_decode=False`; the peer);
  compacted   the token loop goes on over a quarter of the rows, then a sixteenth, as replies end
              (`HostRolloutConfig.compact_decode`, `host_policy.compact_rows`): what the presets run.
Per setting: `*_rollout_s` (the median wall time of a rollout), and what the rollouts did, which only sampling
noise may tell apart (a compacted row draws its noise at the narrower width): `*_success` (the episodes' success
rate) and `*_success_se` (its binomial standard error), `*_policy_tokens` (mean per episode), `*_turns` (mean
turns played). `speedup` = full_rows' rollout time / compacted's."""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.sampling import Sampler
from jaxagent.study import run_dir
from jaxagent.study.host import stages as host_stages
from jaxagent.study.host.metrics import MAIN_ARM
from jaxagent.study.host.run import HostRun, run_base

SETTINGS = ("full_rows", "compacted")


def training_rollout(run: HostRun, rollout_fn, params, k_task, k_roll):
    """One training rollout as the main arm's iterations draw it: `n_tasks` train tasks sampled with `k_task`, each
    `group_size` times at full budget, rolled out by `rollout_fn` (`make_host_rollout_fn`) with `k_roll`."""
    p, rl = run.preset, run.arm_settings(MAIN_ARM).rl
    tasks = host_stages.task_sampler(len(run.world.train_tasks))(k_task, rl.n_tasks)
    return rollout_fn(params, jnp.repeat(tasks, rl.group_size), jnp.full((rl.batch_size,), p.task.t_max, jnp.int32),
                      k_roll)


def run_bench(run: HostRun, n: int, seed: int) -> dict:
    """The module doc's measurement on `run`'s finished base stage (`run_dir.InvalidRunDir` without one)."""
    p = run.preset
    if p.sft is None or not run_dir.done(run.path("base")):
        raise run_dir.InvalidRunDir(f"{run.dir}: no finished SFT base (run `python -m experiments.reproduce --preset "
                                    f"{p.name}` first; this benchmark reads its base/policy)")
    params = run_base(run)
    rl = run.arm_settings(MAIN_ARM).rl
    sampler = Sampler(temperature=1.0)
    out = {"bench": "host_rollout", "preset": p.name, "episodes": rl.batch_size, "rollouts": n, "seed": seed,
           "max_action_tokens": p.task.max_action_tokens, "backend": jax.devices()[0].platform}
    for name in SETTINGS:
        fn = host_stages.make_host_rollout_fn(run.world, run.cfg, p.task, run.world.train_tasks, sampler=sampler,
                                              compute_dtype=p.compute_dtype, mesh=run.mesh,
                                              compact_decode=name == "compacted")
        times, success, tokens, turns = [], [], [], []
        for i in range(-1, n):  # i = -1: the compiling rollout, untimed
            key = jax.random.key(seed + max(i, 0))
            t0 = time.perf_counter()
            ro = training_rollout(run, fn, params, key, key)
            jax.block_until_ready(ro.tokens)
            if i >= 0:
                times.append(time.perf_counter() - t0)
                success.append(np.asarray(ro.episode_return) > 0)
                tokens.append(np.asarray(ro.policy_mask).sum(1))
                turns.append(np.asarray(ro.turns_used))
        s = np.concatenate(success)
        out.update({f"{name}_rollout_s": statistics.median(times), f"{name}_success": float(s.mean()),
                    f"{name}_success_se": float(np.sqrt(s.mean() * (1 - s.mean()) / s.size)),
                    f"{name}_policy_tokens": float(np.concatenate(tokens).mean()),
                    f"{name}_turns": float(np.concatenate(turns).mean())})
    out["speedup"] = out["full_rows_rollout_s"] / out["compacted_rollout_s"]
    return out
