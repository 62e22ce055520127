"""`--rehearsal`: an accelerator preset's pipeline with its counts cut, on this CPU. The cuts of every accelerator
preset (FrozenLake and host: what is cut, what stays, the batch split still valid, a command line's own overrides
applied on top, the run's own directory), and the host SQL preset's rehearsal end to end through
`experiments.reproduce` on a checkpoint of Qwen3-0.6B's width and vocabulary (one layer) written by transformers'
`save_pretrained` beside the real Qwen3 tokenizer: it reaches report.md, which says it is a rehearsal."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from experiments import cli, host_study
from jaxagent.study.frozenlake import presets as fl_presets
from jaxagent.study.common.run_checks import check_batches
from jaxagent.study.host import presets as host_presets
from jaxagent.study.stages import REHEARSAL_NOTE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FL_ACCEL = [n for n, p in fl_presets.PRESETS.items() if p.aot_model]
HOST_ACCEL = [n for n, p in host_presets.HOST_PRESETS.items() if p.aot_model]


@pytest.mark.parametrize("name", FL_ACCEL)
def test_frozenlake_rehearsal_cuts_counts_and_keeps_the_model(name):
    p = fl_presets.PRESETS[name]
    r = fl_presets.rehearsal_preset(p)
    assert r.rehearsal and not p.rehearsal
    # kept: what the programs compute with
    for field in ("model", "arms", "compute_dtype", "remat", "lr", "kl_coef", "kl_estimator", "aot_model", "mesh"):
        assert getattr(r, field) == getattr(p, field), field
    assert (r.task.size, r.task.frozen_prob) == (p.task.size, p.task.frozen_prob)
    # cut: counts
    shards = p.mesh[0] * p.mesh[1]
    assert r.seeds == p.seeds[:1] and r.iterations == 1 and r.rollout_batch == max(2, shards) and r.micro_batches == 1
    assert (r.task.t_max, r.task.max_action_tokens, r.task.max_context) == (4, 16, 512)
    assert r.task.max_context < p.task.max_context and r.rollout_batch < p.rollout_batch
    assert (r.eval.n_tasks, r.eval.n_samples, r.eval.ks, r.eval.n_plan_tasks) == (2, 1, (1,), 2)
    assert r.eval.n_continuations == 1 < p.eval.n_continuations
    check_batches(r, shards)  # the cut batch splits over the preset's own mesh (the 4B's 8 fsdp shards)


@pytest.mark.parametrize("name", HOST_ACCEL)
def test_host_rehearsal_cuts_counts_and_keeps_the_model(name):
    p = host_presets.HOST_PRESETS[name]
    r = host_presets.rehearsal_preset(p)
    assert r.rehearsal and not p.rehearsal
    for field in ("arms", "compute_dtype", "remat", "lr", "aot_model", "mesh", "tiny_model", "sft"):
        assert getattr(r, field) == getattr(p, field), field
    assert r.task.domain == p.task.domain and r.task.enable_thinking == p.task.enable_thinking
    shards = p.mesh[0] * p.mesh[1]
    assert r.seeds == p.seeds[:1] and r.iterations == 1 and (r.n_tasks, r.group_size, r.micro_batches) == (
        1, max(2, shards), 1)
    check_batches(r, shards)  # on the preset's own mesh (the 8B's 32 batch shards)
    assert (r.task.t_max, r.task.max_action_tokens, r.task.max_train_tasks, r.task.max_heldout_tasks) == (2, 16, 2, 2)
    assert (r.eval.n_samples, r.eval.ks, r.eval.batch_size) == (1, (1,), 2)
    if p.task.domain == "bfcl":  # BFCL's tool documents alone are >= 2,031 tokens
        assert (r.task.max_context, r.task.max_system_tokens) == (2560, 2200)
    else:
        assert r.task.max_context == 1024
    assert host_presets.preset_problem(dataclasses.replace(r, checkpoint="/x")) is None


def test_toy_host_rehearsal_cuts_the_sft():
    p = host_presets.HOST_PRESETS["sql-toy"]
    r = host_presets.rehearsal_preset(p)
    assert (r.sft.steps, r.sft.batch_size) == (2, 2) and r.sft.lr == p.sft.lr and r.task.slot_bucket <= 1024


def test_command_line_overrides_apply_on_top_of_the_cut(tmp_path):
    args = cli.parser("t", run_options=True).parse_args(
        ["--preset", "qwen3-0.6b-1gpu", "--checkpoint", str(tmp_path), "--rehearsal", "--iterations", "3",
         "--arms", "grpo", "ppo"])
    p = cli.preset_from(args)
    assert p.rehearsal and p.iterations == 3 and p.arms == ("grpo", "ppo") and p.rollout_batch == 2
    # --mesh: the batch is cut for the mesh the run uses (8 fsdp shards: 8 rows), not the preset's
    args = cli.parser("t", run_options=True).parse_args(
        ["--preset", "qwen3-0.6b-1gpu", "--checkpoint", str(tmp_path), "--rehearsal", "--mesh", "1", "8", "1"])
    p = cli.preset_from(args)
    assert p.mesh == (1, 8, 1) and p.rollout_batch == 8
    check_batches(p, 8)
    args = host_study.parser().parse_args(["--preset", "qwen3-0.6b-1gpu-code", "--checkpoint", str(tmp_path),
                                           "--rehearsal", "--seeds", "5", "--arms", "grpo"])
    h = host_study.preset_from(args)
    assert h.rehearsal and h.seeds == (5,) and h.arms == ("grpo",) and h.iterations == 1
    with pytest.raises(SystemExit):
        host_study.parser().parse_args(["--preset", "ci-sql", "--arms", "ppo"])  # not a host arm


def _real_width_checkpoint(path):
    """Qwen3-0.6B's width, heads and vocabulary with ONE layer, random, written by transformers (bf16), beside the real
    Qwen3 tokenizer's files: the layout a user's checkpoint directory has."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from jaxagent.models.tokenizer import qwen3_tokenizer_dir
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
                      tie_word_embeddings=True, max_position_embeddings=40960)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    for f in os.listdir(qwen3_tokenizer_dir()):
        shutil.copy(os.path.join(qwen3_tokenizer_dir(), f), path)


