"""BFCL multi-turn and multi-turn coding as study domains: the registry entries (env, splits, the structural bound
from the reference solutions), the task subsets, every host preset's sizes against its mesh, the arm settings
(KL estimator), the rollouts on a device mesh, the host numbers of a rollout, and the ci-code and ci-bfcl
miniatures end to end through `experiments.reproduce` (run directory files, the report's domain section, Pass@
recomputed from the raw eval logs, the bound against `upper_bound_turns`)."""
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

from experiments import reproduce
from jaxagent.study.host import run as host_run
from jaxagent.study.host.presets import HOST_PRESETS
from jaxagent import sharding
from jaxagent.envs.host import base as host
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.eval import health, stats
from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rollout import SUCCESS
from jaxagent.rollout.host_loop import HostTrace
from jaxagent.rollout.host_timing import HostTiming
from jaxagent.sampling import Sampler
from jaxagent.rl.loop import RLSettings
from jaxagent.study import stages
from jaxagent.study.common.run_checks import check_batches
from jaxagent.study.common import arms as arms_lib
from jaxagent.study.common.arms import arm_settings
from jaxagent.study.host import (dynamics as host_dynamics, error_recovery as host_error_recovery,
                                 metrics as host_metrics, domains as host_domains, stages as host_stages)
from tests.passk_reference import comb_pass
from tests.test_host_likelihood import check_ci_bfcl_finding5
from tests.test_host_step_quality import check_ci_code_finding3


def _has_bfcl():
    try:
        import bfcl_eval  # noqa: F401
        return True
    except ImportError:
        return False


needs_bfcl = pytest.mark.skipif(not _has_bfcl(), reason="needs bfcl-eval")


# ----------------------------------------------------------------------------- the domains
def test_code_domain_splits_and_bound(tok):
    d = host_domains.get_domain("code")
    assert (d.env, d.train_split, d.heldout_split) == ("code", "train", "test") and d.split_note and d.bound_note
    ts = host_stages.HostTaskSettings(domain="code", extra_heldout=("test_constants", "nope"),
                                      max_extra_heldout_tasks=50, task_subset="spread", max_action_tokens=512)
    w = host_stages.make_host_world(ts, tok)
    assert len(w.train_tasks) == 638 and len(w.heldout_tasks) == 222  # the built-in set (docs/host_study.md, Data)
    assert [t.id for t in w.heldout_tasks] == [t.id for t in w.env.tasks("test")]  # held out by structure
    assert not {t.template for t in w.train_tasks} & {t.template for t in w.heldout_tasks}
    assert list(w.extra_heldout) == ["test_constants"] and len(w.extra_heldout["test_constants"]) == 50
    assert w.missing_splits == ("nope",)  # an env without such a split: the report says it was not evaluated
    assert {t.template for t in w.extra_heldout["test_constants"]} <= {t.template for t in w.train_tasks}
    assert (w.min_turns(w.heldout_tasks) == 1).all()  # every reference fits 512-token replies
    # under code-toy's 128-token replies the long families' references fit no tier: the bound says so
    capped = host_stages.make_host_world(dataclasses.replace(ts, max_action_tokens=128), tok)
    turns = capped.min_turns(capped.heldout_tasks)
    long = {"edit-distance", "word-wrap", "components"}
    assert set(turns.tolist()) == {1, host_stages.NO_FIT}
    assert {t.template for t, n in zip(capped.heldout_tasks, turns) if n > 1} <= long | {"nth-prime"}
    assert 70 <= int((turns > 1).sum()) <= 80


