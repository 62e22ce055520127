"""One process of the two-process host rollout in tests/test_host_multihost.py, and the shared `run` that the
one-process reference calls too.

The ci-sql miniature's setup (its tiny random Qwen3, the real Qwen3 tokenizer, the SQL world and task settings) on
a (data, fsdp, tensor) = (2, 2, 2) mesh over the 8 global devices: the params made from a fixed key on every
process and placed with `jax.make_array_from_callback`; a host rollout of 8 episodes (4 train tasks x 2, mixed
budgets) through `host_stages.make_host_rollout_fn` with one episode group (`GROUPS`; two overlapping groups take
turns in a fixed order in a multi-process run, `host_loop`: (1, 2) checks that too, at one more set of compiles per
process, kept out of the CI suite's time); one train step of the host arm runtime on the first rollout's tokens with fixed advantages; one RL
iteration of the host arm (`host_stages.train_host_rl`). The SQL env is wrapped in a `CountingEnv` that records
every reset and step this process makes (`calls.*`: each env call is made by one process only). With several
processes also a scripted rollout whose env behaves differently on each process (`ProcessDependentEnv`: only the
process that steps an episode decides its result) and one whose env raises an infrastructure error on process 1
(`infrastructure_failure`: every process raises).

As a script (JAX_PLATFORMS=cpu, XLA_FLAGS with 4 host devices, set by the parent): gloo CPU collectives,
`jax.distributed.initialize` on 127.0.0.1, then `run`; writes its results to --out (npz).
"""
import dataclasses
import json
import os
import sys
import time

import numpy as np

MESH = (2, 2, 2)
IDX_B = np.asarray([0, 0, 1, 1, 2, 2, 3, 3], np.int32)     # train task per episode
BUDGETS_B = np.asarray([2, 1, 2, 2, 1, 2, 2, 2], np.int32)
GROUPS = (1,)      # episode groups of the compared rollouts (see the module docstring)
ROLLOUT_FIELDS = ("tokens", "policy_mask", "logprobs", "length", "status", "episode_return", "turns_used")


def _rollout_arrays(ro, trace, tag: str) -> dict:
    out = {f"{tag}.{k}": np.asarray(getattr(ro, k)) for k in ROLLOUT_FIELDS}
    out[f"{tag}.reward"] = np.asarray(ro.turns.reward)
    out[f"{tag}.valid"] = np.asarray(ro.turns.valid)
    out[f"{tag}.actions"] = np.asarray(json.dumps(trace.actions))
    out[f"{tag}.errors"] = np.asarray(json.dumps(trace.errors))
    out[f"{tag}.observations"] = np.asarray(json.dumps(trace.observations))
    out[f"{tag}.seeds"] = np.asarray(trace.seeds)
    # replicated on the mesh: every process reads every element
    out[f"{tag}.replicated"] = np.asarray(bool(ro.tokens.sharding.is_fully_replicated))
    return out


class CountingEnv:
    """The world's env, recording each reset [kind, seed, turn, text] and step made in this process (the state
    carries the episode's reset seed, so that a step names its episode)."""

    def __init__(self, env):
        import threading
        self.env, self.calls, self._lock = env, [], threading.Lock()

    def reset(self, seed, task):
        state, obs = self.env.reset(seed, task)
        with self._lock:
            self.calls.append(["reset", int(seed), 0, getattr(task, "id", "")])
        return (int(seed), 0, state), obs

    def step(self, seed_turn_state, text):
        seed, turn, state = seed_turn_state
        with self._lock:
            self.calls.append(["step", seed, turn, text])
        state, obs, reward, done, info = self.env.step(state, text)
        return (seed, turn + 1, state), obs, reward, done, info

    def take(self) -> str:
        """The calls recorded since the last `take`, as JSON."""
        with self._lock:
            out, self.calls = self.calls, []
        return json.dumps(out)

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)


class ProcessDependentEnv:
    """The world's env, except that on task `diverge` the step observation names the process that steps it, on task
    `slow` process 1's steps outlast the time-out and on task `slow0` process 0's do (`sleep_s`)."""

    def __init__(self, env, diverge, slow, slow0, sleep_s: float):
        self.env, self.diverge, self.slow, self.slow0, self.sleep_s = env, diverge, slow, slow0, sleep_s

    def reset(self, seed, task):
        state, obs = self.env.reset(seed, task)
        return (task, state), obs

    def step(self, task_state, text):
        import jax
        task, state = task_state
        state, obs, reward, done, info = self.env.step(state, text)
        if task is self.diverge:
            obs = f"{obs} (process {jax.process_index()})"
        if (task is self.slow and jax.process_index() == 1) or (task is self.slow0 and jax.process_index() == 0):
            time.sleep(self.sleep_s)
        return (task, state), obs, reward, done, info

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)


def scripted_disagreement(world, ts) -> dict:
    """A scripted host rollout (no model) of 4 episodes (process 0 steps episodes 0 and 1, process 1 episodes 2 and
    3) whose env differs between the processes: episode 1's observation names the process, episode 2's steps time
    out on process 1 and episode 3's would on process 0. The errors, statuses, observations and step infos every
    process ends with."""
    import jax
    from jaxagent.rollout.host_loop import host_rollout

    tasks = list(world.train_tasks[:4])
    env = ProcessDependentEnv(world.env, diverge=tasks[1], slow=tasks[2], slow0=tasks[3], sleep_s=3.0)
    out = host_rollout(None, None, env, world.tokenizer, tasks, np.full((4,), 2, np.int32), jax.random.key(5),
                       dataclasses.replace(ts.rollout_config(), workers=2, step_timeout_s=1.0),
                       generate_fn=lambda t, active, ctx: ["SELECT 1;"] * len(ctx))
    return {"div.errors": np.asarray(json.dumps(out.trace.errors)), "div.status": np.asarray(out.rollout.status),
            "div.obs": np.asarray(json.dumps(out.trace.observations)),
            "div.infos": np.asarray(json.dumps([[{k: v for k, v in i.items() if k in ("timeout", "diverged")}
                                                 for i in infos] for infos in out.trace.infos]))}


