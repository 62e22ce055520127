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

from jaxagent.models import pruned_tokenizer, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import IM_END, IM_START
from jaxagent.rl import sft as sft_lib
from jaxagent.study import run_dir
from jaxagent.study.host import run as host_run, sft as host_sft, stages as host_stages
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


def test_sft_settings_and_toy_presets_are_checked():
    for bad in (dict(steps=0), dict(batch_size=1.5), dict(lr=0), dict(warmup=-1), dict(max_rows=0),
                dict(budget_mode="tiers")):
        with pytest.raises(ValueError, match="HostSFTSettings"):
            host_sft.HostSFTSettings(**bad)
    for name in ("sql-toy", "code-toy"):
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


# ----------------------------------------------------------------------------- trimmed rollouts
def test_trimmed_rollout_keeps_every_used_slot_and_its_logprobs(sql_world):
    from jaxagent.rl import logprobs as logprobs_lib
    from jaxagent.rollout import host_rollout
    ts, world = sql_world
    tasks = list(world.train_tasks[:3])
    full = host_rollout(None, None, world.env, world.tokenizer, tasks, [2, 2, 1], jax.random.key(0),
                        ts.rollout_config(), generate_fn=host_sft.reference_script(world.env, tasks), workers=2).rollout
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