@needs_bfcl
def test_bfcl_domain_splits_and_bound(tok):
    d = host_domains.get_domain("bfcl")
    assert d.env == "bfcl" and d.split_note and d.bound_note
    w = host_stages.make_host_world(host_stages.HostTaskSettings(domain="bfcl"), tok)
    assert (len(w.train_tasks), len(w.heldout_tasks)) == (595, 200)
    assert all(t.index % 4 == 3 for t in w.heldout_tasks) and all(t.index % 4 != 3 for t in w.train_tasks)
    cats = [t.category for t in w.heldout_tasks]
    assert {c: cats.count(c) for c in set(cats)} == {"base": 50, "long_context": 50, "miss_func": 50, "miss_param": 50}
    # the bound: per user turn 1 message with its ground-truth calls (if any) + 1 closing message
    env = w.env.env
    for t in w.heldout_tasks[:20]:
        assert w.min_turns([t])[0] == len(env.ground_truth_actions(t)) == sum(1 + bool(g) for g in t.ground_truth)
    b = w.min_turns(w.heldout_tasks)
    assert b.min() >= 2 and b.max() == 15


@needs_bfcl
def test_bfcl_first_domain_is_bfcl_cut_to_first_requests_with_bfcl_findings(tok):
    """The bfcl-toy preset's domain: BFCLEnv's tasks cut to their first request (those with a ground-truth call),
    tools as signatures; the same split; bound 2 turns; BFCL's env-specific findings (4, 5) apply to it."""
    d = host_domains.get_domain("bfcl-first")
    assert d.env == "bfcl" and dict(d.env_kwargs) == {"user_turns": 1, "tool_docs": "signatures"}
    w = host_stages.make_host_world(host_stages.HostTaskSettings(domain="bfcl-first"), tok)
    assert (len(w.train_tasks), len(w.heldout_tasks)) == (470, 155)
    assert all(t.index % 4 == 3 for t in w.heldout_tasks) and all(t.index % 4 != 3 for t in w.train_tasks)
    assert (w.min_turns(w.train_tasks + w.heldout_tasks) == 2).all()
    assert max(len(tok.encode(w.env.system_prompt(t))) for t in w.heldout_tasks) < 800  # BFCL's JSON: >= 2,031
    assert host_domains.uses_env("bfcl-first", ("bfcl",)) and not host_domains.uses_env("bfcl-first", ("code",))
    keys = {f.key for f in host_metrics.domain_findings("bfcl-first", d.title)}
    assert {"bfcl-first.f4_correction", "bfcl-first.f1_pass1", "bfcl-first.f7_gigpo"} <= keys
    assert any(k.startswith("bfcl-first.f5_") for k in keys) and not any(".f3_" in k or ".f6_" in k for k in keys)
    with pytest.raises(ValueError, match="unknown host domain"):
        host_domains.uses_env("bfcl-last", ("bfcl",))


@needs_bfcl
def test_bfcl_two_domain_keeps_two_requests_and_says_which_cut(tok):
    """The bfcl2-toy preset's domain: every task cut to its first two requests (multi-turn state kept), the same
    split; bound 3-4 turns; each env says which cut of BFCL it runs (the reports print it)."""
    d = host_domains.get_domain("bfcl-two")
    assert dict(d.env_kwargs) == {"user_turns": 2, "tool_docs": "signatures"}
    w = host_stages.make_host_world(host_stages.HostTaskSettings(domain="bfcl-two"), tok)
    assert (len(w.train_tasks), len(w.heldout_tasks)) == (599, 200)
    assert all(len(t.turns) == 2 for t in w.heldout_tasks)
    assert sum(len(t.turns) == 1 for t in w.train_tasks) == 6  # BFCL's own single-request tasks (base_46, ...)
    assert set(w.min_turns(w.heldout_tasks).tolist()) == {3, 4}
    assert "first 2 user requests" in w.env.cut_note and "multi-turn" in w.env.cut_note
    first = host_stages.make_host_world(host_stages.HostTaskSettings(domain="bfcl-first"), tok)
    assert "single-request tool calling, not BFCL's multi-turn" in first.env.cut_note
    p = HOST_PRESETS["bfcl2-toy"]
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    assert p.task.domain == "bfcl-two" and tiers == (4, 5)  # every reference fits the tight tier


def test_toy_presets_say_what_they_show_and_evaluate_both_splits():
    from jaxagent.study.host.presets import TOY_SCOPE

    for name, p in HOST_PRESETS.items():
        assert (p.scope_note == TOY_SCOPE) == name.endswith("-toy"), name
    assert "pipeline demonstration on a designed base" in TOY_SCOPE and "clean references" in TOY_SCOPE
    for name in ("sql-toy", "code-toy"):
        assert HOST_PRESETS[name].task.extra_heldout == ("test_constants",)
    assert HOST_PRESETS["code-toy"].sft.slip_fix == 0.5  # docs/host_study.md describes this expert


