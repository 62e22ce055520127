"""The host-domain study (SQL): the task-index adapter, the tool-output cap, Pass@(K,T) episodes and the structural
bound on synthetic and scripted data, the seed-aware metrics, and the ci-sql miniature end to end through
`experiments.reproduce` (files, the report's SQL section, Pass@ recomputed from the raw eval logs, the bound
against `upper_bound_turns`), and an arm's per-iteration checkpoints: interrupted, refused with other settings,
resumed to the miniature's own result."""
import dataclasses
import json
import math
import os
import re
import types as pytypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.study.host import run as host_run
from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent.envs.host import base as host
from jaxagent.eval import health, stats
from jaxagent.eval.findings import finding_verdict
from jaxagent.models import weights
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rollout import SUCCESS, FAILED, HostRolloutConfig, host_rollout
from jaxagent.study.host import (error_recovery as host_error_recovery, metrics as host_metrics, report as host_report,
                                 stages as host_stages)
from jaxagent.aot import host as aot_host
from tests import aot_coverage
from tests.passk_reference import comb_pass
from jaxagent.study import run_dir


@pytest.fixture(scope="module")
def world(tok):
    return host_stages.make_host_world(host_stages.HostTaskSettings(domain="sql", t_max=3, max_obs_tokens=20), tok)


# ----------------------------------------------------------------------------- the task-index adapter
def test_task_indices_sample_and_map():
    idx = host_stages.task_sampler(5)(jax.random.key(0), 64)
    assert idx.dtype == jnp.int32 and idx.shape == (64,)
    assert int(idx.min()) >= 0 and int(idx.max()) <= 4 and len(set(np.asarray(idx).tolist())) > 1
    tasks = ["a", "b", "c", "d", "e"]
    # rl_iteration repeats each sampled index G times: the mapped tasks follow
    rep = jnp.repeat(jnp.asarray([3, 0], jnp.int32), 2)
    assert host_stages.tasks_from_indices(tasks, rep) == ["d", "d", "a", "a"]
    with pytest.raises(ValueError, match="out of range"):
        host_stages.tasks_from_indices(tasks, np.asarray([0, 5]))
    with pytest.raises(ValueError, match="integer"):
        host_stages.tasks_from_indices(tasks, np.asarray([0.5]))


def test_rollout_fn_maps_indices_and_budgets(world, monkeypatch):
    seen = {}

    def fake(params, cfg, env, tokenizer, tasks, budgets, key, rcfg, **kw):
        seen.update(tasks=tasks, budgets=np.asarray(budgets).tolist(), rcfg=rcfg, env=env, kw=kw)
        return pytypes.SimpleNamespace(rollout="ro")

    monkeypatch.setattr(host_stages, "host_rollout", fake)
    ts = host_stages.HostTaskSettings(domain="sql", t_max=3, max_action_tokens=7, max_context=999)
    fn = host_stages.make_host_rollout_fn(world, None, ts, world.train_tasks)
    assert fn({"w": jnp.zeros(())}, jnp.asarray([2, 2, 0], jnp.int32), jnp.asarray([3, 1, 2]), jax.random.key(0)) == "ro"
    assert seen["tasks"] == [world.train_tasks[2], world.train_tasks[2], world.train_tasks[0]]
    assert seen["budgets"] == [3, 1, 2] and seen["env"] is world.env
    assert (seen["rcfg"].t_max, seen["rcfg"].max_action_tokens, seen["rcfg"].max_context) == (3, 7, 999)
    assert seen["rcfg"].enable_thinking is False and seen["rcfg"].workers == ts.workers and not seen["kw"]


def test_host_arm_runtime_refuses_critic_arms(world):
    from jaxagent.study import stages
    arm = stages.ArmSettings(name="ppo", rl=stages.ARMS["ppo"])
    with pytest.raises(ValueError, match="critic"):
        host_stages.make_host_arm_runtime(world, None, host_stages.HostTaskSettings(), arm)


