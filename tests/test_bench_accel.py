"""experiments/bench_accel.py at tiny size on CPU: its arguments are validated (exit 2, one line), its JSON lines
carry the fields and the roofline arithmetic against the datasheet's and the measured peaks (figures computed
here by hand, not timed), each stage keeps its own time budget, --help and --estimates import no JAX, Flax,
Optax, Orbax or TensorStore, and the whole script path (a child process for the JAX stages, then the PyTorch
peer, the comparisons and the targets) runs in --smoke mode (slow)."""
import json
import math
import os
import subprocess
import sys
import time
import types

import pytest

from experiments import bench_accel
from jaxagent.bench import accel_peer, accel_plan, accel_report

PEAK_TFLOPS, HBM_GBPS = 2.0, 50.0
N_LAYERS = 2 * (2 * 64 * 4 * 16 + 2 * 64 * 2 * 16 + 3 * 64 * 128)  # the tiny shape: V 512, D 64, F 128, L 2, H 4,
N_MM = N_LAYERS + 512 * 64                                           # K 2, E 16, tied
NORMS = 2 * (2 * 64 + 2 * 16) + 64
KV_PER_TOKEN_BF16 = 2 * 2 * 2 * 16 * 2  # 2 (k, v) x L x K x E x 2 bytes
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    (["--train-model", "qwen3-9b"], "--train-model"),
    (["--rl-preset", "qwen3-9b-v5p"], "--rl-preset"),
    (["--rl-base", "sft", "--rl-preset", "qwen3-0.6b-1gpu"], "--rl-base"),
    (["--mesh", "1,2"], "--mesh"),
    (["--smoke", "--mesh", "2,2,2"], "--mesh"),  # micro-batches of 1 row over 4 batch shards
    (["--peak-tflops", "5"], "--peak-tflops"),
    (["--remat", "most"], "--remat"),
    (["--only", "decode,fly"], "--only"),
    (["--checkpoint", "/nonexistent/dir"], "--checkpoint"),
    (["--repeats", "0"], "--repeats"),
    (["--budget-s", "-1"], "--budget-s"),
    (["--stage-budgets", "decode=-5"], "--stage-budgets"),
    (["--stage-budgets", "warmup=5"], "--stage-budgets"),
    (["--peak-matmul", "0"], "--peak-matmul"),
    (["--estimates", "--estimate-chip", "H900"], "--estimate-chip"),
    (["--estimates", "some"], "--estimates"),
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


def test_help_names_only_files_that_exist():
    text = bench_accel.parser().format_help() + bench_accel.__doc__
    paths = {w.strip("(),.;:'`") for w in text.split() if w.strip("(),.;:'`").endswith(".py")}
    assert paths and all(os.path.isfile(os.path.join(ROOT, p)) for p in paths), paths


@pytest.mark.parametrize("argv", [["--help"], ["--estimates"]])
def test_help_and_estimates_import_no_jax_flax_optax_orbax_or_tensorstore(argv):
    """In a fresh interpreter, as a user runs them."""
    code = ("import contextlib, io, sys\nfrom experiments import bench_accel\n"
            f"with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    try:\n        rc = bench_accel.main({argv!r})\n    except SystemExit as e:\n        rc = e.code\n"
            "heavy = [m for m in ('jax', 'jaxlib', 'flax', 'optax', 'orbax', 'tensorstore', 'torch')\n"
            "         if m in sys.modules]\n"
            "print(rc, len(out.getvalue()) > 500, heavy)")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert got.stdout.strip() == "0 True []", got.stdout + got.stderr


# ------------------------------------------------------------------ the JAX stages in this process, tiny
@pytest.fixture(scope="module")
def tiny_run():
    """peaks, decode (batch 2), prefill (16 tokens) and the train step at tiny size, with a given device spec."""
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = bench_accel.main(["--smoke", "--no-peer", "--only", "peaks,decode,prefill,train", "--decode-batches",
                               "2", "--prefill-contexts", "16", "--repeats", "2", "--peak-tflops", str(PEAK_TFLOPS),
                               "--hbm-gbps", str(HBM_GBPS), "--compile-cache", "off"])
    assert rc == 0
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    return {r["bench"]: r for r in recs}


