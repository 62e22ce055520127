"""The toy host presets' RL train step on a real minibatch, in the layouts and compiler options it could run with
(`run_bench`; the command line is `python -m experiments.bench_host_step`).

The minibatch is the first update's of one training rollout of the run's SFT base (`first_minibatch`); the step is
the preset's main arm's (`stages.make_arm_step`), timed from the same initial state (`time_step`: the median of
`steps` timed steps after one compiling step) in three settings (`SETTINGS`):
  rows_decode_options   policy logits at t_max x max_action_tokens positions per row (`policy_tokens`), compiled
                        with the decoding programs' options (`xla_options.DECODING_CPU_OPTIONS`);
  rows                  the same positions, the sequence programs' options (`SEQUENCE_CPU_OPTIONS`);
  packed                the batch's policy tokens in one list (`packed_policy`), the sequence options: what the toy
                        presets run.
The three compute the same loss and update to float rounding (`*_loss` of each, `*_max_param_diff` against
`packed`). The peer is the first setting: `speedup` = its step time / packed's. How the minibatch is cut and the
update's tolerance: docs/performance.md, "What bench_host_step compares".
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import xla_options
from jaxagent.bench.host_rollout import training_rollout
from jaxagent.rl.logits_plan import PACKED_KEY
from jaxagent.rl.logprobs import packed_policy_positions
from jaxagent.rl.loop import compute_advantages
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.sampling import Sampler
from jaxagent.study import run_dir, stages
from jaxagent.study.host import stages as host_stages
from jaxagent.study.host.metrics import MAIN_ARM
from jaxagent.study.host.run import HostRun, run_base

SETTINGS = ("rows_decode_options", "rows", "packed")


def first_minibatch(run: HostRun, params, settings: stages.ArmSettings, seed: int) -> dict:
    """The first update's minibatch of one training rollout of `params` (module doc), as host numpy arrays."""
    p, rl = run.preset, settings.rl
    key = jax.random.key(seed)
    k_task, k_roll, k_perm = jax.random.split(key, 3)
    rollout_fn = host_stages.make_host_rollout_fn(run.world, run.cfg, p.task, run.world.train_tasks,
                                                  sampler=Sampler(temperature=settings.temperature),
                                                  compute_dtype=p.compute_dtype, mesh=run.mesh)
    ro = training_rollout(run, rollout_fn, params, k_task, k_roll)
    adv, _, _ = compute_advantages(ro, rl, None)
    batch = {"tokens": ro.tokens, "policy_mask": ro.policy_mask, "advantages": adv, "old_logprobs": ro.logprobs}
    idx = np.asarray(jax.random.permutation(k_perm, rl.batch_size))[:rl.batch_size // rl.minibatches]
    return {k: np.asarray(v)[idx] for k, v in batch.items()}


def time_step(step, state_fn, batch: dict, steps: int):
    """(median seconds of `steps` steps after a compiling one, each from a fresh `state_fn()`; the last new state;
    the loss)."""
    new, m = step(state_fn(), batch)
    loss = float(m["loss"])
    times = []
    for _ in range(steps):
        state = state_fn()
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        new, m = step(state, batch)
        jax.block_until_ready((new.params, m))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), new, loss


def run_bench(run: HostRun, steps: int, seed: int) -> dict:
    """The module doc's measurement on `run`'s finished base stage (`run_dir.InvalidRunDir` without one)."""
    p = run.preset
    if p.sft is None or not run_dir.done(run.path("base")):
        raise run_dir.InvalidRunDir(f"{run.dir}: no finished SFT base (run `python -m experiments.reproduce --preset "
                         f"{p.name}` first; this benchmark reads its base/policy)")
    params = run_base(run)  # base/policy: the stage is done
    settings = run.arm_settings(MAIN_ARM)
    mb = first_minibatch(run, params, settings, seed)
    per_row = p.task.t_max * p.task.max_action_tokens
    decode = dict(xla_options.DECODING_CPU_OPTIONS)
    variants = {"rows_decode_options": (dict(policy_tokens=per_row, compiler_options=decode), None),
                "rows": (dict(policy_tokens=per_row), None),
                "packed": (dict(packed_policy=True), host_stages.PACK_BUCKET)}
    out = {"bench": "host_train_step", "preset": p.name, "rows": int(mb["tokens"].shape[0]),
           "slots": int(mb["tokens"].shape[1]), "policy_tokens": int(mb["policy_mask"].sum()),
           "policy_positions_per_row": per_row, "backend": jax.devices()[0].platform, "steps": steps}
    states = {}
    for name, (kw, bucket) in variants.items():
        arm_step = stages.make_arm_step(run.cfg, settings, memory=MemoryPlan(compute_dtype=p.compute_dtype, **kw))
        rt = stages.ArmRuntime(None, arm_step.jit, arm_step.optimizer, None, None, None, None, None,
                               with_ref_params=arm_step.with_ref_params)
        batch = {k: jnp.asarray(v) for k, v in mb.items()}
        if bucket is not None:
            batch[PACKED_KEY] = jnp.asarray(packed_policy_positions(mb["policy_mask"], bucket))
            out["packed_positions"] = int(batch[PACKED_KEY].shape[1])
        out[f"{name}_step_s"], states[name], out[f"{name}_loss"] = time_step(
            arm_step.jit, lambda rt=rt: stages.init_arm_state(rt, run.cfg, jax.random.key(seed), params), batch, steps)
    for name in SETTINGS[:-1]:
        out[f"{name}_max_param_diff"] = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
            jax.tree.leaves(states[name].params), jax.tree.leaves(states["packed"].params)))
    out["speedup"] = out["rows_decode_options_step_s"] / out["packed_step_s"]
    return out
