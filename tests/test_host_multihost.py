"""The host rollout and the host arm's training in several processes: two local processes (4 fake CPU devices each,
gloo collectives on 127.0.0.1) form one (2, 2, 2) mesh and run the ci-sql miniature's setup
(`tests/host_multihost_worker.py`): host rollouts (`worker.GROUPS` episode groups), a train step of the host
arm runtime on a rollout's tokens, one RL iteration of the host arm. The episodes (tokens, logprobs, statuses,
rewards, replies) equal a one-process run on 8 fake devices (the test process itself) exactly, the training
numbers to float tolerance; the two processes agree exactly. A scripted rollout whose env results differ between
the processes (one episode's observation, another's time-out on process 1 only) fails those two episodes on both
processes alike."""
import json

import numpy as np
import pytest

from jaxagent.rollout import FAILED
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
        if not k.startswith("seconds."):
            np.testing.assert_array_equal(procs[0][k], procs[1][k], err_msg=k)


@pytest.mark.slow
def test_env_results_that_differ_between_processes_fail_their_episode_everywhere(results):
    _, procs = results
    for r in procs:  # (the two processes' records are equal: test_two_processes_train_like_one)
        errors, infos = json.loads(str(r["div.errors"])), json.loads(str(r["div.infos"]))
        assert errors[0] is None and errors[3] is None, errors
        assert "EnvDiverged" in errors[1] and infos[1][0] == {"diverged": True}, (errors, infos)
        assert "EnvTimeout" in errors[2] and "on process 1 " in errors[2] and infos[2][0] == {"timeout": True}
        assert r["div.status"][1] == FAILED and r["div.status"][2] == FAILED