def _timing_ok(rec, prefix, repeats=2):
    t, lo, hi = rec[f"{prefix}_s"], rec[f"{prefix}_min_s"], rec[f"{prefix}_max_s"]
    assert 0 < lo <= t <= hi and rec[f"{prefix}_spread"] == pytest.approx((hi - lo) / t)
    assert rec["repeats"] == repeats and rec["warmup"] == 1


def test_device_record(tiny_run):
    d = tiny_run["device"]
    assert d["platform"] == "cpu" and d["peak_tflops"] == PEAK_TFLOPS and d["hbm_gbps"] == HBM_GBPS
    assert d["roofline_note"] is None and d["smoke_test"] is True and d["memory_pool_bytes"] is None
    assert d["stage_budgets_s"] == accel_plan.STAGE_BUDGETS and d["deadline_s"] == 520


def test_peaks_record_beside_the_datasheet(tiny_run):
    p = tiny_run["peaks"]
    assert (p["matmul_n"], p["matmul_reps"], p["copy_bytes"]) == (128, 8, 1 << 20) and "error" not in p
    assert p["matmul_flops"] == 2 * 128 ** 3 * 8 and p["copy_bytes_moved"] == 2 * (1 << 20) * 8
    assert p["measured_tflops"] == pytest.approx(p["matmul_flops"] / p["matmul_s"] / 1e12)
    assert p["measured_hbm_gbps"] == pytest.approx(p["copy_bytes_moved"] / p["copy_s"] / 1e9)
    assert p["matmul_frac_datasheet"] == pytest.approx(p["measured_tflops"] / PEAK_TFLOPS)
    assert p["copy_frac_datasheet"] == pytest.approx(p["measured_hbm_gbps"] / HBM_GBPS)


def test_decode_record_fields_and_arithmetic(tiny_run):
    r, p = tiny_run["decode"], tiny_run["peaks"]
    assert (r["id"], r["batch"], r["context"], r["steps"]) == ("decode/tiny/2", 2, 16, 4) and "error" not in r
    _timing_ok(r, "loop", repeats=2)
    step_s = r["loop_s"] / 4
    assert r["ms_per_step"] == pytest.approx(step_s * 1e3) and r["tokens_per_s"] == pytest.approx(2 / step_s)
    assert r["weight_bytes"] == (N_MM + NORMS) * 2  # bf16 weights
    assert r["kv_bytes"] == 2 * (16 + 3 / 2) * KV_PER_TOKEN_BF16  # the mean context over the 4 steps
    assert r["hbm_roofline_frac"] == pytest.approx(r["bytes"] / step_s / (HBM_GBPS * 1e9))
    assert r["hbm_roofline_frac_measured_peak"] == pytest.approx(r["bytes"] / step_s / (p["measured_hbm_gbps"] * 1e9))
    flops = 2 * (2 * N_LAYERS + 2 * 512 * 64 + 4 * 2 * 4 * 16 * (round(17.5) + 1))
    assert r["mfu"] == pytest.approx(flops / step_s / (PEAK_TFLOPS * 1e12))
    assert r["mfu_measured_peak"] == pytest.approx(flops / step_s / (p["measured_tflops"] * 1e12))
    bound = max(r["bytes"] / (HBM_GBPS * 1e9), flops / (PEAK_TFLOPS * 1e12))
    assert r["roofline_ms_per_step"] == pytest.approx(bound * 1e3) and r["roofline_bound"] == "memory"


def test_prefill_record_counts_the_last_layer_for_one_token(tiny_run):
    r, p = tiny_run["prefill"], tiny_run["peaks"]
    assert (r["id"], r["batch"], r["context"], r["tokens"]) == ("prefill/tiny/16", 2, 16, 32)  # 32 // 16 rows
    _timing_ok(r, "time")
    w_kv, w_rest = 2 * 64 * 2 * 16, 2 * 64 * 4 * 16 + 3 * 64 * 128
    flops = 2 * (2 * (w_kv + w_rest) * 16 + 2 * w_kv * 16 + 2 * w_rest + 2 * 512 * 64 + 4 * 4 * 16 * (136 + 16))
    assert r["model_flops"] == flops and r["tokens_per_s"] == pytest.approx(32 / r["time_s"])
    assert r["mfu"] == pytest.approx(flops / r["time_s"] / (PEAK_TFLOPS * 1e12))
    assert r["mfu_measured_peak"] == pytest.approx(flops / r["time_s"] / (p["measured_tflops"] * 1e12))


