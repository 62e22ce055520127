"""Finding 3 on the coding domain (`host_step_quality`): the coding env's pass-rate score on a hand-made
submission, matched states from hand-made eval logs, the forced prefix's env steps replayed once per state, the
per-state comparison and the seed-aware metrics on hand-made numbers, and the ci-code miniature's finding-3
section end to end."""
import json
import math
import os
import re

import numpy as np
import pytest

from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent.envs.host import sandbox
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.eval import stats
from jaxagent.eval.findings import finding_verdict
from jaxagent.study.host import metrics as host_metrics, report as host_report, step_quality as hsq

MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"  # as test_code_env


# ----------------------------------------------------------------------------- the env's score
def test_code_env_scores_a_submission_by_its_pass_rate():
    env = CodeEnv(limits=SandboxLimits(wall_s=4.0, per_call_s=0.6, mode=MODE))
    task = next(t for t in env.tasks("all") if t.id == "pair-sum")
    n = len(task.tests)
    # answers the first 3 tests from a table, None otherwise: 3 of n tests pass
    table = json.dumps([[a, e] for a, e in task.tests[:3]])
    code = (f"import json\n_T = json.loads({table!r})\n"
            f"def {task.entry_point}(*args):\n"
            "    for a, e in _T:\n"
            "        if list(args) == a:\n"
            "            return e\n"
            "    return None\n")
    state, _ = env.reset(0, task)
    nxt, obs, reward, done, info = env.step(env.clone(state), f"My attempt:\n```python\n{code}```")
    assert info["valid"] and not done and reward == 0.0
    assert (info["n_passed"], info["n_tests"]) == (3, n) and info["pass_rate"] == pytest.approx(3 / n)
    assert obs.startswith(f"Passed 3/{n} tests.")
    assert env.step_quality(state, f"```python\n{code}```") == pytest.approx(3 / n)
    # a reply without a code block is a valid step of the episode with pass rate 0
    _, _, _, _, info = env.step(env.clone(state), "no code here")
    assert info["pass_rate"] == 0.0 and not info["valid"]


# ----------------------------------------------------------------------------- matched states
def _log(lengths, n_tiers=2):
    """An eval log of [n_tiers, P, 1] episodes; the full tier's episode p has lengths[p] replies."""
    eps = [{"actions": [f"t{u}p{p}r{i}" for i in range(lengths[p] if u == n_tiers - 1 else 1)], "seed": 0}
           for u in range(n_tiers) for p in range(len(lengths))]
    return {"status": np.zeros((n_tiers, len(lengths), 1), np.int32), "episodes": eps}


def test_candidate_states_and_equal_draws():
    evals = {"base": _log([2, 1]), "grpo/seed0": _log([1, 0])}
    cand = hsq.candidate_states(evals["base"], "base", ["A", "B"])
    assert [(s.task, s.actions, s.episode) for s in cand] == [("A", (), 2), ("A", ("t1p0r0",), 2), ("B", (), 3)]
    states = hsq.states_from_log(evals, "base", "grpo/seed0", ["A", "B"], seed=0)
    assert [s.source for s in states] == ["base", "grpo/seed0"]  # 1 from each: the RL log has 1 state
    assert states[1].actions == () and states[1].task == "A"
    states = hsq.states_from_log({"base": _log([3, 3]), "rl": _log([4, 1])}, "base", "rl", ["A", "B"], seed=1,
                                 n_states=3)
    assert [s.source for s in states] == ["base"] * 3 + ["rl"] * 3
    assert len({(s.task, s.actions) for s in states[:3]}) == 3  # without replacement
    with pytest.raises(ValueError, match="episodes"):
        hsq.candidate_states({"status": np.zeros((1, 1, 1))}, "base", ["A"])


