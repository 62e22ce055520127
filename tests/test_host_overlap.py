"""The host rollout's schedule (`rollout/host_schedule.py`, `rollout/host_env_calls.py`): env steps of one
episode group overlap the model's decoding of another, the result is the same with and without overlap, a hung env call ends only
its own episode (the rollout returns after about the time limit), and each turn's seconds are split
into model vs env."""
import dataclasses
import threading
import time

import jax
import numpy as np
import pytest

from jaxagent.envs.host.base import HostEnv, make_info
from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.rollout import BUDGET_EXHAUSTED, FAILED, SUCCESS
from jaxagent.rollout.host_loop import HostRolloutConfig, host_rollout
from jaxagent.rollout.host_env_calls import EnvCalls, EnvTimeout
from jaxagent.rollout.host_schedule import episode_groups
from jaxagent.sampling import Sampler

RCFG = HostRolloutConfig(t_max=3, max_action_tokens=128, max_context=4096)


@pytest.fixture(scope="module")
def warm(tok):
    """One rollout of the timed tests' size (4 episodes) first: the compiles of the key ops that draw
    the reset seeds are not part of the timed rollouts."""
    host_rollout(None, None, _SleepyEnv(), tok, [0, 1, 2, 3], [1] * 4, jax.random.key(0), RCFG,
                 generate_fn=_scripted([["x"]] * 4))
    return tok


class _SleepyEnv(HostEnv):
    """Tasks 0..7; a step sleeps `step_s` (outside the GIL), a chosen (task, turn) step or task reset
    hangs until `release` is set; "answer" ends the episode with success. Records every step's
    (task, turn, start, end)."""

    name = "sleepy"

    def __init__(self, step_s=0.0, hang_steps=(), hang_resets=()):
        self.step_s, self.hang_steps, self.hang_resets = step_s, set(hang_steps), set(hang_resets)
        self.release, self.lock, self.steps = threading.Event(), threading.Lock(), []

    def tasks(self, split="train"):
        return list(range(8))

    def system_prompt(self, task):
        return "Reply with anything."

    def reset(self, seed, task):
        if task in self.hang_resets:
            self.release.wait(60)
        return {"task": task, "turn": 0}, f"Task {task}."

    def step(self, state, action_text):
        start = time.perf_counter()
        if (state["task"], state["turn"]) in self.hang_steps:
            self.release.wait(60)
        else:
            time.sleep(self.step_s)
        with self.lock:
            self.steps.append((state["task"], state["turn"], start, time.perf_counter()))
        done = action_text == "answer"
        info = make_info(valid=True, success=done, anchor=state["turn"], next_anchor=state["turn"] + 1, error=None)
        state = dict(state, turn=state["turn"] + 1)
        return state, f"Turn {state['turn']} done.", float(done), done, info


def _scripted(per_episode, sleep_per_episode=0.0, log=None):
    """generate_fn replaying per_episode[b][t]; sleeps `sleep_per_episode` per active episode (a model's
    cost grows with its batch) and logs (active episodes, start, end) of each call."""
    def fn(t, active, contexts):
        start = time.perf_counter()
        time.sleep(sleep_per_episode * int(active.sum()))
        if log is not None:
            log.append((set(np.flatnonzero(active).tolist()), start, time.perf_counter()))
        return [per_episode[b][t] if active[b] else None for b in range(len(per_episode))]
    return fn


def _arrays(res):
    return jax.tree.map(np.asarray, res.rollout)


def _assert_same(a, b):
    jax.tree.map(np.testing.assert_array_equal, _arrays(a), _arrays(b))
    for field in ("seeds", "errors", "actions", "observations", "infos", "dones"):
        assert getattr(a.trace, field) == getattr(b.trace, field), field


# ------------------------------------------------------------------------- groups and the call runner
def test_episode_groups_interleave_and_pad():
    assert [g.tolist() for g in episode_groups(5, 2)] == [[0, 2, 4], [1, 3, -1]]
    assert [g.tolist() for g in episode_groups(3, 1)] == [[0, 1, 2]]
    assert [g.tolist() for g in episode_groups(2, 4)] == [[0], [1]]  # never more groups than episodes


def test_time_limit_counts_from_the_start_of_a_call():
    """One worker, three 0.3 s calls in a row, a 0.5 s limit: none times out (each is on time), and a
    hung call is abandoned after its limit while its worker is replaced."""
    calls = EnvCalls(1, 0.5)
    try:
        t0 = time.perf_counter()
        assert calls.collect([calls.submit(time.sleep, 0.3) for _ in range(3)]) == [None] * 3
        assert 0.9 <= time.perf_counter() - t0 < 5.0  # (slack for a busy machine)
        hang = threading.Event()
        t0 = time.perf_counter()
        out = calls.collect([calls.submit(hang.wait, 30), calls.submit(lambda: 7)])
        assert isinstance(out[0], EnvTimeout) and out[1] == 7
        assert 0.5 <= time.perf_counter() - t0 < 5.0
        assert calls.collect([calls.submit(lambda: 8)]) == [8]  # the fresh worker runs the next call
        hang.set()
    finally:
        calls.close()


