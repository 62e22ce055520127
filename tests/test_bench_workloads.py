"""The CPU benchmarks' record arithmetic (jaxagent.bench.model, .train, .rollout) on tiny inputs with stand-in peers:
which figures come from which measurement, the ratios, the peer's best setting and the busy rule's hold on the
ratios. Nothing here is a timing: the stand-ins return fixed times."""
import types

import numpy as np
import pytest

from experiments.peers import torch_grpo, torch_train
from jaxagent.bench import model, rollout, train
from jaxagent.bench.harness import DEFAULT_POLICY, PASSIVE, PeerSetting
from jaxagent.bench.roofline import train_flops
from jaxagent.models.config import PRESETS


def test_peers_use_the_jax_sides_constants():
    assert (torch_grpo.CLIP_LOW, torch_grpo.CLIP_HIGH) == (train.CLIP_LOW, train.CLIP_HIGH)
    assert (torch_train.LR, torch_train.WD, torch_train.MAX_NORM) == (train.LR, train.WD, train.MAX_NORM)


def test_time_runners_pairs_decode_with_its_own_prefill(monkeypatch):
    """decode of a round = that round's total - that round's prefill; medians and minima per quantity."""
    clock = iter([0.0, 1.0,                       # warm-up call: compile 1 s
                  1.0, 1.1, 1.1, 1.6,             # round 1: prefill 0.1, total 0.5
                  2.0, 2.3, 2.3, 3.0,             # round 2: prefill 0.3, total 0.7
                  3.0, 3.2, 3.2, 3.8])            # round 3: prefill 0.2, total 0.6
    monkeypatch.setattr(model.time, "perf_counter", lambda: next(clock))
    res = model.time_runners({"x": lambda n: np.zeros((2, n))}, {"x": 0}, new_tokens=4, repeats=3)["x"]
    assert res["compile_s"] == 1.0 and res["tokens"].shape == (2, 4)
    assert res["prefill_s"] == pytest.approx(0.2) and res["prefill_min_s"] == pytest.approx(0.1)
    assert res["total_s"] == pytest.approx(0.6)
    assert res["decode_s"] == pytest.approx(0.4) and res["decode_min_s"] == pytest.approx(0.4)


def test_time_runners_refuses_a_short_generation():
    with pytest.raises(RuntimeError, match="generated 3 tokens, expected 4"):
        model.time_runners({"x": lambda n: np.zeros((2, 3))}, {"x": 0}, new_tokens=4, repeats=1)


def test_rollout_tokens_processed_counts_the_system_prompt_once():
    assert rollout.tokens_processed(np.array([10, 12, 15]), sys_len=5) == 5 + 5 + 7 + 10


def test_rollout_finish_shape_takes_the_peers_best_setting():
    out = {"params": 1000, "jax_s": 0.5, "jax_tokens_per_episode": 20.0}
    peer = {PeerSetting(1): {"shapes": {"1m": {"s": 2.0, "min_s": 1.9, "warmup_s": 3.0, "tokens": 80.0,
                                               "success_rate": 0.25}}},
            PeerSetting(2, PASSIVE): {"shapes": {"1m": {"s": 1.0, "min_s": 0.9, "warmup_s": 2.0, "tokens": 80.0,
                                                        "success_rate": 0.5}}}}
    r = rollout.finish_shape("1m", out, peer, types.SimpleNamespace(batch=4), peak=10.0)
    assert (r["1m_torch_threads"], r["1m_omp_wait_policy"]) == (2, PASSIVE)
    assert r["1m_rollout_ratio"] == 2.0 and r["1m_torch_episodes_per_s"] == 4.0
    assert r["1m_jax_model_gflops"] == pytest.approx(2 * 1000 * 20 * 4 / 0.5 / 1e9)
    assert r["1m_torch_model_gflops"] == pytest.approx(2 * 1000 * 80 / 1.0 / 1e9)
    assert r["1m_torch_frac_peak"] == pytest.approx(r["1m_torch_model_gflops"] / 10.0)
    assert list(r["1m_torch_settings"]) == ["t1", "t2-passive"]


@pytest.fixture(scope="module")
def train_record():
    """bench_train's run at tiny size (one timed step) with a stand-in peer: 2 s at one thread, 1 s at two."""
    seen = {}

    def run_peer(cfg, params, batch_np, spec, settings):
        seen.update(spec=spec, settings=settings, batch=batch_np)
        return {s: {"step_s": 1.0 if s.threads == 2 else 2.0, "min_step_s": 0.9, "first_loss": 0.125,
                    "matmul_gflops": 1e6} for s in settings}

    meter = types.SimpleNamespace(cpus=[0, 1], fields=lambda: {"busy": True, "busy_reason": "test"})
    args = types.SimpleNamespace(tiny=True, preset=None, batch=8, seq=256, prompt=64, steps=1, warmup=1,
                                 micro_batches=1, threads=0, matmul_n=32, matmul_repeats=1, seed=0, meter=meter)
    return train.run_cpu(args, run_peer), seen