class _CountingEnv:
    """A deterministic host env: the state is the replies so far; done when a reply is 'stop'."""

    def __init__(self):
        self.steps = 0

    def reset(self, seed, task):
        return [], "go"

    def step(self, state, text):
        self.steps += 1
        state = state + [text]
        return state, f"saw {len(state)}", 0.0, text == "stop", {"pass_rate": len(state) / 10}

    def clone(self, state):
        return list(state)


def test_stop_after_replays_the_prefix_once_and_ends_after_the_reply():
    inner = _CountingEnv()
    env = hsq.StopAfter(inner, 2)
    for reply in ("x", "y", "z"):  # three rows of one state (prefix a, b), each with its own reply
        node, _ = env.reset(123, "task")
        for a in ("a", "b"):
            node, obs, _, done, _ = env.step(node, a)
            assert not done
        node, obs, _, done, info = env.step(node, reply)
        assert done and node.state == ["a", "b", reply] and info["pass_rate"] == pytest.approx(0.3)
    assert inner.steps == 2 + 3  # the prefix's two steps once, each reply once


# ----------------------------------------------------------------------------- the comparison and the metrics
def test_per_state_comparison_on_hand_made_numbers():
    base = [[0.0, 1.0], [0.5, 0.5], [1.0, None], [None, None], [0.2, 0.4]]
    rl = [[1.0, 1.0], [0.5, 0.5], [0.0, 0.0], [1.0, 1.0], [0.1, 0.2]]
    c = hsq.per_state(base, rl)
    np.testing.assert_allclose(c["q_base"], [0.5, 0.5, 1.0, np.nan, 0.3])
    np.testing.assert_allclose(c["q_rl"], [1.0, 0.5, 0.0, 1.0, 0.15])
    assert c["used"].tolist() == [True, True, True, False, True]
    np.testing.assert_allclose(c["diff"], [0.5, 0.0, -1.0, np.nan, -0.15])
    assert c["better"].tolist() == [True, False, False, False, False]
    assert c["equal"].tolist() == [False, True, False, False, False]
    assert c["worse"].tolist() == [False, False, True, False, True]
    with pytest.raises(ValueError, match="states"):
        hsq.per_state([[0.0]], [[0.0], [1.0]])


def _rec(base, rl, src):
    return {"g": len(base[0]), "base": base, "rl": rl, "source": src, "turn": [0] * len(base),
            "task_id": ["t"] * len(base), "episode": [0] * len(base)}


