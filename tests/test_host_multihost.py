"""The host rollout and the host arm's training in several processes: two local processes (4 fake CPU devices each,
gloo collectives on 127.0.0.1) form one (2, 2, 2) mesh and run the ci-sql miniature's setup
(`tests/host_multihost_worker.py`): host rollouts (`worker.GROUPS` episode groups), a train step of the host
arm runtime on a rollout's tokens, one RL iteration of the host arm. The episodes (tokens, logprobs, statuses,
rewards, replies, observations) equal a one-process run on 8 fake devices (the test process itself) exactly, the
training numbers to float tolerance; the two processes agree exactly. Each env reset and step of those rollouts is
made once in the job: the two processes' calls together are the one-process run's calls, each process stepping
its own half of the batch. A scripted rollout whose env behaves differently on each process takes every result
from the process that stepped the episode (a time-out there fails it everywhere; a slow env on the other process
does not matter); an infrastructure error on one process is raised on both.

The fast tests run the same split in one process: two threads play the two processes of a scripted rollout
(`EnvShare` with an in-memory gather), and `EnvShare.exchange` is checked on its own."""
import collections
import json
import threading

import jax
import numpy as np
import pytest

from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.rollout import FAILED, host_loop
from jaxagent.rollout.host_loop import HostRolloutConfig, host_rollout
from jaxagent.rollout.host_env_calls import (EnvCalls, EnvError, EnvShare, EnvTimeout, Raised, RemoteEnvFailure,
                                             episode_owners)
from jaxagent.rollout.host_schedule import error_text
from tests import host_multihost_worker as worker
from tests.multiprocess import start_workers, wait_workers

TIMEOUT_S = 900


def _exact(key: str) -> bool:
    """The episodes' arrays and texts: equal to the bit (the rollout's collectives add at most two numbers)."""
    return key.startswith(tuple(f"g{g}." for g in worker.GROUPS))


@pytest.fixture(scope="module")
def results(tmp_path_factory, tok):
    workers = start_workers("host_multihost_worker.py", tmp_path_factory.mktemp("host_multihost"))
    ref = worker.run()  # the one-process reference, meanwhile (conftest gives this process 8 devices)
    return ref, [dict(np.load(path)) for path in wait_workers(workers, TIMEOUT_S)]


@pytest.mark.slow
def test_two_processes_roll_out_the_same_episodes(results):
    ref, procs = results
    assert int(ref["process_count"]) == 1 and all(int(r["process_count"]) == 2 for r in procs)
    for tag in (f"g{g}" for g in worker.GROUPS):
        # real episodes: every one played at least one turn, the budgets held, the rows replicated
        turns = ref[f"{tag}.turns_used"]
        assert np.all(turns >= 1) and np.all(turns <= worker.BUDGETS_B), turns
        assert ref[f"{tag}.policy_mask"].sum() > 0 and np.all(np.isfinite(ref[f"{tag}.logprobs"]))
        assert all(bool(r[f"{tag}.replicated"]) for r in procs)
    for r in procs:
        for k in ref:
            if _exact(k):
                np.testing.assert_array_equal(r[k], ref[k], err_msg=k)


@pytest.mark.slow
def test_two_processes_train_like_one(results):
    ref, procs = results
    assert np.isfinite(ref["step.loss"]) and float(ref["step.grad_norm"]) > 0
    for r in procs:
        for k in ref:
            if k.startswith(("step.", "iter.")):
                np.testing.assert_allclose(r[k], ref[k], rtol=1e-4, atol=1e-6, err_msg=k)
    for k in procs[0]:
        if not k.startswith(("seconds.", "calls.", "infra.")):  # what each process did or raised: below
            np.testing.assert_array_equal(procs[0][k], procs[1][k], err_msg=k)


