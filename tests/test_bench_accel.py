"""experiments/bench_accel.py at tiny size on CPU: its arguments are validated (exit 2, one line), its JSON lines
carry the fields and the roofline arithmetic (against figures computed here by hand, not timed), the PyTorch peer
and the RL iteration run (slow), and the CPU host without a device spec says so."""
import json
import math

import pytest

from experiments import bench_accel
from jaxagent.bench import accel

PEAK_TFLOPS, HBM_GBPS = 2.0, 50.0
TINY = dict(V=512, D=64, F=128, L=2, H=4, K=2, E=16)
N_LAYERS = 2 * (2 * 64 * 4 * 16 + 2 * 64 * 2 * 16 + 3 * 64 * 128)
N_MM = N_LAYERS + 512 * 64
NORMS = 2 * (2 * 64 + 2 * 16) + 64
KV_PER_TOKEN_BF16 = 2 * 2 * 2 * 16 * 2  # 2 (k, v) x L x K x E x 2 bytes


def _run(capsys, argv):
    rc = bench_accel.main(argv)
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.strip()], err


@pytest.mark.parametrize("argv, flag", [
    (["--models", "qwen3-9b"], "--models"),
    (["--models", "qwen3_8b"], "--models"),
    (["--decode-batches", "0"], "--decode-batches"),
    (["--decode-batches", "1,x"], "--decode-batches"),
    (["--decode-steps", "1"], "--decode-steps"),
    (["--train-prompt", "2048"], "--train-prompt"),
    (["--micro-batches", "3"], "--micro-batches"),
    (["--rl-preset", "qwen3-9b-v5p"], "--rl-preset"),
    (["--rl-base", "sft", "--rl-preset", "qwen3-0.6b-1gpu"], "--rl-base"),
    (["--mesh", "1,2"], "--mesh"),
    (["--tiny", "--mesh", "2,2,2"], "--mesh"),  # micro-batches of 1 row over 4 batch shards
    (["--peak-tflops", "5"], "--peak-tflops"),
    (["--remat", "most"], "--remat"),
    (["--only", "decode,fly"], "--only"),
    (["--checkpoint", "/nonexistent/dir"], "--checkpoint"),
    (["--repeats", "0"], "--repeats"),
    (["--budget-s", "-1"], "--budget-s"),
    (["--estimates", "--estimate-chip", "H900"], "--estimate-chip"),
    (["--no-such-flag"], "--no-such-flag"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, flag):
    rc, lines, err = _run(capsys, argv)
    assert rc == 2 and lines == []
    assert len(err.strip().splitlines()) == 1 and err.startswith("bench_accel: error:") and flag in err, err


def test_checkpoint_names_one_model(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    rc, _, err = _run(capsys, ["--checkpoint", str(tmp_path), "--models", "qwen3-0.6b,qwen3-4b"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--models names one model" in err


def test_unknown_model_lists_the_valid_names(capsys):
    _, _, err = _run(capsys, ["--models", "qwen3-9b"])
    assert "valid: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b" in err


@pytest.fixture(scope="module")
def tiny_run():
    """decode (batch 2), prefill (16 tokens) and the train step at tiny size, with a given device spec."""
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = bench_accel.main(["--tiny", "--no-peer", "--only", "decode,prefill,train", "--decode-batches", "2",
                               "--prefill-contexts", "16", "--repeats", "2", "--peak-tflops", str(PEAK_TFLOPS),
                               "--hbm-gbps", str(HBM_GBPS)])
    assert rc == 0
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    return {r["bench"]: r for r in recs}


def _timing_ok(rec, prefix):
    t, lo, hi = rec[f"{prefix}_s"], rec[f"{prefix}_min_s"], rec[f"{prefix}_max_s"]
    assert 0 < lo <= t <= hi and rec[f"{prefix}_spread"] == pytest.approx((hi - lo) / t)
    assert rec["repeats"] == 2 and rec["warmup"] == 1


def test_device_record(tiny_run):
    d = tiny_run["device"]
    assert d["platform"] == "cpu" and d["peak_tflops"] == PEAK_TFLOPS and d["hbm_gbps"] == HBM_GBPS
    assert d["peer_note"] == "--no-peer" and d["roofline_note"] is None and d["smoke_test"] is True


def test_decode_record_fields_and_arithmetic(tiny_run):
    r = tiny_run["decode"]
    assert (r["model"], r["batch"], r["context"], r["steps"]) == ("tiny", 2, 16, 4) and "error" not in r
    _timing_ok(r, "loop")
    step_s = r["loop_s"] / 4
    assert r["ms_per_step"] == pytest.approx(step_s * 1e3) and r["tokens_per_s"] == pytest.approx(2 / step_s)
    assert r["weight_bytes"] == (N_MM + NORMS) * 2  # bf16 weights
    assert r["kv_bytes"] == 2 * (16 + 3 / 2) * KV_PER_TOKEN_BF16  # the mean context over the 4 steps
    assert r["hbm_roofline_frac"] == pytest.approx(r["bytes"] / step_s / (HBM_GBPS * 1e9))
    flops = 2 * (2 * N_LAYERS + 2 * 512 * 64 + 4 * 2 * 4 * 16 * (round(17.5) + 1))
    assert r["mfu"] == pytest.approx(flops / step_s / (PEAK_TFLOPS * 1e12))
    bound = max(r["bytes"] / (HBM_GBPS * 1e9), flops / (PEAK_TFLOPS * 1e12))
    assert r["roofline_ms_per_step"] == pytest.approx(bound * 1e3) and r["roofline_bound"] == "memory"


def test_prefill_record_fields_and_arithmetic(tiny_run):
    r = tiny_run["prefill"]
    assert (r["batch"], r["context"], r["tokens"]) == (2, 16, 32)  # --prefill-tokens 32 // 16
    _timing_ok(r, "time")
    flops = 2 * (2 * N_LAYERS * 16 + 2 * 512 * 64 + 4 * 2 * 4 * 16 * (16 * 17 // 2))
    assert r["model_flops"] == flops and r["tokens_per_s"] == pytest.approx(32 / r["time_s"])
    assert r["mfu"] == pytest.approx(flops / r["time_s"] / (PEAK_TFLOPS * 1e12))


def test_train_record_fields_and_arithmetic(tiny_run):
    r = tiny_run["train_step"]
    assert (r["rows"], r["seq"], r["micro_batches"], r["remat"]) == (2, 32, 2, "full") and "error" not in r
    _timing_ok(r, "step")
    flops = 6 * N_MM * 64 + 12 * 2 * 4 * 16 * 32 * 64
    assert r["model_flops"] == flops and r["tokens_per_s"] == pytest.approx(64 / r["step_s"])
    assert r["mfu"] == pytest.approx(flops / r["step_s"] / (PEAK_TFLOPS * 1e12))
    assert math.isfinite(r["first_loss"]) and r["skipped_total"] == 0 and r["compile_s"] > 0
    assert r["program_argument_bytes"] > 0 and r["program_temp_bytes"] >= 0
    assert r["device_peak_bytes_in_use"] is None  # XLA:CPU keeps no device statistics


def test_unknown_device_reports_figures_without_roofline(capsys, tiny_run):
    rc, recs, _ = _run(capsys, ["--tiny", "--no-peer", "--only", "decode", "--decode-batches", "2", "--repeats", "1"])
    dev, dec = recs
    assert rc == 0 and dev["spec_name"] is None and "not in jaxagent.bench.devices" in dev["roofline_note"]
    assert dec["hbm_roofline_frac"] is None and dec["mfu"] is None and dec["tokens_per_s"] > 0


def test_budget_spent_skips_with_a_record(capsys):
    rc, recs, _ = _run(capsys, ["--tiny", "--no-peer", "--only", "decode", "--budget-s", "1e-9"])
    assert rc == 0 and [r["bench"] for r in recs] == ["device", "decode", "decode"]
    assert all("time budget" in r["skipped"] for r in recs[1:])


@pytest.mark.slow
def test_peer_on_the_same_chip(capsys):
    """The PyTorch peer (CPU here): greedy tokens and first losses on one random checkpoint, its decode beside ours
    with the ratio."""
    rc, recs, _ = _run(capsys, ["--tiny", "--only", "check,decode", "--decode-batches", "2", "--repeats", "1"])
    by = {r["bench"]: r for r in recs}
    assert rc == 0 and by["device"]["torch"] and by["device"]["peer_device"] == "cpu"
    c = by["check"]
    assert c["peer"] == "transformers+torch" and c["tokens_equal_frac"] >= 0.75, c
    assert c["first_loss_rel_diff"] < 0.02  # bf16 forward passes on both sides
    d = by["decode"]
    assert d["peer_setting"] in ("dynamic", "static") and d["ratio"] == pytest.approx(
        d["tokens_per_s"] / d["peer_tokens_per_s"])


@pytest.mark.slow
def test_rl_iteration_split_and_long_tail(capsys):
    rc, recs, _ = _run(capsys, ["--tiny", "--no-peer", "--only", "rl"])
    r = recs[-1]
    assert rc == 0 and r["bench"] == "rl_iteration" and r["preset"] == "ci" and "error" not in r, r
    phases = sum(r[f"{k}_s"] for k in ("rollout", "old_logprobs", "values", "update"))
    assert r["other_s"] >= 0 and phases <= r["iteration_s"] and r["rollout_s"] > 0 and r["update_s"] > 0
    assert r["rollout_share"] == pytest.approx(r["rollout_s"] / r["iteration_s"])
    assert r["decode_slots"] == sum(r[f"decode_{k}"] for k in ("generated", "tail", "finished", "padding"))
    assert r["decode_slots"] == sum(r["decode_slots_per_turn"]) and r["episodes"] == 8
    assert 0 <= r["decode_finished_share"] <= 1 and r["separate_old_logprobs_s"] > 0


@pytest.mark.slow
def test_on_a_mesh(capsys):
    """Decode and the train step sharded over the 8 test devices as (data, fsdp, tensor) = (2, 2, 2)."""
    rc, recs, _ = _run(capsys, ["--tiny", "--no-peer", "--mesh", "2,2,2", "--only", "decode,train", "--decode-batches",
                                "4", "--train-rows", "8", "--micro-batches", "2", "--repeats", "1"])
    dev, dec, train = recs
    assert rc == 0 and dev["devices"] == 8 and dev["mesh"] == [2, 2, 2]
    assert "error" not in dec and "error" not in train, (dec, train)
    assert dec["tokens_per_s"] > 0 and math.isfinite(train["first_loss"]) and train["rows"] == 8


# ------------------------------------------------------------------ no throughput from a bad time or a missing count
GOOD = {"decode": dict(bench="decode", model="tiny", batch=2, ms_per_step=2.5, tokens_per_s=800.0,
                       hbm_roofline_frac=None),
        "prefill": dict(bench="prefill", model="tiny", batch=2, context=16, tokens_per_s=5000.0, mfu=None),
        "train_step": dict(bench="train_step", model="tiny", step_s=0.5, tokens_per_s=128.0, mfu=None),
        "rl_iteration": dict(bench="rl_iteration", rl_preset="ci", iteration_s=2.0, rollout_share=0.5,
                             decode_finished_share=None)}


@pytest.mark.parametrize("bench", sorted(GOOD))
def test_progress_line_prints_the_figures(bench):
    line = accel.summary(GOOD[bench])
    assert "no throughput" not in line and len(line.splitlines()) == 1


@pytest.mark.parametrize("bench, key, value", [
    ("decode", "ms_per_step", 0.0), ("decode", "tokens_per_s", -800.0), ("decode", "tokens_per_s", None),
    ("prefill", "tokens_per_s", 0), ("prefill", "tokens_per_s", math.nan), ("train_step", "step_s", -0.5),
    ("train_step", "tokens_per_s", math.inf), ("rl_iteration", "iteration_s", 0.0), ("decode", "ms_per_step", "x"),
])
def test_progress_line_says_no_throughput_instead_of_a_number(bench, key, value):
    rec = {**GOOD[bench], key: value}
    line = accel.summary(rec)
    assert len(line.splitlines()) == 1 and "no throughput" in line and key in line, line
    assert "-800" not in line and "nan" not in line and "inf" not in line


def test_missing_count_says_no_throughput():
    rec = dict(GOOD["prefill"])
    del rec["tokens_per_s"]
    assert "no throughput (tokens_per_s missing or not > 0)" in accel.summary(rec)


@pytest.mark.parametrize("theirs", [0.0, -5.0, None, math.nan])
def test_peer_ratio_only_from_positive_figures(theirs):
    peer = {"decode/tiny/2": {"tokens_per_s": theirs, "best": "dynamic", "settings": {}}}
    assert accel.peer_fields(peer, "decode/tiny/2", 100.0)["ratio"] is None
    assert accel.peer_fields({"decode/tiny/2": {"tokens_per_s": 50.0}}, "decode/tiny/2", -1.0)["ratio"] is None
    assert accel.peer_fields({"decode/tiny/2": {"tokens_per_s": 50.0}}, "decode/tiny/2", 100.0)["ratio"] == 2.0