# ------------------------------------------------------------------------- time-outs
@pytest.mark.parametrize("groups", [1, 2])
def test_hung_step_ends_only_its_episode(warm, groups):
    tok = warm
    env = _SleepyEnv(hang_steps={(1, 1)})
    acts = [["x", "x", "x"], ["x", "x", "x"], ["x", "answer"], ["x", "x", "x"]]
    try:
        t0 = time.perf_counter()
        res = host_rollout(None, None, env, tok, [0, 1, 2, 3], [3, 3, 3, 3], jax.random.key(0),
                           dataclasses.replace(RCFG, overlap_groups=groups, step_timeout_s=0.5),
                           generate_fn=_scripted(acts))
        wall = time.perf_counter() - t0
    finally:
        env.release.set()
    r, trace = _arrays(res), res.trace
    assert r.status.tolist() == [BUDGET_EXHAUSTED, FAILED, SUCCESS, BUDGET_EXHAUSTED]
    assert r.turns_used.tolist() == [3, 2, 2, 3]
    assert trace.errors[1].startswith("step 1: EnvTimeout: no result within 0.5 s")
    assert trace.infos[1][1]["timeout"] is True and not trace.infos[1][1]["valid"] and trace.dones[1] == [False, True]
    assert trace.final_states[1] is None and trace.final_states[0]["turn"] == 3
    assert [e is None for e in trace.errors] == [True, False, True, True]
    assert r.turns.active[1, 1] and r.turns.anchor[1, 1] == -1 and r.episode_return[1] == 0
    # the rollout waited once for the limit, not for the hung call (60 s); the slack is for a busy machine
    assert 0.5 <= wall < 0.5 + 8
    assert res.trace.timing.env_s[1] >= 0.5


def test_hung_reset_ends_only_its_episode(warm):
    tok = warm
    env = _SleepyEnv(hang_resets={2})
    acts = [["x", "answer"]] * 4
    try:
        t0 = time.perf_counter()
        res = host_rollout(None, None, env, tok, [0, 1, 2, 3], [3] * 4, jax.random.key(0),
                           dataclasses.replace(RCFG, step_timeout_s=0.5), generate_fn=_scripted(acts))
        wall = time.perf_counter() - t0
    finally:
        env.release.set()
    r, trace = _arrays(res), res.trace
    assert r.status.tolist() == [SUCCESS, SUCCESS, FAILED, SUCCESS] and r.turns_used.tolist() == [2, 2, 0, 2]
    assert trace.errors[2].startswith("reset: EnvTimeout") and trace.final_states[2] is None
    assert 0.5 <= wall < 0.5 + 8 and res.trace.timing.reset_s >= 0.5


def test_infrastructure_error_still_raises(tok):
    class Broken(_SleepyEnv):
        def step(self, state, action_text):
            err = RuntimeError("sandbox down")
            err.infrastructure_error = True
            raise err

    with pytest.raises(RuntimeError, match="sandbox down"):
        host_rollout(None, None, Broken(), tok, [0, 1], [2, 2], jax.random.key(0), RCFG,
                     generate_fn=_scripted([["x", "x"]] * 2))


def test_bad_schedule_settings(tok):
    run = lambda **kw: host_rollout(None, None, _SleepyEnv(), tok, [0, 1], [1, 1], jax.random.key(0),  # noqa
                                    dataclasses.replace(RCFG, **kw), generate_fn=_scripted([["x"]] * 2))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="overlap_groups"):
            run(overlap_groups=bad)
    for bad in (0, -2.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="step_timeout_s"):
            run(step_timeout_s=bad)
    assert run(step_timeout_s=None, overlap_groups=8).trace.timing.n_groups == 2  # at most one per episode