@pytest.mark.slow
def test_each_env_call_is_made_once(results):
    ref, procs = results
    owners = episode_owners(len(worker.IDX_B), 2)
    for key in [f"calls.g{g}" for g in worker.GROUPS] + ["calls.iter"]:
        want = json.loads(str(ref[key]))
        mine = [json.loads(str(r[key])) for r in procs]
        assert want and all(mine), key  # both processes stepped envs
        key_of = lambda c: json.dumps(c)  # noqa: E731
        assert collections.Counter(map(key_of, mine[0] + mine[1])) == collections.Counter(map(key_of, want)), key
        assert not {key_of(c) for c in mine[0]} & {key_of(c) for c in mine[1]}, key
    for g in worker.GROUPS:  # process p reset exactly the episodes it owns
        seeds = ref[f"g{g}.seeds"].tolist()
        for p, r in enumerate(procs):
            reset = sorted(c[1] for c in json.loads(str(r[f"calls.g{g}"])) if c[0] == "reset")
            assert reset == sorted(s for s, o in zip(seeds, owners) if o == p)


@pytest.mark.slow
def test_the_stepping_process_decides_each_result(results):
    _, procs = results
    for r in procs:  # (the two processes' records are equal: test_two_processes_train_like_one)
        errors, infos = json.loads(str(r["div.errors"])), json.loads(str(r["div.infos"]))
        obs = json.loads(str(r["div.obs"]))
        assert errors[0] is None and errors[1] is None and errors[3] is None, errors
        assert obs[1][1].endswith("(process 0)") and obs[1][2].endswith("(process 0)"), obs[1]
        assert "EnvTimeout" in errors[2] and infos[2][0] == {"timeout": True}, (errors, infos)
        assert r["div.status"][2] == FAILED and r["div.status"][1] != FAILED
    raised = [json.loads(str(r["infra.raised"])) for r in procs]
    assert raised[1] == ["InfrastructureFailure", "the sandbox broke"]
    assert raised[0] == ["RemoteEnvFailure", "process 1: InfrastructureFailure: the sandbox broke"]


# ------------------------------------------------------------------------------- the split in one process
class _Gather:
    """`process_allgather` of byte strings between threads that play the processes."""

    def __init__(self, n: int):
        self.barrier, self.slots = threading.Barrier(n, timeout=60), [None] * n

    def __call__(self, p: int, blob: bytes) -> list:
        self.slots[p] = blob
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class _Counting:
    """An SQL env that records the calls made on each (thread-played) process."""

    def __init__(self, env, process):
        self.env, self.process, self.calls = env, process, collections.defaultdict(list)

    def reset(self, seed, task):
        self.calls[self.process()].append(("reset", seed))
        state, obs = self.env.reset(seed, task)
        return (seed, state), obs

    def step(self, seed_state, text):
        seed, state = seed_state
        self.calls[self.process()].append(("step", seed, state.turn, text))
        state, obs, reward, done, info = self.env.step(state, text)
        return (seed, state), obs, reward, done, info

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)


@pytest.fixture(scope="module")
def sql_env(tmp_path_factory):
    env = SQLEnv(cache_dir=tmp_path_factory.mktemp("sql"), time_limit_s=1.0)
    yield env
    env.close()