def test_host_arm_step_refuses_rows_beyond_policy_tokens(world):
    """With policy_tokens the step projects at each row's policy tokens only; a batch holding more (whose extra
    log-probs would read 0) raises after the step instead of training on them. Within the bound it trains."""
    from jaxagent.models.config import Qwen3Config
    from jaxagent.models import qwen3
    from jaxagent.study import stages
    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], kl_coef=0.1, kl_estimator="exact")
    rt = host_stages.make_host_arm_runtime(world, cfg, host_stages.HostTaskSettings(), arm, policy_tokens=3,
                                           compiler_options={"xla_backend_optimization_level": 0})
    params = qwen3.init(cfg, jax.random.key(0))
    mask = np.zeros((2, 8), bool)
    mask[:, 2:5] = True
    batch = {"tokens": jnp.ones((2, 8), jnp.int32), "policy_mask": jnp.asarray(mask),
             "advantages": jnp.ones((2, 8), jnp.float32), "old_logprobs": jnp.full((2, 8), -4.0, jnp.float32)}
    _, m = rt.train_step(stages.init_arm_state(rt, cfg, jax.random.key(1), params), batch)
    assert float(m["policy_tokens_over"]) == 0 and float(m["tokens"]) == 6
    mask[1, 5] = True
    with pytest.raises(ValueError, match="1 policy tokens beyond policy_tokens = 3"):
        rt.train_step(stages.init_arm_state(rt, cfg, jax.random.key(1), params),
                      dict(batch, policy_mask=jnp.asarray(mask)))


# ----------------------------------------------------------------------------- the tool-output cap
def test_cap_observation_text_and_tool_blocks(tok):
    text = " ".join(f"row{i}" for i in range(200))
    n = len(tok.encode(text))
    capped, cut = host_stages.cap_observation(text, tok, 10)
    assert cut == n - 10 and capped.endswith(f"[... output truncated: {n - 10} more tokens]")
    assert capped.startswith(tok.decode(tok.encode(text)[:10]))
    assert host_stages.cap_observation("short", tok, 10) == ("short", 0)
    blocks = f"<tool_response>\n{text}\n</tool_response>\n<tool_response>\nok\n</tool_response>"
    capped, cut = host_stages.cap_observation(blocks, tok, 10)
    assert cut == n - 10 and capped.count("<tool_response>\n") == 2 and capped.endswith("\nok\n</tool_response>")


def test_capped_env_cuts_step_observations_only(world):
    env = world.env
    assert env.upper_bound_turns(world.train_tasks[0]) == 1 and env.name == "sql"  # delegated
    task = world.train_tasks[0]
    state, obs0 = env.reset(0, task)
    assert obs0 == task.question
    state, obs, reward, done, info = env.step(state, "```sql\nSELECT * FROM customers\n```")
    assert info["valid"] and info["obs_truncated_tokens"] > 0 and "output truncated" in obs
    assert len(world.tokenizer.encode(obs.split("\n[... output truncated")[0])) <= 21
    _, obs, reward, done, info = env.step(state, f"<answer>{task.gold}</answer>")
    assert done and reward == 1.0 and "obs_truncated_tokens" not in info