@needs_bfcl
def test_task_subsets_spread_and_prompt_filter(tok):
    tasks = list(range(10))
    assert host_stages.pick_tasks(tasks, 3) == [0, 1, 2]
    assert host_stages.pick_tasks(tasks, 4, "spread") == [0, 3, 6, 9]
    assert host_stages.pick_tasks(tasks, 1, "spread") == [0] and host_stages.pick_tasks(tasks, None, "spread") == tasks
    with pytest.raises(ValueError, match="task_subset"):
        host_stages.HostTaskSettings(task_subset="random")
    # "spread" reaches every BFCL category (the list is ordered by category); the prompt filter keeps short prompts
    ts = host_stages.HostTaskSettings(domain="bfcl", max_heldout_tasks=8, task_subset="spread", max_train_tasks=2,
                                      max_system_tokens=2200)
    w = host_stages.make_host_world(ts, tok)
    assert {t.category for t in w.heldout_tasks} == {"base", "long_context", "miss_func", "miss_param"}
    assert all(len(tok.encode(w.env.system_prompt(t))) <= 2200 for t in w.train_tasks + w.heldout_tasks)


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", sorted(HOST_PRESETS))
def test_preset_sizes(name):
    p = HOST_PRESETS[name]
    host_domains.get_domain(p.task.domain)
    data, fsdp, tensor = p.mesh
    check_batches(p, data * fsdp)  # the micro-batches split over the batch axes
    assert max(p.eval.ks) <= p.eval.n_samples
    # the exact KL projects the reference onto the whole vocabulary at every token: only over a pruned one
    assert p.kl_estimator == "k2" or (p.kl_estimator == "exact" and p.pruned_vocabulary)
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    assert tiers[-1] == p.task.t_max and len(set(tiers)) == len(tiers)
    if p.tiny_model is None:
        assert p.aot_model and p.aot_topology and p.compute_dtype == "bfloat16" and p.remat == "full"
        assert p.task.max_context >= p.task.max_action_tokens * 4
    else:
        assert p.checkpoint is None and p.tiny_model.vocab_size == 151936
    if p.task.domain == "code":
        assert p.task.overlap_groups > 1  # the sandboxed test runs overlap the other group's decoding
    if p.task.domain == "bfcl" and p.tiny_model is None:
        assert p.task.t_max >= 15 and p.task.max_context >= 12288  # the longest reference; 4,878-token prompts


def test_every_domain_has_every_scale():
    for d in ("bfcl", "sql", "code"):
        for scale in ("ci-{}", "qwen3-0.6b-1gpu-{}", "qwen3-8b-v5p-{}"):
            assert HOST_PRESETS[scale.format(d)].task.domain == d
    for d, domain in (("sql", "sql"), ("code", "code"), ("bfcl", "bfcl-first")):
        assert HOST_PRESETS[f"{d}-toy"].task.domain == domain
    pod = HOST_PRESETS["qwen3-8b-v5p-bfcl"]
    assert pod.mesh == (4, 8, 2) and pod.aot_model == "qwen3_8b" and pod.aot_topology == "v5p:4x4x4"


def test_check_batches_refuses_undividable():
    p = HOST_PRESETS["qwen3-8b-v5p-sql"]
    check_batches(p, 32)
    with pytest.raises(ValueError, match="micro_batches"):
        check_batches(p, 64)


def test_arm_settings_match_the_frozenlake_study():
    p = HOST_PRESETS["qwen3-0.6b-1gpu-bfcl"]
    for arm in p.arms:
        got = host_run.host_arm_settings(p, arm)
        assert got.kl_estimator == "k2" and got.temperature == p.temperature and got.rl.n_tasks == p.n_tasks
        assert got == arm_settings(p, arm)  # the shared code (temperature 1.0 is the default)
    hot = dataclasses.replace(p, temperature=0.7)
    assert host_run.host_arm_settings(hot, "gigpo").temperature == 0.7
    assert dataclasses.replace(host_run.host_arm_settings(hot, "gigpo"), temperature=1.0) == arm_settings(p, "gigpo")