def test_step_quality_metrics_seed_aware_and_report():
    scored = {
        0: _rec([[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], ["base", "grpo/seed0"]),   # diffs 1, 0
        1: _rec([[0.5, 0.5], [0.0, 0.0], [0.2, 0.2]], [[0.0, 0.0], [0.5, 0.5], [0.2, 0.2]],
                ["base", "base", "grpo/seed1"]),                                             # diffs -0.5, 0.5, 0
        2: _rec([[0.0, 0.0]], [[1.0, 1.0]], ["base"]),                                        # excluded seed
    }
    m = hsq.step_quality_metrics("code", scored, [0, 1], host_metrics.put_estimate)
    f3 = "code.f3_step"
    assert m[f"{f3}.g"] == 2 and m[f"{f3}.n_states"] == 6
    assert m[f"{f3}.diff.mean"] == pytest.approx((0.5 + 0.0) / 2)         # mean of the seeds' mean differences
    assert m[f"{f3}.diff.all.mean"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert m[f"{f3}.better.mean"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert m[f"{f3}.share_rl_better"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert m[f"{f3}.share_equal"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert m[f"{f3}.share_rl_worse"] == pytest.approx((0 + 1 / 3) / 2)
    assert m[f"{f3}.base"] == pytest.approx((0.5 + 0.7 / 3) / 2) and m[f"{f3}.rl"] == pytest.approx((1.0 + 0.7 / 3) / 2)
    assert m[f"{f3}.all.share_rl_better"] == pytest.approx((1 / 2 + 1 / 3 + 1) / 3)
    assert (m[f"{f3}.seed1.n_states"], m[f"{f3}.seed1.n_from_base"], m[f"{f3}.seed2.share_rl_better"]) == (3, 2, 1.0)
    assert "excluded: 2" in m[f"{f3}.diff.seeds"]
    (f,) = [f for f in host_metrics.domain_findings("code", "Coding") if f.key == f3]
    assert f.direction == -1 and f.effect == pytest.approx(0.05)
    assert finding_verdict(f, m)[0] in stats.VERDICTS
    assert all(g.key != "sql.f3_step" for g in host_metrics.domain_findings("sql", "SQL"))
    findings = host_metrics.domain_findings("code", "Coding")
    section = lambda metrics: "\n".join(host_report.domain_section(  # noqa: E731
        "code", "Coding", metrics, findings, policies=["base", "grpo"], tiers=[1, 2], ks=[1], t_max=2,
        splits=("train", "test"))[0])
    text = section(m)
    assert re.search(r"\| Coding: 3\. step quality on matched states .*\| 0\.250 \| .*"
                     r"\| grpo seeds 0, 1; excluded: 2 \|", text)
    assert "| RL better (%) | 41.7 |" in text and "| RL better (%), every seed | 61.1 |" in text
    # no state in any seed: a stated note instead of an estimate
    empty = {"g": 2, "base": [], "rl": [], "source": [], "turn": [], "task_id": [], "episode": []}
    none = hsq.step_quality_metrics("code", {0: empty}, [0], host_metrics.put_estimate)
    assert none[f"{f3}.n_states"] == 0 and f"{f3}.diff.mean" not in none
    assert hsq.NO_STATE_NOTE in section(none)


# ----------------------------------------------------------------------------- the ci-code miniature
def check_ci_code_finding3(root: str) -> None:
    """Finding 3 in the ci-code miniature's run under `root` (called by tests/test_host_domains.py's end-to-end
    test, which runs the miniature once for every check)."""
    p = HOST_PRESETS["ci-code"]
    run_dir = os.path.join(root, "ci-code")
    base = json.load(open(os.path.join(run_dir, "eval", "base.json")))
    assert [len(e["actions"]) for e in base["episodes"]] == np.asarray(base["turns"]).ravel().tolist()
    rec = json.load(open(os.path.join(run_dir, "eval", "f3_grpo_seed0.json")))
    n = len(rec["base"])
    assert n == len(rec["rl"]) == 2 * p.eval.step_states and rec["g"] == p.eval.step_samples
    assert rec["source"] == ["base"] * (n // 2) + ["grpo/seed0"] * (n // 2)
    assert all(0 <= t < p.task.t_max for t in rec["turn"])
    scores = [x for rows in (rec["base"], rec["rl"]) for row in rows for x in row]
    assert len(scores) == 2 * n * p.eval.step_samples and all(x is None or 0.0 <= x <= 1.0 for x in scores)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    c = hsq.per_state(rec["base"], rec["rl"])
    assert metrics["code.f3_step.n_states"] == int(c["used"].sum()) > 0
    assert metrics["code.f3_step.g"] == p.eval.step_samples
    text = open(os.path.join(run_dir, "report.md")).read()
    verdicts = "|".join(map(re.escape, stats.VERDICTS))
    assert re.search(rf"\| Multi-turn coding: 3\. step quality on matched states .*\| ({verdicts}) \| [^|]* \| grpo seeds ",
                     text)
    assert f"| matched states (all GRPO seeds) | {int(c['used'].sum())} |" in text
    share = metrics.get("code.f3_step.share_rl_better", math.nan)
    if not math.isfinite(share):  # the miniature's one seed collapsed: the every-seed rows carry the numbers
        share = metrics["code.f3_step.all.share_rl_better"]
        assert re.search(r"\| RL better \(%\), every seed \| \d+\.\d \|", text)
    assert share == pytest.approx(float(c["better"][c["used"]].mean()))
    assert "- finding 3 matched states:" in text and hsq.NO_STATE_NOTE not in text