def test_train_record_fields_and_arithmetic(tiny_run):
    r = tiny_run["train_step"]
    assert (r["model"], r["rows"], r["seq"], r["micro_batches"], r["remat"]) == ("tiny", 2, 32, 2, "full"), r
    assert r["fit_why"] == "named on the command line" and "error" not in r
    _timing_ok(r, "step")
    flops = 6 * N_MM * 64 + 12 * 2 * 4 * 16 * 32 * 64
    assert r["model_flops"] == flops and r["tokens_per_s"] == pytest.approx(64 / r["step_s"])
    assert r["mfu"] == pytest.approx(flops / r["step_s"] / (PEAK_TFLOPS * 1e12))
    assert math.isfinite(r["first_loss"]) and r["skipped_total"] == 0 and r["compile_s"] > 0
    assert r["program_argument_bytes"] > 0 and r["program_temp_bytes"] >= 0
    assert r["device_peak_bytes_in_use"] is None  # XLA:CPU keeps no device statistics


def test_targets_record_closes_the_run(tiny_run):
    t = tiny_run["targets"]
    by = {row["target"].split(":")[0]: row for row in t["items"]}
    assert t["smoke_test"] is True and by["train step"]["value"] == tiny_run["train_step"]["mfu"]
    assert by["train step"]["met"] == (tiny_run["train_step"]["mfu"] >= 0.4)
    assert by["decode qwen3-8b batch 1"]["value"] is None and by["decode qwen3-8b batch 1"]["met"] is None
    assert "| train step: MFU | tiny | 0.40 |" in accel_report.markdown(t)


def test_unknown_device_reports_figures_without_datasheet_fractions(capsys):
    rc, recs, _ = _run(capsys, ["--smoke", "--no-peer", "--only", "decode", "--compile-cache", "off"])
    dev, dec = recs[0], recs[1]
    assert rc == 0 and dev["spec_name"] is None and "not in jaxagent.bench.devices" in dev["roofline_note"]
    assert dec["hbm_roofline_frac"] is None and dec["hbm_roofline_frac_measured_peak"] is None  # no peaks stage
    assert dec["tokens_per_s"] > 0


# ------------------------------------------------------------------ time: each stage its own budget
def _plan(**kw):
    ns = types.SimpleNamespace(parts=accel_plan.PARTS, stage_budgets=dict(accel_plan.STAGE_BUDGETS), budget_s=520.0,
                               peer_budget_s=50.0)
    ns.__dict__.update(kw)
    return types.SimpleNamespace(stage_limits=lambda *a: accel_plan.Plan.stage_limits(ns, *a),
                                 jax_deadline_s=lambda w: accel_plan.Plan.jax_deadline_s(ns, w))


def test_stage_limits_keep_the_later_stages_time():
    p = _plan()
    deadline = p.jax_deadline_s(True)
    assert deadline == 520 - 50 - accel_plan.PEER_GRACE_S and p.jax_deadline_s(False) == 520
    # decode from 20 s: its own 90 s; the deadline less prefill 50 + train 110 + rl 130 (check keeps none)
    assert p.stage_limits("decode", 20.0, deadline) == (110.0, deadline - 290.0)
    # decode overran to 300 s: train keeps rl's 130 s; rl may start until the deadline
    assert p.stage_limits("train", 300.0, deadline) == (410.0, deadline - 130.0)
    assert p.stage_limits("rl", 300.0, deadline) == (430.0, deadline)
    assert _plan(parts=("decode", "rl")).stage_limits("decode", 0.0, 440.0) == (90.0, 310.0)


def test_a_spent_stage_budget_skips_only_that_stage(capsys):
    """The stage's first measurement starts; the next one finds the stage's budget spent; the next stage runs."""
    rc, recs, _ = _run(capsys, ["--smoke", "--no-peer", "--only", "decode,prefill", "--decode-batches", "1,2",
                                "--stage-budgets", "decode=1e-9", "--compile-cache", "off"])
    by = [(r["bench"], r.get("skipped", "")) for r in recs]
    assert rc == 0 and by[1] == ("decode", "") and by[2][0] == "decode" and "decode stage's budget" in by[2][1]
    assert by[3] == ("prefill", ""), by