def test_train_record_sizes_and_flops(train_record):
    r, seen = train_record
    assert (r["batch"], r["seq"], r["prompt"], r["policy_tokens"]) == (2, 32, 16, 2 * 16)  # tiny: 2 x 32
    assert r["model_gflops_per_step"] == pytest.approx(train_flops(PRESETS["tiny"], 2, 32) / 1e9)
    assert set(seen["batch"]) == {"tokens", "policy_mask", "advantages", "old_logprobs"}
    assert seen["spec"] == {"steps": 1, "warmup": 1, "matmul_n": 32, "matmul_repeats": 1}
    assert set(seen["settings"]) == {PeerSetting(1), PeerSetting(2), PeerSetting(2, PASSIVE)}


def test_train_record_peer_best_and_busy_ratio(train_record):
    r, _ = train_record
    assert (r["torch_threads"], r["omp_wait_policy"]) == (2, DEFAULT_POLICY) and r["torch_step_s"] == 1.0
    assert r["peak_gflops"] == 1e6 and r["first_loss_abs_diff"] == pytest.approx(abs(0.125 - r["jax_first_loss"]))
    assert r["train_ratio"] is None and r["train_ratio_busy"] == pytest.approx(1.0 / r["jax_step_s"])
    assert r["jax_tokens_per_s"] == pytest.approx(64 / r["jax_step_s"])


def test_rollout_replay_through_the_torch_loop_is_the_same_episode(tmp_path):
    """JAX's sampled replies fed through the PyTorch + gymnasium loop give the same token stream, actions,
    statuses and log-probabilities, truncated replies included (the next chunk opens with <|im_end|>)."""
    import dataclasses

    import jax

    from experiments.peers import torch_rollout
    from jaxagent.models import qwen3, weights
    from jaxagent.models.config import Qwen3Config
    from jaxagent.study.frozenlake.presets import PRESETS as STUDY_PRESETS
    from jaxagent.study.toy import make_toy_world

    ts = dataclasses.replace(STUDY_PRESETS["quick"].task, t_max=2)
    world = make_toy_world(str(tmp_path / "tok"), size=ts.size)
    cfg = Qwen3Config(vocab_size=world.tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(0))
    weights.save(str(tmp_path / "m"), cfg, params)
    rcfg = rollout.RolloutConfig(t_max=ts.t_max, max_action_tokens=ts.max_action_tokens, max_context=ts.max_context,
                                 sampler=rollout.Sampler(temperature=1.0))
    tasks, budgets = ts.sample(jax.random.key(1), 4), np.full((4,), ts.t_max, np.int32)
    jx = rollout.rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, jax.random.key(1000),
                         ts.env_params(), rcfg)
    truncated = np.asarray(jx.turns.span_len)[:, 0] == ts.max_action_tokens
    assert truncated.any()  # the case that needs the closing token
    check = torch_rollout.replay(str(tmp_path / "m"), world, tasks, budgets, jx, rcfg, 1.0)
    assert check["replay_tokens_equal"] and check["replay_actions_equal"] and check["replay_status_equal"], check
    assert check["replay_logprob_max_abs_diff"] < 1e-3, check


def test_mesh_options_record_on_a_tiny_model():
    """`bench.mesh_options` on 2 host devices: both settings run the same step (equal first losses), the ratios are
    the record's own figures, the peaks cover the resident set before each setting."""
    from jaxagent.bench import mesh_options
    rec = mesh_options.run_bench(PRESETS["tiny"], (2, 1, 1), batch=2, seq=16, prompt=4, micro_batches=1, steps=1,
                                 extra_options={"xla_backend_optimization_level": 0})
    assert rec["devices"] == 2 and rec["mesh"] == [2, 1, 1]
    assert rec["decode_options_loss"] == pytest.approx(rec["sequence_options_loss"], rel=1e-5, abs=1e-6)
    assert rec["slowdown"] == rec["sequence_options_step_s"] / rec["decode_options_step_s"]
    assert rec["peak_ratio"] == rec["sequence_options_peak_rss_mb"] / rec["decode_options_peak_rss_mb"]
    for name in mesh_options.SETTINGS:
        assert rec[f"{name}_peak_rss_mb"] >= rec[f"{name}_rss_before_mb"] > 0 and rec[f"{name}_step_s"] > 0