# ------------------------------------------------------------------------- overlap
def test_env_steps_overlap_the_other_groups_decoding(warm):
    """A model that takes 0.2 s per active episode and env steps of 0.4 s, 4 episodes, 3 turns (one
    episode ends after 2): serial, the model's 2.2 s and the envs' 3 * 0.4 s add up (>= 3.4 s); with two
    groups one group's steps run while the other decodes, hiding all but ~0.6 s of them (~2.8 s), and
    the records are the same."""
    tok = warm
    acts = [["x", "x", "x"], ["x", "answer"], ["x", "x", "x"], ["x", "x", "answer"]]
    out = {}
    for groups in (1, 2):
        env, log = _SleepyEnv(step_s=0.4), []
        t0 = time.perf_counter()
        res = host_rollout(None, None, env, tok, [0, 1, 2, 3], [3] * 4, jax.random.key(0),
                           dataclasses.replace(RCFG, workers=4, overlap_groups=groups),
                           generate_fn=_scripted(acts, 0.2, log))
        out[groups] = res, time.perf_counter() - t0, env.steps, log
    _assert_same(out[1][0], out[2][0])
    (_, serial, steps1, log1), (res2, overlap, steps2, log2) = out[1], out[2]
    overlaps = lambda steps, log: [(task, calls) for task, _, s, e in steps for calls, gs, ge in log  # noqa: E731
                                   if task not in calls and min(e, ge) - max(s, gs) > 0.03]
    assert not overlaps(steps1, log1)  # serial: no env step while the model decodes
    # two groups: some env step of one group ran while the model decoded only the other group
    assert overlaps(steps2, log2)
    assert all(len(calls) <= 2 for calls, _, _ in log2) and len(log2) == 6
    assert serial >= 3.4 and overlap < serial - 0.3, (serial, overlap)  # ~2.8 s vs ~3.4 s
    timing = res2.trace.timing
    assert timing.n_groups == 2 and timing.model_s.sum() >= 2.2 and timing.env_s.sum() >= 2.4
    assert timing.env_wait_s.sum() < timing.env_s.sum() - 1.0  # env time hidden behind decoding
    np.testing.assert_allclose(timing.wall_s, timing.model_s + timing.env_wait_s + timing.host_s)
    assert timing.wall_s.sum() <= timing.total_s and timing.summary()["hidden_env_s"] > 1.0


def test_sql_scripted_and_forced_same_with_any_groups(tok):
    env = SQLEnv()
    tasks = env.tasks("all")[:5]
    explore = "Let me look first.\n```sql\nSELECT 1\n```"
    acts = [[explore, f"<answer>{tasks[0].gold}</answer>"], [f"<answer>{tasks[1].gold}</answer>"],
            ["<answer>SELECT 42</answer>"] * 2, [explore, explore], [explore, "no query", explore]]
    forced = [[], [None], ["```sql\nSELECT name FROM customers\n```"], [], [None, None, "<answer>SELECT 1</answer>"]]
    runs = [host_rollout(None, None, env, tok, tasks, [3, 3, 3, 2, 3], jax.random.key(1),
                         dataclasses.replace(RCFG, workers=w, overlap_groups=g), generate_fn=_scripted(acts),
                         forced_actions=forced)
            for g, w in ((1, 4), (2, 4), (3, 2), (5, 1))]
    r = _arrays(runs[0])
    assert r.status.tolist() == [SUCCESS, SUCCESS, FAILED, BUDGET_EXHAUSTED, FAILED]
    assert r.turns.forced[r.turns.active].all() and r.turns_used.tolist() == [2, 1, 2, 2, 3]
    assert [t.n_groups for t in (x.trace.timing for x in runs)] == [1, 2, 3, 5]
    for other in runs[1:]:
        _assert_same(runs[0], other)


# ------------------------------------------------------------------------- the sampled policy
@pytest.mark.slow  # compiles the tiny model's append / decode (~30-60 s on 2 busy cores)
def test_greedy_model_same_with_and_without_overlap(tok, host_model):
    """Greedy decoding uses no noise: each episode's replies, log-probs and records are the same whether
    it decodes with all episodes or in its group (the rows of a batch never mix), forced replies
    included; the sampled policy reproduces itself per key and G."""
    cfg, params = host_model
    env = SQLEnv()
    tasks = env.tasks("all")[:3]
    rcfg = dataclasses.replace(RCFG, max_action_tokens=16, sampler=Sampler(greedy=True))
    forced = [[], ["```sql\nSELECT 1\n```"], [None, "<answer>SELECT 1</answer>"]]
    run = lambda g, rc=rcfg, k=0: host_rollout(params, cfg, env, tok, tasks, [3, 2, 3], jax.random.key(k),  # noqa
                                               dataclasses.replace(rc, overlap_groups=g), forced_actions=forced)
    serial, grouped = run(1), run(2)
    _assert_same(serial, grouped)
    r = _arrays(serial)
    assert r.turns.forced.tolist() == [[False] * 3, [True, False, False], [False, True, False]]
    assert r.policy_mask.sum() > 0 and r.status[2] == FAILED
    sampled = dataclasses.replace(rcfg, sampler=Sampler(temperature=1.0))
    _assert_same(run(2, sampled, 5), run(2, sampled, 5))