@pytest.mark.slow  # ~3-4 min of CPU time: the real vocabulary's unembedding and sampling at every step
def test_host_rehearsal_end_to_end_on_a_real_width_checkpoint(tmp_path):
    ckpt = tmp_path / "qwen3-0.6b-1layer"
    _real_width_checkpoint(ckpt)
    got = subprocess.run([sys.executable, "-m", "experiments.reproduce", "--preset", "qwen3-0.6b-1gpu-sql",
                          "--checkpoint", str(ckpt), "--rehearsal", "--arms", "grpo", "--root", str(tmp_path / "runs"),
                          "--scan-layers"],  # as a small host rehearses a full-depth checkpoint (docs/first_run.md)
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert got.returncode == 0, got.stderr[-3000:]
    run = tmp_path / "runs" / "qwen3-0.6b-1gpu-sql-rehearsal"
    report = (run / "report.md").read_text()
    assert f"- rehearsal: {REHEARSAL_NOTE}" in report.splitlines()[2]  # the first line under the title
    config = json.loads((run / "config.json").read_text())
    assert config["rehearsal"] is True and config["iterations"] == 1 and config["task"]["max_context"] == 1024
    assert config["compute_dtype"] == "bfloat16" and config["remat"] == "full" and config["scan_layers"] is True
    assert (run / "arms" / "grpo" / "seed0" / "DONE").exists()
    assert {"base.json", "grpo_seed0.json"} <= set(os.listdir(run / "eval"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert any(k.startswith("sql.f1_pass1") for k in metrics)
    with open(run / "arms" / "grpo" / "seed0" / "metrics.jsonl") as f:
        it = json.loads(f.readline())
    assert it["iteration"] == 0 and it["tokens"] > 0  # the real tokenizer's replies were trained on


def test_compile_cache_option_sets_jax_persistent_cache(tmp_path):
    import jax
    args = cli.parser("t", run_options=True).parse_args(["--preset", "ci", "--compile-cache", str(tmp_path / "c")])
    before = jax.config.jax_compilation_cache_dir
    try:
        cli.init_distributed(args)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