def test_the_deadline_skips_with_a_record(capsys):
    rc, recs, _ = _run(capsys, ["--smoke", "--no-peer", "--only", "decode,rl", "--budget-s", "1e-9",
                                "--compile-cache", "off"])
    assert rc == 0 and [r["bench"] for r in recs] == ["device", "decode", "rl_iteration", "peer_device", "targets"]
    assert "deadline" in recs[1]["skipped"] and "deadline" in recs[2]["skipped"]
    assert recs[3]["peer_note"] == "skipped: --no-peer"


def test_a_study_that_does_not_import_ends_only_the_rl_record(capsys, monkeypatch):
    """On a device image without a package only the study needs (orbax, tensorstore), the other stages still run."""
    def missing():
        raise ModuleNotFoundError("No module named 'orbax'")
    monkeypatch.setattr(bench_accel, "rl_presets", missing)
    rc, recs, _ = _run(capsys, ["--smoke", "--no-peer", "--only", "rl", "--compile-cache", "off"])
    rl = next(r for r in recs if r["bench"] == "rl_iteration")
    assert rc == 0 and rl["rl_preset"] == "ci" and rl["error"] == "ModuleNotFoundError: No module named 'orbax'"


# ------------------------------------------------------------------ the peer's side (no JAX)
def test_peer_is_skipped_with_one_line_when_torch_is_absent(monkeypatch):
    real = bench_accel.importlib.util.find_spec
    monkeypatch.setattr(bench_accel.importlib.util, "find_spec", lambda m: None if m == "torch" else real(m))
    assert bench_accel.peer_skip_reason(False) == "torch not installed (pip install -e '.[bench]')"
    assert bench_accel.peer_skip_reason(True) == "--no-peer"


def test_peer_items_put_the_targets_shapes_first():
    a = bench_accel.parser().parse_args(["--models", "qwen3-0.6b", "--rl-preset", "none"])
    plan = accel_plan.plan_from(a, {}, dict)
    ours = {"check": {"model": "qwen3-0.6b"}, "train": {"model": "qwen3-1.7b"}}
    items = accel_peer.peer_items(plan, ours, "/tmp/x")
    assert [i["id"] for i in items] == ["check", "decode/qwen3-0.6b/1", "prefill/qwen3-0.6b/2048", "train",
                                        "decode/qwen3-0.6b/64", "prefill/qwen3-0.6b/8192"]
    assert items[3]["model"]["hidden_size"] == 2048 and items[1]["settings"] == ["dynamic"]
    assert accel_peer.peer_items(plan, {}, None)[0]["id"] == "decode/qwen3-0.6b/1"  # no check record: no check


@pytest.mark.parametrize("theirs", [0.0, -5.0, None, math.nan])
def test_peer_ratio_only_from_positive_figures(theirs):
    assert accel_peer.peer_fields({"tokens_per_s": theirs, "best": "dynamic", "settings": {}}, 100.0)["ratio"] is None
    assert accel_peer.peer_fields({"tokens_per_s": 50.0}, -1.0)["ratio"] is None
    assert accel_peer.peer_fields({"tokens_per_s": 50.0}, 100.0)["ratio"] == 2.0
    assert accel_peer.peer_fields(None, 100.0)["peer_note"] == "the peer did not reach this item"


def test_check_record_compares_tokens_and_losses():
    rec = accel_peer.check_record({"greedy_tokens": [[1, 2, 3, 4]], "first_loss": 2.0},
                                  {"model": "tiny", "greedy_tokens": [[1, 2, 9, 4]], "first_loss": 2.02})
    assert rec["tokens_equal_frac"] == 0.75 and rec["common_prefix_frac"] == 0.5
    assert rec["first_loss_rel_diff"] == pytest.approx(0.01)