# ----------------------------------------------------------------------------- mesh and host numbers
def test_rollout_fn_on_a_mesh_places_params(tok, monkeypatch):
    """With a mesh the host rollout samples from the ROLLOUT_RULES copy of the params, in the compute dtype, under
    the mesh context; the trace goes to on_trace."""
    mesh = sharding.make_mesh(1, 2, 2, devices=jax.devices()[:4])
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    seen, traces = {}, []

    def fake(params, cfg, env, tokenizer, tasks, budgets, key, rcfg, **kw):
        seen.update(params=params, mesh=jax.sharding.get_abstract_mesh(), rcfg=rcfg, kw=kw)
        return pytypes.SimpleNamespace(rollout="ro", trace="trace")

    monkeypatch.setattr(host_stages, "host_rollout", fake)
    ts = host_stages.HostTaskSettings(domain="code", overlap_groups=2, step_timeout_s=7.0)
    w = host_stages.make_host_world(ts, tok)
    fn = host_stages.make_host_rollout_fn(w, cfg, ts, w.train_tasks, compute_dtype="bfloat16", mesh=mesh,
                                          on_trace=traces.append)
    assert fn(params, jnp.asarray([0, 1], jnp.int32), jnp.asarray([2, 2]), jax.random.key(0)) == "ro"
    assert traces == ["trace"] and not seen["mesh"].empty and seen["mesh"].shape == mesh.shape
    assert (seen["rcfg"].overlap_groups, seen["rcfg"].step_timeout_s) == (2, 7.0) and not seen["kw"]
    want = sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh, sharding.ROLLOUT_RULES)
    for leaf, sh in zip(jax.tree.leaves(seen["params"]), jax.tree.leaves(want)):
        assert leaf.dtype == jnp.bfloat16 and leaf.sharding.is_equivalent_to(sh, leaf.ndim)


def test_arm_runtime_passes_the_kl_estimator(tok, monkeypatch):
    seen = {}
    monkeypatch.setattr(arms_lib, "build_train_step", lambda cfg, opt, ls, memory, mesh, **kw: seen.update(
        ls=ls, memory=memory, mesh=mesh))
    w = host_stages.make_host_world(host_stages.HostTaskSettings(domain="code"), tok)
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], kl_coef=0.05, kl_estimator="k2")
    rt = host_stages.make_host_arm_runtime(w, None, host_stages.HostTaskSettings(domain="code"), arm)
    assert (seen["ls"].kl_coef, seen["ls"].kl_estimator) == (0.05, "k2") and rt.with_ref_params
    assert seen["mesh"] is None and rt.mesh is None and seen["memory"] == MemoryPlan()


def test_host_arms_are_the_estimators_without_a_critic_or_oracle(tok, monkeypatch):
    """The host study runs every estimator that needs neither a critic nor the env's exact step values
    (`rl.loop.CRITIC_ESTIMATORS`, `ORACLE_ESTIMATORS`): an outcome estimator needs no host-side list."""
    assert host_stages.HOST_ARMS == ("grpo", "budgetmix", "gigpo")
    monkeypatch.setattr(arms_lib, "build_train_step", lambda *a, **kw: None)
    ts = host_stages.HostTaskSettings(domain="code")
    w = host_stages.make_host_world(ts, tok)
    for estimator in ("rloo", "dr_grpo", "gigpo"):
        arm = stages.ArmSettings(name=estimator, rl=RLSettings(estimator=estimator))
        assert host_stages.make_host_arm_runtime(w, None, ts, arm).critic_optimizer is None
    for name in ("ppo", "grpo_oracle"):
        with pytest.raises(ValueError, match=f"{name!r} needs .* \\(a critic or an exact step oracle\\)"):
            host_stages.make_host_arm_runtime(w, None, ts, stages.ArmSettings(name=name, rl=stages.ARMS[name]))


