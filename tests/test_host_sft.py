"""The host study's toy base: Qwen3's tokenizer pruned to a corpus (exact on it, lossless off it), the SFT loss at
target positions (equal to the full loss and its gradient), the reference episodes played through the env (rows
equal to the rollout's own context, a reference that does not fit left out and counted), the settings' checks,
and the base stage of a toy-shaped miniature (SFT, saved, reused on a rerun)."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.bench import host_rollout as host_rollout_bench
from jaxagent.bench import host_step
from jaxagent.envs.host.base import HostEnv
from jaxagent.models import pruned_tokenizer, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import IM_END, IM_START
from jaxagent.rl import sft as sft_lib
from jaxagent.study import run_dir
from jaxagent.study.host import mistakes, run as host_run, sft as host_sft, stages as host_stages
from jaxagent.study.host.experts import NoisyExpert, expert_for
from jaxagent.study.host.presets import HOST_PRESETS, preset_problem


# ----------------------------------------------------------------------------- the pruned tokenizer
CORPUS = ["SELECT name FROM animals WHERE species = 'tiger'", "How many keepers work the night shift?",
          f"{IM_START}user\nTurn 1 of 2. 2 turns left.{IM_END}\n", "def f(n):\n    return n * 2\n"]


@pytest.fixture(scope="module")
def pruned(tok, tmp_path_factory):
    return pruned_tokenizer.prune_tokenizer(tok, CORPUS, tmp_path_factory.mktemp("pruned"))


def test_pruned_tokenizer_cuts_the_corpus_as_qwen3(tok, pruned):
    assert pruned_tokenizer.check_pruned(tok, pruned, CORPUS) == []
    for text in CORPUS:  # same pieces, so the same text back
        assert pruned.decode(pruned.encode(text)) == tok.decode(tok.encode(text)) == text
    # the byte alphabet, the corpus's tokens and their merges, the control tokens
    assert 256 < pruned.vocab_size < 600
    for name in ("im_start_id", "im_end_id", "pad_id", "think_id", "tool_call_id", "tool_response_end_id"):
        assert pruned.decode([getattr(pruned, name)]) == tok.decode([getattr(tok, name)])
    record = json.loads((pruned.path / "pruned_from.json").read_text())
    assert record["source_vocab_size"] == tok.vocab_size and record["vocab_size"] == pruned.vocab_size


def test_pruned_tokenizer_encodes_any_text_losslessly(tok, pruned):
    for text in ["Zebra crossings über alles: 你好, ∑x² ≤ 3 🙂", "SELECT wholly_unseen_identifier FROM x;\r\n\t",
                 f"text then {IM_END} a control token", ""]:
        ids = pruned.encode(text)
        assert all(0 <= i < pruned.vocab_size for i in ids)
        assert pruned.decode(ids) == text
    # off the corpus the pieces are shorter than Qwen3's, never unknown
    assert len(pruned.encode("Zebra crossings über alles")) > len(tok.encode("Zebra crossings über alles"))
    # a text the corpus does not hold is reported by the check (it is exact only on the corpus)
    assert pruned_tokenizer.check_pruned(tok, pruned, ["Zebra crossings"]) == ["Zebra crossings"]


# ----------------------------------------------------------------------------- the SFT loss at targets
def test_sft_loss_at_targets_equals_the_full_loss_and_gradient():
    cfg = Qwen3Config(vocab_size=97)
    params = qwen3.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 97, (3, 24)), jnp.int32)
    mask = np.zeros((3, 24), bool)
    mask[0, 5:9], mask[1, 20:24], mask[2, [3, 11, 17]] = True, True, True
    m = sft_lib.max_targets(mask)
    assert m == 8
    (full, aux_full), g_full = jax.value_and_grad(sft_lib.sft_loss, has_aux=True)(params, cfg, tokens, mask)
    (at, aux_at), g_at = jax.value_and_grad(sft_lib.sft_loss_at_targets, has_aux=True)(params, cfg, tokens, mask, m)
    np.testing.assert_allclose(at, full, rtol=1e-6)
    np.testing.assert_allclose(aux_at["token_accuracy"], aux_full["token_accuracy"])
    for a, b in zip(jax.tree.leaves(g_at), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    index, valid = sft_lib.target_positions(mask, m)
    assert index[2, :3].tolist() == [2, 10, 16] and valid.sum(axis=1).tolist() == [4, 4, 3]
    # too few target positions drop targets: the loss then differs (M is sized from the data)
    assert not np.isclose(float(sft_lib.sft_loss_at_targets(params, cfg, tokens, mask, 2)[0]), float(full))


# ----------------------------------------------------------------------------- reference episodes
@pytest.fixture(scope="module")
def sql_world(tok):
    ts = host_stages.HostTaskSettings(domain="sql", t_max=2, max_action_tokens=64, max_context=640,
                                      max_obs_tokens=24, max_train_tasks=6, max_heldout_tasks=2, workers=2)
    return ts, host_stages.make_host_world(ts, tok)


def test_reference_rows_are_the_rollouts_context_with_the_reply_as_target(sql_world, tok):
    ts, world = sql_world
    tasks = list(world.train_tasks[:3])
    rows = host_sft.sft_rows(world, ts, tasks, [2, 1, 2])
    assert rows["task_ids"] == [t.id for t in tasks] and rows["left_out"] == {}
    assert rows["width"] % 16 == 0 and rows["tokens"].shape == rows["mask"].shape == (3, rows["width"])
    for e, task in enumerate(tasks):
        toks, mask = rows["tokens"][e], rows["mask"][e]
        assert tok.decode(toks[mask]) == world.env.ground_truth_actions(task)[0] + IM_END
        prompt = tok.decode(toks[:np.flatnonzero(mask)[0]])
        assert world.env.system_prompt(task) in prompt and task.question in prompt
        assert f"Turn 1 of {[2, 1, 2][e]}." in prompt  # the announced budget
    # a reference longer than max_action_tokens cannot end solved: left out, and why
    short = dataclasses.replace(ts, max_action_tokens=4)
    with pytest.raises(ValueError, match="no reference episode ended solved"):
        host_sft.sft_rows(world, short, tasks, [2, 2, 2])
    long_task = max(world.train_tasks, key=lambda t: len(t.gold))
    mixed = host_sft.sft_rows(world, dataclasses.replace(ts, max_action_tokens=len(tok.encode(tasks[0].gold)) + 8),
                              [tasks[0], long_task], [2, 2])
    assert mixed["task_ids"] == [tasks[0].id] and list(mixed["left_out"]) == [long_task.id]


def test_noisy_expert_rows_keep_the_slipped_failures_at_the_drawn_rate(sql_world, tok):
    ts, world = sql_world
    distinct = [t for t in world.train_tasks if expert_for(world.env).slipped_actions(t, 0) is not None][:3]
    assert len(distinct) >= 2
    tasks = distinct * 20
    replies, slipped, checked = host_sft.expert_replies(world.env, tasks, [2] * len(tasks), 0.5, 0.0, seed=1)
    assert not checked.any()
    assert 0.3 < slipped.mean() < 0.7  # drawn per row, not per task: a task has slipped and clean rows
    n = len(distinct)
    assert all(slipped[i::n].any() and not slipped[i::n].all() for i in range(n))
    for task, reply, slip in zip(tasks, replies, slipped):
        assert (reply != world.env.ground_truth_actions(task)) == slip
    assert host_sft.expert_replies(world.env, tasks, [2] * len(tasks), 0.0, 0.0, seed=1)[1].sum() == 0
    rows = host_sft.sft_rows(world, ts, tasks[:6], [2] * 6, replies=replies[:6], slipped_E=slipped[:6])
    assert len(rows["task_ids"]) == 6 and rows["n_left_out"] == 0  # a slipped submission is kept, solved or not
    np.testing.assert_array_equal(rows["slipped"], slipped[:6])
    assert rows["solved"][~slipped[:6]].all()
    for e in range(6):
        assert tok.decode(rows["tokens"][e][rows["mask"][e]]) == replies[e][0] + IM_END
    bare = object.__new__(type("Bare", (HostEnv,), {}))  # an env without a noisy expert
    for noise, check in ((0.999, 0.0), (0.0, 0.999)):
        with pytest.raises(ValueError, match="the Bare env has no noisy expert"):
            host_sft.expert_replies(bare, tasks[:1], [2], noise, check, 0)
    with pytest.raises(NotImplementedError, match="no slipped reference"):  # an expert given that cannot slip
        host_sft.expert_replies(bare, tasks[:1], [2], 0.999, 0.0, 0, expert=NoisyExpert(bare))
    with pytest.raises(NotImplementedError, match="no checked reference"):
        host_sft.expert_replies(bare, tasks[:1], [2], 0.0, 0.999, 0, expert=NoisyExpert(bare))


def test_checking_expert_runs_a_query_then_submits_the_reference(sql_world, tok):
    ts, world = sql_world
    tasks = [t for t in world.train_tasks if expert_for(world.env).slipped_actions(t, 0) is not None][:2] * 30
    budgets = np.array([1, 2] * 30)
    replies, slipped, checked = host_sft.expert_replies(world.env, tasks, budgets, 0.5, 0.5, seed=2)
    assert not checked[budgets == 1].any() and 0.3 < checked[budgets == 2].mean() < 0.7  # only with 2 turns
    assert not (slipped & checked).any()
    for task, reply, c in zip(tasks, replies, checked):
        gold = world.env.ground_truth_actions(task)
        if c:  # a query run first (the gold one or a slip of it), then the reference submitted
            assert len(reply) == 2 and reply[1] == gold[0] and reply[0].startswith("```sql\n")
    first = {r[0] for r, c in zip(replies, checked) if c}
    assert any(task.gold in f for f in first for task in tasks[:2])
    assert any(all(task.gold not in f for task in tasks[:2]) for f in first)  # some checks run a slipped query
    rows = host_sft.sft_rows(world, ts, tasks[:8], budgets[:8], replies=replies[:8], slipped_E=slipped[:8])
    assert len(rows["task_ids"]) == 8 and rows["solved"][~slipped[:8]].all()
    for e in np.flatnonzero(checked[:8]):  # both replies are targets, the query's result between them is not
        targets = tok.decode(rows["tokens"][e][rows["mask"][e]])
        assert targets == replies[e][0] + IM_END + replies[e][1] + IM_END


def test_coding_expert_slips_then_fixes_after_the_feedback(tok):
    from jaxagent.envs.host import sandbox
    from jaxagent.envs.host.code_env import CodeEnv, extract_code
    mode = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"
    ts = host_stages.HostTaskSettings(domain="code", t_max=2, max_action_tokens=128, max_context=768,
                                      max_obs_tokens=64, max_train_tasks=4, max_heldout_tasks=1, workers=2)
    world = host_stages.make_host_world(ts, tok, env=CodeEnv(limits=sandbox.SandboxLimits(mode=mode)))
    def every_slip_fails(t):  # so that each slipped row below fails its first submission
        expert = expert_for(world.env)
        slips = {expert.slipped_actions(t, s)[0] for s in range(20)} if expert.slipped_actions(t, 0) else ()
        return slips and not any(all(world.env.evaluate(t, extract_code(x))[0]) for x in slips)

    task = next(t for t in world.train_tasks if every_slip_fails(t))
    tasks, budgets = [task] * 16, np.array([1, 2] * 8)
    replies, slipped, checked = host_sft.expert_replies(world.env, tasks, budgets, 0.5, 0.0, seed=3)
    assert not checked.any() and 0 < slipped.sum() < 16
    picked = [e for e in range(16) if slipped[e] and budgets[e] == 1][:1] + \
        [e for e in range(16) if slipped[e] and budgets[e] == 2][:1] + [e for e in range(16) if not slipped[e]][:1]
    assert len(picked) == 3
    rows = host_sft.sft_rows(world, ts, [tasks[e] for e in picked], budgets[picked],
                             replies=[replies[e] for e in picked], slipped_E=slipped[picked])
    assert rows["n_left_out"] == 0 and list(rows["slipped"]) == [True, True, False]
    for i, e in enumerate(picked):
        targets = tok.decode(rows["tokens"][i][rows["mask"][i]])
        if budgets[e] == 1 and slipped[e]:  # one turn: the slip is the whole episode, failed or not
            assert targets == replies[e][0] + IM_END and not rows["solved"][i]
        elif slipped[e]:  # two turns: the slip, the test feedback (not a target), then the reference
            assert targets == replies[e][0] + IM_END + replies[e][1] + IM_END and rows["solved"][i]
            assert "Passed " in tok.decode(rows["tokens"][i][~rows["mask"][i]])
        else:
            assert targets == world.env.ground_truth_actions(task)[0] + IM_END and rows["solved"][i]
    # an expert that never fixes (slip_fix 0) submits the slip again after the feedback: kept, failed at 2 turns
    replies, slipped, _ = host_sft.expert_replies(world.env, tasks, budgets, 0.5, 0.0, seed=3, slip_fix=0.0)
    e = next(e for e in range(16) if slipped[e] and budgets[e] == 2)
    rows = host_sft.sft_rows(world, ts, [task], budgets[[e]], replies=[replies[e]], slipped_E=slipped[[e]])
    assert rows["n_left_out"] == 0 and rows["slipped"][0] and not rows["solved"][0]
    assert tok.decode(rows["tokens"][0][rows["mask"][0]]) == 2 * (replies[e][0] + IM_END)


def test_sft_settings_and_toy_presets_are_checked():
    for bad in (dict(steps=0), dict(batch_size=1.5), dict(lr=0), dict(warmup=-1), dict(max_rows=0),
                dict(budget_mode="tiers"), dict(noise=1.0), dict(noise=-0.1), dict(copies=0), dict(check=1),
                dict(slip_fix=1.5), dict(slip_fix=-0.1), dict(slip_fix=True)):
        with pytest.raises(ValueError, match="HostSFTSettings"):
            host_sft.HostSFTSettings(**bad)
    for name in ("sql-toy", "code-toy", "bfcl-toy"):
        p = HOST_PRESETS[name]
        assert p.sft is not None and p.pruned_vocabulary and p.tiny_model is not None
        assert preset_problem(p) is None
        assert "pruned_vocabulary is for a tiny random model" in preset_problem(dataclasses.replace(p, checkpoint="/x"))


# ----------------------------------------------------------------------------- the base stage
def test_toy_base_stage_trains_saves_and_is_reused(tmp_path):
    ci = HOST_PRESETS["ci-sql"]
    preset = dataclasses.replace(
        ci, name="sft-mini", pruned_vocabulary=True,
        task=dataclasses.replace(ci.task, max_action_tokens=64, max_context=640, max_train_tasks=4),
        sft=host_sft.HostSFTSettings(steps=3, batch_size=2, lr=1e-3, warmup=0))
    run = host_run.HostRun(preset, root=str(tmp_path))
    assert run.cfg.vocab_size % 64 == 0 and run.tokenizer.vocab_size <= run.cfg.vocab_size < 4096
    assert run_dir.open_checkpoint(run.checkpoint)[1].vocab_size == run.tokenizer.vocab_size
    init = jax.device_get(host_run.weights.load(run.checkpoint)[1])
    params = host_run.run_base(run)
    done = run_dir.read_done(os.path.join(run.dir, "base"))
    assert done["sft"]["rows"] == 4 and done["sft"]["left_out"] == 0 and done["sft"]["last"]["step"] == 2
    with open(os.path.join(run.dir, "base", "sft.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1, 2]
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(jax.device_get(params)))]
    assert all(moved)
    again = host_run.run_base(run)  # finished: read back from base/policy, not trained again
    for a, b in zip(jax.tree.leaves(jax.device_get(params)), jax.tree.leaves(jax.device_get(again))):
        np.testing.assert_array_equal(a, b)
    with open(os.path.join(run.dir, "base", "sft.jsonl")) as f:
        assert len(f.readlines()) == 3
    # what the base's held-out submissions get wrong: every episode sorted once
    shares = mistakes.mistake_shares(run, params, budget=1, n_samples=2)
    assert shares["episodes"] == 2 * len(run.world.heldout_tasks)
    assert sum(shares[k] for k in expert_for(run.world.env).mistake_kinds) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="budget must be in"):
        mistakes.mistake_shares(run, params, budget=3, n_samples=1)
    # the train-step benchmark on this base (`experiments.bench_host_step`): the three settings give one update
    out = host_step.run_bench(run, steps=1, seed=0)
    assert out["rows"] == preset.n_tasks * preset.group_size
    assert out["policy_tokens"] <= out["packed_positions"] <= max(16, 2 * out["policy_tokens"])
    assert out["policy_tokens"] > 0 and out["speedup"] > 0
    for name in ("rows", "rows_decode_options"):
        assert out[f"{name}_loss"] == pytest.approx(out["packed_loss"], rel=1e-4, abs=1e-6)
        assert out[f"{name}_max_param_diff"] <= 2 * preset.lr * 1.001  # AdamW's first step moves each entry <= lr
    # the rollout benchmark (`experiments.bench_host_rollout`): 2 rows are too few to compact (`compact_rows`), so
    # the two settings sample the same episodes
    roll = host_rollout_bench.run_bench(run, n=1, seed=0)
    assert roll["episodes"] == 2 and roll["speedup"] > 0
    for key in ("success", "policy_tokens", "turns"):
        assert roll[f"full_rows_{key}"] == roll[f"compacted_{key}"]


# ----------------------------------------------------------------------------- trimmed rollouts
def test_trimmed_rollout_keeps_every_used_slot_and_its_logprobs(sql_world):
    from jaxagent.rl import logprobs as logprobs_lib
    from jaxagent.rollout import host_rollout
    ts, world = sql_world
    tasks = list(world.train_tasks[:3])
    full = host_rollout(None, None, world.env, world.tokenizer, tasks, [2, 2, 1], jax.random.key(0),
                        dataclasses.replace(ts.rollout_config(), workers=2),
                        generate_fn=host_sft.reference_script(world.env, tasks)).rollout
    cut = host_stages.trim_slots(full, 64)
    w, n = cut.tokens.shape[1], int(np.max(full.length))
    assert w % 64 == 0 and n <= w < n + 64 and full.tokens.shape[1] == ts.max_context
    for name in ("tokens", "policy_mask", "turn_index", "logprobs"):
        np.testing.assert_array_equal(getattr(cut, name), np.asarray(getattr(full, name))[:, :w])
    assert host_stages.trim_slots(full, ts.max_context) is full  # nothing to cut
    cfg = Qwen3Config(vocab_size=97)  # ids folded into a small vocabulary: what matters is causality, not the ids
    params = qwen3.init(cfg, jax.random.key(1))
    lp_full = logprobs_lib.token_logprobs(params, cfg, jnp.asarray(full.tokens) % 97)
    lp_cut = logprobs_lib.token_logprobs(params, cfg, jnp.asarray(cut.tokens) % 97)
    m = np.asarray(cut.policy_mask)
    np.testing.assert_allclose(np.asarray(lp_cut)[m], np.asarray(lp_full)[:, :w][m], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="slot_bucket"):
        dataclasses.replace(ts, slot_bucket=0)


def test_sft_batches_cut_to_their_rows_train_as_the_full_width():
    """`fit_sft(width_bucket=...)`: each batch cut to the slots up to its rows' last target (in multiples of the
    bucket) gives the same updates as the full width, to float rounding: the slots cut hold no target, and the
    attention is causal. A wrong cut (one that dropped a target) would change the loss and the parameters."""
    from jaxagent.study import stages
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    toks = rng.integers(1, 128, (6, 96)).astype(np.int32)
    mask = np.zeros((6, 96), bool)
    for e, end in enumerate((10, 20, 33, 40, 70, 90)):  # targets end at different slots; pad after them
        mask[e, end - 5:end] = True
        toks[e, end:] = 0
    runs = [stages.fit_sft(jax.tree.map(jnp.copy, params), cfg, toks, mask, jax.random.key(1), steps=3, batch_size=2, lr=1e-2, warmup=0,
                           targets=5, width_bucket=w, callback=lambda i, r: None) for w in (None, 16)]
    for a, b in zip(runs[0][1], runs[1][1]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4) and a["token_accuracy"] == b["token_accuracy"]
    for a, b in zip(jax.tree.leaves(runs[0][0]), jax.tree.leaves(runs[1][0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    with pytest.raises(ValueError, match="width_bucket"):
        stages.fit_sft(jax.tree.map(jnp.copy, params), cfg, toks, mask, jax.random.key(1), steps=1, batch_size=2,
                       lr=1e-2, warmup=0, width_bucket=0)
    with pytest.raises(ValueError, match="width_bucket"):
        host_sft.HostSFTSettings(width_bucket=0)