def test_two_thread_processes_step_each_episode_once(sql_env, tok, monkeypatch):
    """A scripted rollout of 6 episodes (3 turns, overlapping groups) played by two threads as processes 0 and 1:
    the episodes equal the one-process rollout's, and each env call is made once, by the episode's owner."""
    tasks = sql_env.tasks("train")[:3] * 2
    script = ["```sql\nSELECT 1\n```", "```sql\nSELECT name FROM customers\n```", "<answer>SELECT 2</answer>"]
    rcfg = HostRolloutConfig(t_max=3, max_action_tokens=24, max_context=1024, workers=2, overlap_groups=2)
    local = threading.local()
    env = _Counting(sql_env, lambda: getattr(local, "p", 0))

    def run():
        return host_rollout(None, None, env, tok, tasks, np.full((6,), 3, np.int32), jax.random.key(3), rcfg,
                            generate_fn=lambda t, active, ctx: [script[t]] * len(ctx))

    ref = run()
    ref_calls = sorted(env.calls.pop(0), key=repr)
    gather = _Gather(2)
    monkeypatch.setattr(host_loop.jax, "process_count", lambda: 2)

    def spawn(calls):  # env worker threads belong to the process (thread) that made their EnvCalls
        p = getattr(local, "p", 0)

        def work():
            local.p = p
            EnvCalls._work(calls)

        threading.Thread(target=work, daemon=True).start()

    monkeypatch.setattr(EnvCalls, "_spawn", spawn)
    monkeypatch.setattr(host_loop, "EnvShare", lambda n: EnvShare(n, local.p, 2, lambda blob: gather(local.p, blob)))
    outs = [None, None]

    def play(p):
        local.p = p
        outs[p] = run()

    threads = [threading.Thread(target=play, args=(p,)) for p in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out.rollout.tokens), np.asarray(ref.rollout.tokens))
        np.testing.assert_array_equal(np.asarray(out.rollout.status), np.asarray(ref.rollout.status))
        assert out.trace.observations == ref.trace.observations and out.trace.actions == ref.trace.actions
        assert out.trace.errors == ref.trace.errors and out.trace.infos == ref.trace.infos
    assert sorted(env.calls[0] + env.calls[1], key=repr) == ref_calls
    owners = episode_owners(6, 2)
    for p in (0, 1):
        assert {c[1] for c in env.calls[p]} == {s for s, o in zip(ref.trace.seeds, owners) if o == p}
        states = outs[p].trace.final_states
        assert all((s is not None) == (o == p) for s, o in zip(states, owners))  # env states stay home


def test_exchange_results_errors_and_failures():
    gather = _Gather(2)
    shares = [EnvShare(4, p, 2, lambda blob, p=p: gather(p, blob)) for p in (0, 1)]
    assert episode_owners(4, 2).tolist() == [0, 0, 1, 1] and episode_owners(3, 2).tolist() == [0, 0, 1]
    assert episode_owners(2, 4).tolist() == [0, 2]
    local = [{0: ("s0", "obs0", {"a": (1, 2)}), 1: EnvTimeout("late")},
             {2: ValueError("bad sql"), 3: ("s3", "obs3", {"lock": threading.Lock()})}]  # 3: not picklable
    outs = [None, None]

    def play(p):
        outs[p] = shares[p].exchange([0, 1, 2, 3], dict(local[p]))

    threads = [threading.Thread(target=play, args=(p,)) for p in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    a, b = outs
    assert a[0] == ("s0", "obs0", {"a": (1, 2)}) and b[0] == (None, "obs0", {"a": (1, 2)})  # the state stays home
    assert isinstance(b[1], EnvTimeout) and str(b[1]) == "late"
    assert isinstance(a[2], EnvError) and error_text("step 0", a[2]) == error_text("step 0", ValueError("bad sql"))
    assert isinstance(a[3], EnvError) and isinstance(b[3], EnvError) and a[3].type_name == "UnsendableResult"
    assert str(a[3]) == str(b[3])

    # an infrastructure error: raised on both, the original where it happened
    err = RuntimeError("sandbox down")
    err.infrastructure_error = True
    local = [{0: ("s", "o"), 1: ("s", "o")}, {2: Raised(err), 3: ("s", "o")}]
    raised = [None, None]

    def fail(p):
        try:
            shares[p].exchange([0, 1, 2, 3], dict(local[p]))
        except Exception as e:  # noqa: BLE001
            raised[p] = e

    threads = [threading.Thread(target=fail, args=(p,)) for p in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert raised[1] is err
    assert isinstance(raised[0], RemoteEnvFailure) and raised[0].infrastructure_error
    assert str(raised[0]) == "process 1: RuntimeError: sandbox down"