def test_arm_runtime_trains_on_a_mesh(tok):
    """The sharded train step of a host arm: state on the runtime's shardings, batch rows over the batch axes, one
    update that moves the params and keeps their sharding."""
    mesh = sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    ts = host_stages.HostTaskSettings(domain="code", max_context=32)
    w = host_stages.make_host_world(ts, tok)
    rl = dataclasses.replace(stages.ARMS["grpo"], n_tasks=1, group_size=2)
    arm = stages.ArmSettings(name="grpo", rl=rl, lr=1e-2, kl_coef=0.1, kl_estimator="k2")
    rt = host_stages.make_host_arm_runtime(w, cfg, ts, arm, mesh=mesh)
    assert rt.mesh is mesh and rt.state_shardings is not None
    state = stages.init_arm_state(rt, cfg, jax.random.key(0), qwen3.init(cfg, jax.random.key(1)))
    tokens = jax.random.randint(jax.random.key(2), (2, 32), 0, 128, jnp.int32)
    batch = {"tokens": tokens, "policy_mask": jnp.ones((2, 32), bool).at[:, :8].set(False),
             "advantages": jnp.asarray([[1.0], [-1.0]]) * jnp.ones((2, 32)), "old_logprobs": jnp.full((2, 32), -5.0)}
    before = jax.tree.map(np.asarray, state.params)
    state, m = rt.train_step(state, batch)
    assert math.isfinite(float(m["loss"])) and float(m["skipped"]) == 0 and float(m["tokens"]) == 48
    moved = [not np.allclose(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params))]
    assert any(moved)
    for leaf, sh in zip(jax.tree.leaves(state.params), jax.tree.leaves(rt.state_shardings.params)):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)


def test_trace_metrics_counts_errors_and_timeouts():
    timing = HostTiming(np.asarray([1.0, 2.0]), np.asarray([3.0, 1.0]), np.asarray([2.5, 0.5]), np.zeros(2),
                        n_groups=2, reset_s=0.5, total_s=7.0)
    trace = HostTrace(tasks=[0, 1, 2], seeds=[0, 0, 0], actions=[], observations=[], infos=[], dones=[],
                      final_states=[], errors=[None, "step: EnvTimeout: turn 1 after 60 s", "step: ValueError: x"],
                      timing=timing)
    m = host_stages.trace_metrics(trace)
    assert (m["host_env_errors"], m["host_env_timeouts"], m["host_n_groups"]) == (2, 1, 2)
    assert (m["host_model_s"], m["host_env_s"], m["host_env_wait_s"], m["host_hidden_env_s"]) == (3.0, 4.0, 3.0, 1.0)


