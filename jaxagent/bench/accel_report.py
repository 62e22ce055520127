"""What the accelerator benchmark prints besides its JSON lines: one progress line per record (`summary`), and
at the end the performance targets (docs/performance.md) against what the run measured (`targets`: a record and
a Markdown table), each fraction against the datasheet's peak and against the chip's measured one.

Targets: 8B bf16 decode at batch 1 >= 0.75 of the HBM roofline; prefill at 2048 tokens >= 0.50 MFU (the first
model of the run); the train step >= 0.40 MFU; the RL iteration's rollout share printed (no target).
"""
from __future__ import annotations

import json
from typing import Iterable, Optional

from jaxagent.bench.accel_peer import positive

# (name, record filter, figure key, target)
TARGETS = (
    ("decode qwen3-8b batch 1: HBM roofline fraction", lambda r: r.get("id") == "decode/qwen3-8b/1",
     "hbm_roofline_frac", 0.75),
    ("prefill 2048 tokens: MFU", lambda r: r.get("bench") == "prefill" and r.get("context") == 2048, "mfu", 0.50),
    ("train step: MFU", lambda r: r.get("bench") == "train_step", "mfu", 0.40),
    ("RL iteration: rollout share of the iteration (a share, no peak)", lambda r: r.get("bench") == "rl_iteration",
     "rollout_share", None),
)
FIGURES = {"decode": ("ms_per_step", "tokens_per_s"), "prefill": ("tokens_per_s",),
           "train_step": ("step_s", "tokens_per_s"), "rl_iteration": ("iteration_s",)}  # what each progress line prints


def _fmt(v, f: str) -> str:
    return "n/a" if v is None else format(v, f)


def summary(rec: dict) -> str:
    """The progress line of a record."""
    b, what = rec["bench"], rec.get("model") or rec.get("rl_preset") or rec.get("id") or rec.get("device_kind")
    if "error" in rec or "skipped" in rec:
        why = "error: " + rec["error"] if "error" in rec else "skipped: " + rec["skipped"]
        return f"{b}{' ' + what if what else ''}: {why}"
    bad = [k for k in FIGURES.get(b, ()) if not positive(rec.get(k))]
    if bad:  # a time <= 0 or a missing count: no throughput is printed from it
        return f"{b} {what}: no throughput ({', '.join(bad)} missing or not > 0)"
    if b == "device":
        pool = rec.get("memory_pool_bytes")
        return (f"device: {rec['device_kind']} ({rec['platform']} x {rec['devices']}), jax {rec['jax']}, memory pool "
                f"{_fmt(pool and pool / 1e9, '.1f')} GB, datasheet {rec.get('spec_name') or 'unknown'}")
    if b == "peer_device" and rec.get("device") is None:
        return f"peer: {rec.get('peer_note')}"
    if b == "peer_device":
        return (f"peer: {rec.get('device')}, torch {rec.get('torch')}, transformers {rec.get('transformers')}, "
                f"{_fmt(rec.get('free_gb'), '.1f')} GB free at its start" + (f" ({rec['peer_note']})"
                                                                            if rec.get("peer_note") else ""))
    def both(k):
        return f"{_fmt(rec.get(k), '.2f')} (measured peak {_fmt(rec.get(k + '_measured_peak'), '.2f')})"
    if b == "peaks":
        return (f"peaks: bf16 matmul {rec['measured_tflops']:.0f} TFLOP/s (datasheet "
                f"{_fmt(rec.get('datasheet_tflops'), '.0f')}), copy {rec['measured_hbm_gbps']:.0f} GB/s (datasheet "
                f"{_fmt(rec.get('datasheet_hbm_gbps'), '.0f')})")
    if b == "decode":
        return (f"decode {what} batch {rec['batch']}: {rec['ms_per_step']:.2f} ms/step, {rec['tokens_per_s']:.0f} "
                f"tok/s, HBM roofline {both('hbm_roofline_frac')}")
    if b == "prefill":
        return f"prefill {what} {rec['batch']}x{rec['context']}: {rec['tokens_per_s']:.0f} tok/s, MFU {both('mfu')}"
    if b == "train_step":
        return (f"train {what}: {rec['step_s']:.3f} s/step, {rec['tokens_per_s']:.0f} tok/s, MFU {both('mfu')}")
    if b == "rl_iteration":
        return (f"rl {what}: {rec['iteration_s']:.2f} s, rollout share {rec['rollout_share']:.2f}, finished-episode "
                f"decode slots {_fmt(rec.get('decode_finished_share'), '.2f')}")
    if b == "peer":
        return (f"peer {rec['id']}: {_fmt(rec.get('peer_tokens_per_s'), '.0f')} tok/s ({rec.get('peer_setting')}), "
                f"ours / peer {_fmt(rec.get('ratio'), '.2f')}" if rec.get("peer") else
                f"peer {rec['id']}: {rec.get('peer_note')}")
    if b == "check" and "peer" not in rec:  # the JAX side's half, before the peer runs
        return f"check {what}: checkpoint written, greedy tokens and first loss {rec['first_loss']:.4f} (for the peer)"
    if b == "check":
        return (f"check {what}: greedy tokens equal {_fmt(rec.get('tokens_equal_frac'), '.2f')}, first loss "
                f"{_fmt(rec.get('first_loss'), '.4f')} vs peer {_fmt(rec.get('peer_first_loss'), '.4f')}")
    return f"{b}: {json.dumps({k: v for k, v in rec.items() if k != 'bench'})[:300]}"


def targets(records: Iterable[dict]) -> dict:
    """The `targets` record: per target its figure against the datasheet and the measured peak, and whether the
    datasheet figure meets it (None where the run has no such measurement)."""
    recs = [r for r in records if "error" not in r and "skipped" not in r]
    rows = []
    for name, match, key, goal in TARGETS:
        got: Optional[dict] = next((r for r in recs if match(r)), None)
        value = None if got is None else got.get(key)
        rows.append({"target": name, "goal": goal, "value": value, "measured_peak": None if got is None else
                     got.get(f"{key}_measured_peak"), "model": None if got is None else got.get("model")
                     or got.get("rl_preset"), "met": None if goal is None or value is None else value >= goal})
    device = next((r for r in records if r.get("bench") == "device"), {})
    return {"bench": "targets", "device_kind": device.get("device_kind"), "smoke_test": device.get("smoke_test"),
            "items": rows}


def markdown(rec: dict) -> str:
    """The targets record as a Markdown table."""
    lines = [f"Targets on {rec.get('device_kind')}" + (" (a CPU smoke test: no result)" if rec.get("smoke_test")
                                                          else "") + (f", from `{rec['command']}`" if rec.get("command")
                                                                      else ""), "",
             "| target | model | goal | against the datasheet peak | against the measured peak | met |",
             "|---|---|---|---|---|---|"]
    for r in rec["items"]:
        met = "-" if r["met"] is None else "yes" if r["met"] else "no"
        lines.append(f"| {r['target']} | {r['model'] or '-'} | {_fmt(r['goal'], '.2f')} | {_fmt(r['value'], '.3f')} | "
                     f"{_fmt(r['measured_peak'], '.3f')} | {met} |")
    return "\n".join(lines) + "\n"