class InfrastructureFailure(RuntimeError):
    infrastructure_error = True


def infrastructure_failure(world, ts) -> dict:
    """A scripted rollout whose env raises an infrastructure error on process 1's first step of episode 2: what each
    process raised (type and message); the processes stay in step (the next collectives still match)."""
    import jax
    from jaxagent.rollout.host_loop import host_rollout

    class Failing(ProcessDependentEnv):
        def step(self, task_state, text):
            if task_state[0] is self.slow and jax.process_index() == 1:
                raise InfrastructureFailure("the sandbox broke")
            return super().step(task_state, text)

    tasks = list(world.train_tasks[:4])
    env = Failing(world.env, diverge=None, slow=tasks[2], slow0=None, sleep_s=0.0)
    try:
        host_rollout(None, None, env, world.tokenizer, tasks, np.full((4,), 2, np.int32), jax.random.key(5),
                     dataclasses.replace(ts.rollout_config(), workers=2),
                     generate_fn=lambda t, active, ctx: ["SELECT 1;"] * len(ctx))
        raised = ["", ""]
    except Exception as err:  # noqa: BLE001 -- recorded for the test
        raised = [type(err).__name__, str(err)]
    return {"infra.raised": np.asarray(json.dumps(raised))}


def run() -> dict:
    """Everything the test compares, as numpy arrays keyed by name."""
    import jax
    import jax.numpy as jnp

    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent import sharding
    from jaxagent.models import qwen3
    from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
    from jaxagent.sampling import Sampler
    from jaxagent.study import stages
    from jaxagent.study.host import domains as host_domains, stages as host_stages

    preset = HOST_PRESETS["ci-sql"]
    cfg, ts = preset.tiny_model, preset.task
    counting = CountingEnv(host_domains.get_domain(ts.domain).make_env())
    world = host_stages.make_host_world(ts, Tokenizer.from_dir(qwen3_tokenizer_dir()), env=counting)
    mesh = sharding.make_mesh(*MESH)
    host = jax.device_get(qwen3.init(cfg, jax.random.key(0)))  # the same on every process
    params = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]), host,
                          sharding.shardings_for(qwen3.logical_axes(cfg), host, mesh))
    out = {"process_count": np.asarray(jax.process_count())}

    traces = []
    ro, t0 = None, time.perf_counter()
    for groups in GROUPS:
        fn = host_stages.make_host_rollout_fn(world, cfg, dataclasses.replace(ts, overlap_groups=groups),
                                              world.train_tasks, sampler=Sampler(temperature=1.0), mesh=mesh,
                                              on_trace=traces.append)
        r = fn(params, IDX_B, BUDGETS_B, jax.random.key(7))
        out.update(_rollout_arrays(r, traces[-1], f"g{groups}"))
        out[f"calls.g{groups}"] = np.asarray(counting.take())
        out[f"seconds.g{groups}"] = np.asarray(time.perf_counter() - t0)
        ro = r if ro is None else ro

    # one train step of the host arm runtime on the first rollout's tokens, with fixed non-zero advantages
    rl = dataclasses.replace(stages.ARMS["grpo"], n_tasks=4, group_size=2)  # the rollouts' 8 rows
    arm = stages.ArmSettings(name="grpo", rl=rl, iterations=1, lr=1e-3, temperature=preset.temperature)
    rt = host_stages.make_host_arm_runtime(world, cfg, ts, arm, mesh=mesh, micro_batches=2,
                                           compiler_options=dict(preset.compiler_options))
    state = stages.init_arm_state(rt, cfg, jax.random.key(1), params)
    adv = np.random.default_rng(0).normal(size=ro.tokens.shape).astype(np.float32)
    rep = sharding.replicated(mesh)
    batch = {"tokens": ro.tokens, "policy_mask": ro.policy_mask, "old_logprobs": ro.logprobs,
             "advantages": jax.make_array_from_callback(adv.shape, rep, lambda i: adv[i])}
    state, m = rt.train_step(state, batch)
    out["step.loss"] = np.asarray(float(m["loss"]))
    out["step.grad_norm"] = np.asarray(float(m["grad_norm"]))
    out["seconds.step"] = np.asarray(time.perf_counter() - t0)
    out["step.checksum"] = np.asarray(float(jax.jit(
        lambda p: sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(p)), out_shardings=rep)(state.params)))

    # one RL iteration of the host arm: sampled tasks, host rollout, advantages, update
    counting.take()
    state, hist = host_stages.train_host_rl(world, cfg, params, jax.random.key(2), ts, arm, rt)
    out["calls.iter"] = np.asarray(counting.take())
    for k in ("loss", "success_rate", "mean_turns", "mean_generated_tokens", "valid_action_rate"):
        out[f"iter.{k}"] = np.asarray(hist[0][k])
    out["seconds.iter"] = np.asarray(time.perf_counter() - t0)
    if jax.process_count() > 1:
        out.update(scripted_disagreement(world, ts))
        out.update(infrastructure_failure(world, ts))
    return out


def main(argv=None):
    from tests.multiprocess import init_worker
    out = init_worker(argv)
    import jax
    np.savez(out, **run())
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