# ----------------------------------------------------------------------------- Pass@(K,T) and the bound
def test_structural_bound_synthetic():
    b = host_metrics.structural_bound([1, 3, 5, -1], [1, 2, 4, 6], [1, 2, 4])
    np.testing.assert_allclose(b["share"], [0.25, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(b["grid"], np.repeat(b["share"][:, None], 3, axis=1))  # p* in {0, 1}: K-free
    assert b["p_star"].shape == (4, 4) and b["p_star"][:, 3].tolist() == [0, 0, 0, 0]  # [U, P]: task 3 unsolvable
    assert b["p_star"][3].tolist() == [1, 1, 1, 0]  # tier 6: every task a reference solves


def test_run_pass_episodes_synthetic_pads_and_counts():
    """A fake policy succeeds on task p iff budget >= p + 1 and on every other call: the grid, padding of the
    last batch (7 does not divide 2 x 3 x 4 = 24) and the estimator against math.comb."""
    calls = []

    def fake(idx, budgets, key):
        calls.append(len(idx))
        idx, budgets = np.asarray(idx), np.asarray(budgets)
        coin = np.arange(len(idx)) % 2 == 0
        status = np.where((budgets >= idx + 1) & coin, SUCCESS, FAILED)
        return pytypes.SimpleNamespace(status=status, turns_used=np.minimum(budgets, idx + 1))

    raw = host_stages.run_pass_episodes(fake, 3, [1, 3], 4, jax.random.key(0), batch_size=7)
    assert calls == [7] * 4 and raw["success"].shape == (2, 3, 4)
    assert not raw["success"][0, 1:].any() and raw["success"][1].any()
    grid = host_metrics.pass_grid(raw["success"], [1, 2, 4])
    for u in range(2):
        for j, k in enumerate([1, 2, 4]):
            assert grid[u, j].mean() == pytest.approx(comb_pass(raw["success"][u], k), abs=1e-6)


def test_run_pass_episodes_scripted_sql(tok, world):
    """The real SQL env with a scripted policy (gold answer on even held-out tasks, a wrong one on odd): pass@k is
    1 on even tasks and 0 on odd ones at every tier."""
    tasks = world.heldout_tasks
    rcfg = HostRolloutConfig(t_max=2, max_action_tokens=256, max_context=2048, workers=1)

    def rollout_fn(idx, budgets, key):
        ts = host_stages.tasks_from_indices(tasks, idx)
        acts = [f"<answer>{t.gold}</answer>" if i % 2 == 0 else "<answer>SELECT 42</answer>"
                for i, t in zip(np.asarray(idx), ts)]
        gen = lambda t, active, ctx: [acts[b] if active[b] else None for b in range(len(acts))]  # noqa: E731
        return host_rollout(None, None, world.env, tok, ts, budgets, key, rcfg, generate_fn=gen).rollout

    raw = host_stages.run_pass_episodes(rollout_fn, len(tasks), [1, 2], 2, jax.random.key(1), batch_size=8)
    want = np.asarray([i % 2 == 0 for i in range(len(tasks))])
    assert (raw["success"] == want[None, :, None]).all() and (raw["turns"] == 1).all()
    grid = host_metrics.pass_grid(raw["success"], [1, 2])
    np.testing.assert_allclose(grid, np.broadcast_to(want.astype(float), grid.shape))


def test_domain_metrics_synthetic_gaps_and_verdict():
    """Two GRPO seeds whose per-task gaps over base are known: the f1 estimate is their mean (t over seeds),
    the f2 difference is gap(tight) - gap(full), and a collapsed seed is excluded with a sensitivity line."""
    base = np.zeros((2, 1, 4))
    s0, s1 = base + 0.5, base + 0.3
    s0[0], s1[0] = 0.1, 0.1                      # tight tier: smaller gap
    per_task = {"base": base, "grpo/seed0": s0, "grpo/seed1": s1, "grpo/seed2": base}
    ok = health.SeedHealth(health.HEALTHY, "", 2, 1.0, 1.0, 0.5)
    bad = health.SeedHealth(health.COLLAPSED, "", 2, 0.0, 0.0, 0.0)
    hl = {("grpo", 0): ok, ("grpo", 1): ok, ("grpo", 2): bad}
    bound = host_metrics.structural_bound([1, 1, 1, 2], [1, 2], [1])
    m = host_metrics.domain_metrics("sql", per_task, bound, [1, 2], [1], hl, n_train=18, n_heldout=4)
    assert m["sql.f1_breadth.diff.mean"] == pytest.approx(0.4)
    assert m["sql.f1_breadth.diff.method"] == stats.T_SEEDS and m["sql.f1_breadth.diff.n_seeds"] == 2
    assert m["sql.f2_shrink.diff.mean"] == pytest.approx(0.1 - 0.4)
    assert m["sql.f1_breadth.diff.all.mean"] == pytest.approx(0.8 / 3)
    assert "excluded: 2" in m["sql.f1_breadth.diff.seeds"]
    assert m["sql.pass.grpo.t2.k1"] == pytest.approx(0.4) and m["sql.pass.grpo.seed2.t2.k1"] == 0.0
    assert m["sql.bound.t1"] == 0.75 and m["sql.bound.t2"] == 1.0 and m["sql.split.train"] == 18
    f1p, f1, f2, f7 = host_metrics.domain_findings("sql", "SQL")
    assert all(finding_verdict(f, m)[0] in stats.VERDICTS for f in (f1p, f1, f2))
    assert m["sql.f1_pass1.diff.mean"] == pytest.approx(0.4)  # K=1 is the only K here
    assert "sql.f7_gigpo.diff.mean" not in m  # no gigpo arm: finding 7 not measured


def test_domain_metrics_gigpo_vs_grpo_parity():
    """Finding 7: GiGPO - GRPO per task at the tightest tier, paired by seed index, over seeds included in both
    arms; equal arms within the 5-point margin are 'reproduced' (parity), a 30-point gap is 'not reproduced'."""
    base = np.zeros((2, 1, 8))
    rng = np.random.default_rng(0)
    grpo = {s: base + 0.4 + 0.01 * rng.normal(size=base.shape) for s in range(5)}
    ok = health.SeedHealth(health.HEALTHY, "", 2, 1.0, 1.0, 0.5)
    bound = host_metrics.structural_bound([1] * 8, [1, 2], [1])
    f7 = next(f for f in host_metrics.domain_findings("bfcl", "BFCL") if f.key == "bfcl.f7_gigpo")
    for shift, want in ((0.0, stats.REPRODUCED), (-0.3, stats.NOT_REPRODUCED)):
        per_task = {"base": base, **{f"grpo/seed{s}": g for s, g in grpo.items()},
                    **{f"gigpo/seed{s}": g + shift + 0.01 * rng.normal(size=g.shape) for s, g in grpo.items()}}
        hl = {(a, s): ok for a in ("grpo", "gigpo") for s in grpo}
        m = host_metrics.domain_metrics("bfcl", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=8)
        assert m["bfcl.f7_gigpo.diff.mean"] == pytest.approx(shift, abs=0.02)
        assert m["bfcl.f7_gigpo.diff.seeds"].startswith("grpo & gigpo seeds 0, 1, 2, 3, 4")
        assert m["bfcl.f7_gigpo.grpo"] == pytest.approx(0.4, abs=0.01) and m["bfcl.f7_gigpo.bound"] == 1.0
        assert finding_verdict(f7, m)[0] == want


# ----------------------------------------------------------------------------- finding 4: error correction
class _ToyToolEnv:
    """A host env stand-in: "bad" is a tool-call error, "fix" a well-formed call, "end" ends the episode."""

    def reset(self, seed, task):
        return [], "q"

    def clone(self, state):
        return list(state)

    def step(self, state, action):
        state = state + [action]
        info = {"valid": action != "bad", "tool_error": action == "bad", "n_calls": int(action in ("bad", "fix"))}
        return state, "o", 0.0, action == "end", info


def _ep(actions, failure=None):
    return {"actions": actions, "tool_error": [a == "bad" for a in actions],
            "failure": failure or [False] * len(actions), "done": [a == "end" for a in actions], "seed": 0}


def test_error_prefixes_from_logs_of_both_policies_and_judged():
    """Prefixes come from the full-budget tier of both policies' logs (tier-major [U, P, Z]), stop before an
    episode-ending or failing error and leave room for one reply; each is judged per policy's continuation."""
    tasks = ["t0", "t1"]
    filler = _ep(["bad"])  # tier 0 (not the full budget): ignored
    base = {"status": np.zeros((2, 2, 1)), "episodes": [filler, filler, _ep(["bad", "fix"]), _ep(["fix", "end"])]}
    rl = {"status": np.zeros((2, 2, 1)),
          "episodes": [filler, filler, _ep(["bad", "bad", "bad"]), _ep(["bad", "x"], failure=[True, False])]}
    pre = host_error_recovery.prefixes_from_log({"base": base, "grpo/seed0": rl}, ["base", "grpo/seed0"], tasks, 3)
    assert [(p.source, p.task, p.actions) for p in pre] == [
        ("base", "t0", ("bad",)), ("grpo/seed0", "t0", ("bad",)), ("grpo/seed0", "t0", ("bad", "bad"))]
    j = host_error_recovery.judge(_ToyToolEnv(), pre, ["fix", "bad", "fix"], ["fix", "fix", "end"])
    assert j["base"] == [True, False, True] and j["rl"] == [True, True, False]
    assert j["source"] == ["base", "grpo/seed0", "grpo/seed0"] and j["step"] == [0, 0, 1]
    with pytest.raises(ValueError, match="episodes"):
        host_error_recovery.prefixes_from_log({"base": {"status": np.zeros((1, 1, 1))}}, ["base"], tasks, 3)


def test_error_recovery_metrics_known_rates_and_report():
    """Five GRPO seeds, 10 prefixes each: base corrects 3, RL 5 (seed 4: 6, collapsed and excluded): the
    estimate is 0.2 with pooled rates 30% / 50%, the all-seeds sensitivity 0.22; no prefixes: a stated line."""
    ok = health.SeedHealth(health.HEALTHY, "", 2, 1.0, 1.0, 0.5)
    bad = health.SeedHealth(health.COLLAPSED, "", 2, 0.0, 0.0, 0.0)
    judged = {s: {"base": [True] * 3 + [False] * 7, "rl": [True] * (6 if s == 4 else 5) + [False] * (4 if s == 4 else 5),
                  "source": ["base"] * 4 + [f"grpo/seed{s}"] * 6} for s in range(5)}
    per_task = {"base": np.zeros((2, 1, 4)), **{f"grpo/seed{s}": np.zeros((2, 1, 4)) for s in range(5)}}
    hl = {("grpo", s): (bad if s == 4 else ok) for s in range(5)}
    bound = host_metrics.structural_bound([1] * 4, [1, 2], [1])
    m = host_metrics.domain_metrics("bfcl", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=4,
                                 error_prefixes=judged)
    assert m["bfcl.f4_correction.diff.mean"] == pytest.approx(0.2)
    assert m["bfcl.f4_correction.diff.all.mean"] == pytest.approx(0.22)
    assert m["bfcl.f4_correction.base"] == pytest.approx(0.3) and m["bfcl.f4_correction.rl"] == pytest.approx(0.5)
    assert m["bfcl.f4_correction.n_prefixes"] == 50 and m["bfcl.f4_correction.seed1.n_from_base"] == 4
    assert "excluded: 4" in m["bfcl.f4_correction.diff.seeds"]
    f4 = next(f for f in host_metrics.domain_findings("bfcl", "BFCL") if f.key == "bfcl.f4_correction")
    assert f4.direction == 1 and f4.effect == pytest.approx(0.142)
    assert finding_verdict(f4, m)[0] in stats.VERDICTS
    assert all(f.key != "sql.f4_correction" for f in host_metrics.domain_findings("sql", "SQL"))
    findings = host_metrics.domain_findings("bfcl", "BFCL")
    text = "\n".join(host_report.domain_section("bfcl", "BFCL", m, findings, policies=["base", "grpo"], tiers=[1, 2],
                                               ks=[1], t_max=2, splits=("train", "test"))[0])
    assert re.search(r"\| BFCL: 4\. tool-call error correction .*\| 20\.0 \|", text)
    none = host_metrics.domain_metrics("bfcl", per_task, bound, [1, 2], [1], hl, n_train=8, n_heldout=4,
                                    error_prefixes={s: {"base": [], "rl": [], "source": []} for s in range(5)})
    assert none["bfcl.f4_correction.n_prefixes"] == 0 and "bfcl.f4_correction.diff.mean" not in none
    text = "\n".join(host_report.domain_section("bfcl", "BFCL", none, findings, policies=["base", "grpo"],
                                               tiers=[1, 2], ks=[1], t_max=2, splits=("train", "test"))[0])
    assert host_error_recovery.NO_PREFIX_NOTE in text


# ----------------------------------------------------------------------------- the ci-sql miniature
@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    """`experiments.reproduce --preset ci-sql` in a subprocess, every jitted call recorded (tests/aot_coverage.py)."""
    return aot_coverage.record_reproduce("ci-sql", str(tmp_path_factory.mktemp("runs")))


@pytest.mark.slow
def test_every_program_the_ci_sql_run_calls_is_in_the_aot_list(ci_run):
    """Each jitted call of the ci-sql run (recorded around `jax.jit`) is a call of the preset's AOT list built on one
    CPU device (`aot.host.host_programs` with the run's tiny model) or an `aot.coverage.HELPERS` function: the
    appends at every width the run used (the widest program's family), the compacted decodes, the packed train
    step at each policy-index length it met."""
    preset = HOST_PRESETS["ci-sql"]
    progs = aot_host.host_programs(preset, preset.tiny_model, aot_coverage.one_device_mesh(),
                                   aot_coverage.arm_settings(host_run.host_arm_settings, preset))
    counts = aot_coverage.assert_covered(aot_coverage.recorded(ci_run), progs)
    assert {n for n, c in counts.items() if c} == {"init_params", "train_state_init", "params_finite",
                                                   "host_train_step", "host_append", "host_decode",
                                                   "host_append_eval", "host_decode_eval"}


@pytest.mark.slow
def test_ci_sql_logs_an_eta_over_its_stages(ci_run):
    """The host study logs the same ETA line as FrozenLake's (experiments.progress.host_stages), ending with every
    stage counted as done."""
    p = HOST_PRESETS["ci-sql"]
    log = open(os.path.join(os.path.dirname(ci_run), "reproduce.log")).read()
    lines = [line for line in log.splitlines() if line.startswith("[study]")]
    rl = len(p.arms) * len(p.seeds) * p.iterations
    policies = 1 + len(p.seeds) * (1 + len(p.arms))
    assert lines and lines[-1] == (f"[study] base 0 of 0 steps, RL {rl} of {rl} iterations, eval {policies} of "
                                   f"{policies} policies; every stage done"), lines


@pytest.mark.slow
def test_ci_sql_files_and_report(ci_run, tok):
    p = HOST_PRESETS["ci-sql"]
    for part in ["config.json", "tiny_checkpoint/config.json", "tiny_checkpoint/tokenizer.json", "base/DONE",
                 "eval/base.json", "eval/bound.json", "metrics.json", "report.md", "timing.json"] + [
                 f"arms/{a}/seed{s}/{f}" for a in p.arms for s in p.seeds
                 for f in ("DONE", "metrics.jsonl", "policy/model.safetensors")] + [
                 f"eval/{a}_seed{s}.json" for a in p.arms for s in p.seeds] + [
                 f"eval/base_seed{s}.json" for s in p.seeds]:
        assert os.path.exists(os.path.join(ci_run, part)), part
    # each seed's policies and the base's draw for that seed share a sampling key; the seeds' keys differ
    key_seed = {f: json.load(open(os.path.join(ci_run, "eval", f)))["key_seed"]
                for f in os.listdir(os.path.join(ci_run, "eval")) if f.endswith(".json") and "_seed" in f
                and not f.startswith(("likelihood", "step_quality", "error"))}
    assert key_seed == {f"{a}_seed{s}.json": s for a in ("base", *p.arms) for s in p.seeds}, key_seed
    assert json.load(open(os.path.join(ci_run, "eval", "base.json")))["key_seed"] is None
    for a in p.arms:
        for s in p.seeds:
            recs = health.read_log(os.path.join(ci_run, "arms", a, f"seed{s}", "metrics.jsonl"))
            assert [r["iteration"] for r in recs] == list(range(p.iterations))
            assert all(math.isfinite(r["loss"]) and r["tokens"] > 0 for r in recs)
    cfg = json.load(open(os.path.join(ci_run, "tiny_checkpoint", "config.json")))
    assert cfg["vocab_size"] >= tok.vocab_size
    text = open(os.path.join(ci_run, "report.md")).read()
    assert "## SQL" in text and "not measured" not in text.lower()
    assert "4 train (split 'train'), 5 held-out (split 'test')" in text
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \| \d+% \| \d+ \|", line)]
    assert len(rows) == 2 * len(p.eval.ks)
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert all(re.fullmatch(r"\d+\.\d", c) for c in cells[3:]), line  # every policy and the bound measured
    for n in ("1", "2", "7"):
        assert re.search(rf"\| SQL: {n}\. .*\| ({'|'.join(map(re.escape, stats.VERDICTS))}) \|", text)


@pytest.mark.slow
def test_ci_sql_pass_recomputes_from_raw_logs(ci_run):
    p = HOST_PRESETS["ci-sql"]
    metrics = json.load(open(os.path.join(ci_run, "metrics.json")))
    text = open(os.path.join(ci_run, "report.md")).read()
    labels = ["base"] + [f"{a}/seed{s}" for a in p.arms for s in p.seeds]
    for label in labels:
        ev = json.load(open(os.path.join(ci_run, "eval", label.replace("/", "_") + ".json")))
        succ = np.asarray(ev["success"], bool)
        assert succ.shape == (len(ev["tiers"]), 5, p.eval.n_samples)
        assert (succ == (np.asarray(ev["status"]) == SUCCESS)).all()
        assert (np.asarray(ev["turns"]) <= np.asarray(ev["tiers"])[:, None, None]).all()
        key = "base" if label == "base" else label.replace("/", ".")
        for u, t in enumerate(ev["tiers"]):
            for k in p.eval.ks:
                assert metrics[f"sql.pass.{key}.t{t}.k{k}"] == pytest.approx(comb_pass(succ[u], k), abs=1e-6)
    # the report's table cells are the arm means over the seeds
    for u, t in enumerate(json.load(open(os.path.join(ci_run, "eval", "bound.json")))["tiers"]):
        for k in p.eval.ks:
            line = next(x for x in text.splitlines() if x.startswith(f"| {t} | ") and f"| {k} | " in x)
            cells = [c.strip() for c in line.strip("|").split("|")]
            want = [metrics[f"sql.pass.{a}.t{t}.k{k}"] for a in ["base", *p.arms]]
            assert cells[3:-1] == [format(100 * v, ".1f") for v in want]


@pytest.mark.slow
def test_ci_sql_bound_matches_upper_bound_turns(ci_run):
    env = host.make("sql")
    held = env.tasks("test")[:HOST_PRESETS["ci-sql"].task.max_heldout_tasks]  # the miniature's held-out tasks
    b = json.load(open(os.path.join(ci_run, "eval", "bound.json")))
    assert b["task_ids"] == [t.id for t in held]
    want = [env.upper_bound_turns(t) for t in held]
    assert b["min_turns"] == want
    metrics = json.load(open(os.path.join(ci_run, "metrics.json")))
    for t in b["tiers"]:
        assert metrics[f"sql.bound.t{t}"] == pytest.approx(np.mean([w <= t for w in want]))


# ----------------------------------------------------------------------------- checkpoints and resume (ci-sql)
class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def resumed(ci_run, tmp_path_factory):
    """ci-sql's grpo/seed0 (2 iterations) again in a new run directory: stopped after iteration 1's metrics line
    was written but before its checkpoint (iteration 0's on disk), refused with other settings, then rerun to the
    end with the same runtime (one train-step compile)."""
    run = host_run.HostRun(dataclasses.replace(HOST_PRESETS["ci-sql"], arms=("grpo",), seeds=(0,)),
                             str(tmp_path_factory.mktemp("resume")))
    base = host_run.run_base(run)
    out = os.path.join(run.dir, "arms", "grpo", "seed0")
    real_save, seen, logs, runtimes = ckpt_lib.save, {}, [], {}

    def save(manager, state, *args, step=None, **kw):
        if step == 1:
            seen["metrics"] = [r["iteration"] for r in health.read_log(os.path.join(out, "metrics.jsonl"))]
            seen["ckpt"] = ckpt_lib.all_steps(os.path.join(out, "ckpt"))
            raise Interrupted
        return real_save(manager, state, *args, step=step, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ckpt_lib, "save", save)
        with pytest.raises(Interrupted):
            host_run.run_arms(run, base, log=logs.append, runtimes=runtimes)
    recorded = host_run.arm_stage_settings(run, "grpo", 0)
    with pytest.raises(run_dir.SettingsMismatch, match=r"stage grpo/seed0: the checkpoint \S*ckpt/0 was saved with "
                                                       r"other settings \(1 differ.*\): task\.t_max: 2 vs 3"):
        host_run.resume_arm(run, "grpo/seed0", out, {**recorded, "task": {**recorded["task"], "t_max": 3}},
                              None, 0, base)
    params = host_run.run_arms(run, base, log=logs.append, runtimes=runtimes)[("grpo", 0)]
    return dict(run=run, out=out, seen=seen, logs=logs, params=params, recorded=recorded,
                ref=os.path.join(ci_run, "arms", "grpo", "seed0"))


def _records(path):
    """A metrics log's records without the host timing numbers (wall seconds differ between runs)."""
    return [{k: v for k, v in r.items() if not k.startswith("host_")} for r in health.read_log(path)]


@pytest.mark.slow
def test_interrupted_arm_resumes_to_the_uninterrupted_result(resumed):
    """The resumed arm ends with the uninterrupted miniature's params and metrics lines (iteration 1's line, written
    before the interruption, cut and written again), and the checkpoints of both iterations."""
    out = resumed["out"]
    assert resumed["seen"] == {"metrics": [0, 1], "ckpt": [0]}
    assert any("resuming at iteration 1" in str(m) for m in resumed["logs"])
    ref_params = weights.load(os.path.join(resumed["ref"], "policy"))[1]
    for a, b in zip(jax.tree.leaves(resumed["params"]), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    got, want = _records(os.path.join(out, "metrics.jsonl")), _records(os.path.join(resumed["ref"], "metrics.jsonl"))
    assert [r["iteration"] for r in got] == [0, 1] and got == want
    assert ckpt_lib.all_steps(os.path.join(out, "ckpt")) == [0, 1]
    assert not os.path.exists(os.path.join(out, "dynamics.jsonl"))  # finding 6 is the coding domain's


@pytest.mark.slow
def test_arm_checkpoints_and_done_record_the_settings(resumed):
    out, want = resumed["out"], resumed["recorded"]
    assert want["arm"]["iterations"] == 2 and want["seed"] == 0 and want["task"]["domain"] == "sql"
    assert run_dir.done_settings(out) == want
    meta = ckpt_lib.read_metadata(ckpt_lib.make_manager(os.path.join(out, "ckpt"), read_only=True))
    assert meta["extra"]["settings"] == want and meta["step"] == 1
    logs = []  # a rerun of the finished arm loads its policy and trains nothing
    again = host_run.run_arms(resumed["run"], None, log=logs.append)[("grpo", 0)]
    assert not logs
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(resumed["params"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