# ----------------------------------------------------------------------------- the miniatures
def _check_miniature(run_dir: str, name: str, title: str, n_train: int, n_heldout: int):
    """Run-directory files, per-iteration metrics (with the host numbers), the report's domain section and table,
    Pass@ from the raw eval logs, and the bound from the env's `upper_bound_turns`."""
    p = HOST_PRESETS[name]
    d = p.task.domain
    labels = ["base"] + [f"{a}/seed{s}" for a in p.arms for s in p.seeds]
    for part in ["config.json", "tiny_checkpoint/config.json", "tiny_checkpoint/tokenizer.json", "base/DONE",
                 "eval/bound.json", "metrics.json", "report.md", "timing.json"] + [
                 f"arms/{a}/seed{s}/{f}" for a in p.arms for s in p.seeds
                 for f in ("DONE", "metrics.jsonl", "policy/model.safetensors")] + [
                 f"eval/{label.replace('/', '_')}.json" for label in labels]:
        assert os.path.exists(os.path.join(run_dir, part)), part
    for a in p.arms:
        for s in p.seeds:
            recs = health.read_log(os.path.join(run_dir, "arms", a, f"seed{s}", "metrics.jsonl"))
            assert [r["iteration"] for r in recs] == list(range(p.iterations))
            for r in recs:
                assert math.isfinite(r["loss"]) and r["tokens"] > 0
                assert r["host_n_groups"] == min(p.task.overlap_groups, p.n_tasks * p.group_size)
                assert r["host_model_s"] > 0 and r["host_env_s"] >= 0 and r["host_env_errors"] == 0
    text = open(os.path.join(run_dir, "report.md")).read()
    assert f"## {title}" in text and "not measured" not in text.lower() and f"- domain: {d} ({title}" in text
    assert f"{n_train} train (split 'train'), {n_heldout} held-out (split 'test')" in text
    dom = host_domains.get_domain(d)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    split_note = metrics.get(f"{d}.split.heldout_note", dom.split_note)  # the env's own note names its split rule
    assert split_note and f"held-out (split 'test') ({split_note})" in text and dom.bound_note in text
    tiers = budgets_lib.budget_tiers(p.task.t_max, p.eval.fractions)
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \| \d+% \| \d+ \|", line)]
    assert len(rows) == len(tiers) * len(p.eval.ks)
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 3 + 1 + len(p.arms) + 1 and all(re.fullmatch(r"\d+\.\d", c) for c in cells[3:]), line
    for n in ("1", "2"):
        assert re.search(rf"\| {re.escape(title)}: {n}\. .*\| ({'|'.join(map(re.escape, stats.VERDICTS))}) \|", text)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert (metrics[f"{d}.split.train"], metrics[f"{d}.split.heldout"]) == (n_train, n_heldout)
    for label in labels:
        ev = json.load(open(os.path.join(run_dir, "eval", label.replace("/", "_") + ".json")))
        succ = np.asarray(ev["success"], bool)
        assert ev["tiers"] == list(tiers) and succ.shape == (len(tiers), n_heldout, p.eval.n_samples)
        assert (succ == (np.asarray(ev["status"]) == SUCCESS)).all()
        assert (np.asarray(ev["turns"]) <= np.asarray(ev["tiers"])[:, None, None]).all()
        key = "base" if label == "base" else label.replace("/", ".")
        for u, t in enumerate(tiers):
            for k in p.eval.ks:
                assert metrics[f"{d}.pass.{key}.t{t}.k{k}"] == pytest.approx(comb_pass(succ[u], k), abs=1e-6)
    b = json.load(open(os.path.join(run_dir, "eval", "bound.json")))
    env = host.make(dom.env)
    held = {t.id: t for t in env.tasks("test")}
    assert len(b["task_ids"]) == n_heldout and set(b["task_ids"]) <= set(held)
    want = [env.upper_bound_turns(held[i]) for i in b["task_ids"]]
    assert b["min_turns"] == want
    for t in tiers:
        assert metrics[f"{d}.bound.t{t}"] == pytest.approx(np.mean([x <= t for x in want]))
    return metrics, text


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("runs"))


@pytest.mark.slow
def test_ci_code_end_to_end(runs_root):
    reproduce.main(["--preset", "ci-code", "--root", runs_root])
    metrics, text = _check_miniature(os.path.join(runs_root, "ci-code"), "ci-code", "Multi-turn coding", 2, 2)
    assert all(metrics[f"code.bound.t{t}"] == 1.0 for t in (1, 2))  # one submission solves every task
    # finding 6: R_single at the base and the (last) iteration, in the report; R_multi's change needs 2 iterations,
    # the miniature trains 1: the report says so in place of an estimate
    dyn = health.read_log(os.path.join(runs_root, "ci-code", "arms", "grpo", "seed0", "dynamics.jsonl"))
    assert [r["step"] for r in dyn] == [-1, 0] and all(len(r["r_single_tasks"]) == 2 for r in dyn)
    assert metrics["code.f6.last_step"] == 0 and metrics["code.f6.first_step_r_single"] == -1
    key = "code.f6_r_single.diff"  # the estimate over the included seeds, else its all-seeds sensitivity line
    assert math.isfinite(metrics.get(f"{key}.all.mean", metrics[f"{key}.mean"]))
    assert all(0.0 <= metrics[f"code.f6_r_single.{end}"] <= 1.0 for end in ("first", "last"))
    assert not any(k.startswith("code.f6_r_multi.diff") for k in metrics)
    assert metrics["code.note.f6_r_multi"] == host_dynamics.ONE_ITERATION_NOTE
    assert host_dynamics.ONE_ITERATION_NOTE in text
    verdicts = "|".join(map(re.escape, stats.VERDICTS))
    assert re.search(rf"\| Multi-turn coding: 6\. single-turn reward R_single .*\| ({verdicts}) \| [^|]* \| grpo "
                     "seeds ", text)
    assert len(re.findall(r"\| last iteration \(mean over seeds\) \| \d\.\d{3} \|", text)) == 1
    check_ci_code_finding3(runs_root)