# ------------------------------------------------------------------ progress lines
GOOD = {"decode": dict(bench="decode", model="tiny", batch=2, ms_per_step=2.5, tokens_per_s=800.0,
                       hbm_roofline_frac=None),
        "prefill": dict(bench="prefill", model="tiny", batch=2, context=16, tokens_per_s=5000.0, mfu=None),
        "train_step": dict(bench="train_step", model="tiny", step_s=0.5, tokens_per_s=128.0, mfu=None),
        "rl_iteration": dict(bench="rl_iteration", rl_preset="ci", iteration_s=2.0, rollout_share=0.5,
                             decode_finished_share=None)}


@pytest.mark.parametrize("bench", sorted(GOOD))
def test_progress_line_prints_the_figures(bench):
    line = accel_report.summary(GOOD[bench])
    assert "no throughput" not in line and len(line.splitlines()) == 1


@pytest.mark.parametrize("bench, key, value", [
    ("decode", "ms_per_step", 0.0), ("decode", "tokens_per_s", -800.0), ("decode", "tokens_per_s", None),
    ("prefill", "tokens_per_s", 0), ("prefill", "tokens_per_s", math.nan), ("train_step", "step_s", -0.5),
    ("train_step", "tokens_per_s", math.inf), ("rl_iteration", "iteration_s", 0.0), ("decode", "ms_per_step", "x"),
])
def test_progress_line_says_no_throughput_instead_of_a_number(bench, key, value):
    line = accel_report.summary({**GOOD[bench], key: value})
    assert len(line.splitlines()) == 1 and "no throughput" in line and key in line, line
    assert "-800" not in line and "nan" not in line and "inf" not in line


# ------------------------------------------------------------------ the whole script, as a user runs it (slow)
@pytest.mark.slow
def test_smoke_runs_the_whole_script_path(tmp_path):
    """`--smoke` in a fresh process: the JAX stages in a child process (compilation cache on), then the PyTorch
    peer (CPU here) on the checkpoint the child wrote, the comparisons, the targets and the --out files."""
    pytest.importorskip("torch")
    cache, out = tmp_path / "cache", tmp_path / "out"
    t0 = time.perf_counter()
    got = subprocess.run([sys.executable, "-m", "experiments.bench_accel", "--smoke", "--out", str(out),
                          "--compile-cache", str(cache)], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    wall = time.perf_counter() - t0
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr[-3000:]
    recs = [json.loads(line) for line in got.stdout.splitlines()]
    assert recs == [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    by = {}
    for r in recs:
        by.setdefault(r["bench"], []).append(r)
    for bench in ("device", "peaks", "decode", "prefill", "train_step", "rl_iteration"):
        assert bench in by and all("error" not in r and "skipped" not in r for r in by[bench]), (bench, by.get(bench))
    rl = by["rl_iteration"][0]
    assert rl["rollout_share"] == pytest.approx(rl["rollout_s"] / rl["iteration_s"]) and "rollout share" in got.stderr
    check = [r for r in by["check"] if "peer" in r][-1]
    assert check["peer"] == "transformers+torch" and check["tokens_equal_frac"] >= 0.75, check
    assert check["first_loss_rel_diff"] < 0.02  # bf16 forward passes on both sides
    dec = next(r for r in by["peer"] if r["id"] == "decode/tiny/1")
    assert dec["ratio"] == pytest.approx(dec["tokens_per_s"] / dec["peer_tokens_per_s"])
    assert by["peer_device"][0]["torch"] and recs[-1]["bench"] == "targets"
    assert "| RL iteration" in (out / "summary.md").read_text() and (out / "log.txt").stat().st_size > 0
    assert any(cache.iterdir())  # the persistent compilation cache was written
    print(f"smoke wall {wall:.0f} s")


@pytest.mark.slow
def test_on_a_mesh(capsys):
    """Decode and the train step sharded over the 8 test devices as (data, fsdp, tensor) = (2, 2, 2)."""
    rc, recs, _ = _run(capsys, ["--smoke", "--no-peer", "--mesh", "2,2,2", "--only", "decode,train",
                                "--decode-batches", "4", "--train-rows", "8", "--micro-batches", "2",
                                "--compile-cache", "off"])
    dev, dec, train = recs[:3]
    assert rc == 0 and dev["devices"] == 8 and dev["mesh"] == [2, 2, 2]
    assert "error" not in dec and "error" not in train, (dec, train)
    assert dec["tokens_per_s"] > 0 and math.isfinite(train["first_loss"]) and train["rows"] == 8