@pytest.mark.slow
@needs_bfcl
def test_ci_bfcl_end_to_end(runs_root, tok):
    reproduce.main(["--preset", "ci-bfcl", "--root", runs_root])
    run_dir = os.path.join(runs_root, "ci-bfcl")
    _, text = _check_miniature(run_dir, "ci-bfcl", "BFCL multi-turn", 1, 2)
    verdicts = "|".join(map(re.escape, stats.VERDICTS))
    # finding 7 is judged, or has no estimate because every GiGPO training episode took one turn (its row of
    # longer episodes then reads 0)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    if metrics["bfcl.f7_gigpo.multi_turn_share"] == 0.0:
        assert "GiGPO trained as GRPO by construction" in text and "bfcl.f7_gigpo.diff.mean" not in metrics
    else:
        assert re.search(rf"\| BFCL multi-turn: 7\. GiGPO vs GRPO .*\| ({verdicts}) \| [^|]* \| grpo & gigpo seeds ",
                         text)
    # the short-prompt subset: every held-out task's first turn fits the miniature's context
    env = host.make("bfcl")
    ids = json.load(open(os.path.join(run_dir, "eval", "bound.json")))["task_ids"]
    assert all(len(tok.encode(env.system_prompt(env.task(i)))) <= 2200 for i in ids)
    base = json.load(open(os.path.join(run_dir, "eval", "base.json")))
    assert (np.asarray(base["turns"]) >= 1).all()  # no episode ended for lack of context before its first reply
    # finding 4: the logs keep every episode's replies; the report shows the finding or says no prefix was found
    assert len(base["episodes"]) == np.asarray(base["turns"]).size
    assert [len(e["actions"]) for e in base["episodes"]] == np.asarray(base["turns"]).ravel().tolist()
    f4 = json.load(open(os.path.join(run_dir, "eval", "f4_grpo_seed0.json")))
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["bfcl.f4_correction.n_prefixes"] == len(f4["base"]) == len(f4["rl"])
    if metrics["bfcl.f4_correction.n_prefixes"]:
        assert re.search(rf"\| BFCL multi-turn: 4\. tool-call error correction .*\| ({verdicts}) \| [^|]* \| grpo seeds ", text)
    else:
        assert host_error_recovery.NO_PREFIX_NOTE in text
    # the continuation path on a forced tool-call error (the tiny model seldom makes one): one reply per prefix
    run = host_run.HostRun(HOST_PRESETS["ci-bfcl"], runs_root)
    bad = '<tool_call>\n{"name": "no_such_function", "arguments": {}}\n</tool_call>'
    ep = {"actions": [bad], "tool_error": [True], "failure": [False], "done": [False], "seed": 0}
    log = {"status": np.zeros((1, 2, 1)), "episodes": [ep, ep]}
    pre = host_error_recovery.prefixes_from_log({"base": log}, ["base"], run.world.heldout_tasks, run.preset.task.t_max)
    assert len(pre) == 2 and pre[0].actions == (bad,)
    params = weights.load(run.checkpoint)[1]
    acts = host_error_recovery.continue_prefixes(params, run.cfg, run.world, run.preset.task, pre[:1],
                                                 jax.random.key(0), 2, sampler=Sampler(temperature=1.0))
    assert len(acts) == 1 and isinstance(acts[0], str) and acts[0] != bad
    j = host_error_recovery.judge(run.world.env, pre, [acts[0], bad], [bad, bad])
    assert j["rl"] == [False, False] and len(j["base"]) == 2
    check_ci_bfcl_finding5(runs_root)
