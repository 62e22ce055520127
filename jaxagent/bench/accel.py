"""Throughput on the accelerator JAX sees (GPU, TPU, or CPU for a smoke test): prefill, decode, the study's GRPO
train step and one RL iteration of a preset, each against its roofline and PyTorch on the same chip.

    python -m experiments.bench_accel                 # the default selection (sized for one H200 in < 10 min)
    python -m experiments.bench_accel --tiny --no-peer --peak-tflops 1 --hbm-gbps 10   # seconds, on CPU

On one H200, the prepared run (sized to end inside 10 minutes by its time budgets; JSON lines in the file, progress
in the log):

    PYTHONUNBUFFERED=1 timeout 600 python -m experiments.bench_accel > bench_h200.jsonl 2> bench_h200.log

Output: one JSON line per measurement on stdout, a progress line per step on stderr. The first line describes the
device (`bench: device`: its kind, JAX version, the vendor figures of `jaxagent.bench.devices` or none); then, in
this order, each with `bench` naming it:
  decode       per model and batch (`--decode-batches`): ms per step and tokens/s of greedy decoding over a cache
               filled to `--decode-context` tokens, the fraction of the HBM roofline, the peer's best setting and
               the ratio (ours / peer's tokens/s);
  prefill      per model and context (`--prefill-contexts`): tokens/s, MFU, the peer's and the ratio;
  train_step   the study's GRPO step at `--train-model` (micro-batches, remat, chunked log-probs, bf16 compute):
               tokens/s, MFU, memory, the peer's and the ratio;
  check        the PyTorch peer and jaxagent on one random checkpoint (`--check-model`): greedy tokens
               compared, first train-step losses compared;
  rl_iteration one iteration of `--rl-preset`'s shape (rollout + old log-probs + update): the time split, the
               share of decode slots spent on finished episodes (`jaxagent.bench.longtail`).
Measurement rules (`jaxagent.bench.measure`, `jaxagent.bench.timing`): each phase is timed on its own, blocked on
its output; `--warmup` calls first, then the median of `--repeats` with min, max and spread. Weights are random
(bf16 for decoding, f32 masters for training) unless `--checkpoint DIR` gives them. The run stops starting new
measurements after `--budget-s` seconds (each skipped one prints a record saying so; the RL iteration, whose
compiles are the longest, starts only with RL_MIN_S of it left), and an error in one
measurement is printed as its record's `error` and the run goes on. Argument errors exit 2 with one line.

The PyTorch peer (`experiments/peers/torch_accel.py`, transformers + torch) runs first, in its own process, so the
two never share the chip's memory; without torch (or with `--no-peer`) the records carry no peer fields. On a CPU
host every record says `smoke_test: true`: the run checks the code paths and the arithmetic, and its ratios are no
result (the CPU comparisons are `bench_model` and `bench_train`, with the peer tuned and the machine's load recorded).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from typing import Callable, Optional

from jaxagent.bench.accel_plan import Plan

RL_MIN_S = 180.0  # budget the RL iteration must find left to start


# ----------------------------------------------------------------------------- the peer
def model_cfg(plan: Plan, name: str):
    from jaxagent.bench.models import model_config
    from jaxagent.models.config import Qwen3Config
    if plan.checkpoint is not None and name != plan.check_model:
        return Qwen3Config.from_dir(plan.checkpoint)
    return model_config(name)


def peer_items(plan: Plan, check_dir: str) -> list:
    """The peer's work list, in the order of the JAX side (ids match the records)."""
    items, common = [], {"repeats": plan.repeats, "warmup": plan.warmup, "seed": plan.seed}
    if "check" in plan.parts and plan.check_model:
        cfg = model_cfg(plan, plan.check_model)
        items.append({"id": "check", "kind": "check", "model": cfg.to_hf_dict(), "dir": check_dir, **check_shape(plan),
                      "seed": plan.seed})
    for name in plan.models:
        hf = model_cfg(plan, name).to_hf_dict()
        if "decode" in plan.parts:
            # transformers' compiled static-cache decode recompiles per batch size (about a minute each for 8B):
            # tried at the smallest and the largest batch, the eager dynamic cache at every one
            ends = (min(plan.decode_batches), max(plan.decode_batches))
            items += [{"id": f"decode/{name}/{b}", "kind": "decode", "model": hf, "batch": b,
                       "context": plan.decode_context, "steps": plan.decode_steps,
                       "settings": ["dynamic", "static"] if b in ends else ["dynamic"], **common}
                      for b in plan.decode_batches]
        if "prefill" in plan.parts:
            items += [{"id": f"prefill/{name}/{c}", "kind": "prefill", "model": hf,
                       "batch": max(1, plan.prefill_tokens // c), "context": c, **common}
                      for c in plan.prefill_contexts]
    if "train" in plan.parts and plan.train_model:
        items.append({"id": "train", "kind": "train", "model": model_cfg(plan, plan.train_model).to_hf_dict(),
                      "rows": plan.train_rows, "seq": plan.train_seq, "prompt": plan.train_prompt,
                      "micro_batches": plan.micro_batches, **common})
    return items


def check_shape(plan: Plan) -> dict:
    tiny = plan.check_model == "tiny"
    return {"prompt_rows": 4, "prompt_len": 16 if tiny else 64, "new_tokens": 8 if tiny else 16,
            "rows": 2 if tiny else 8, "seq": 32 if tiny else 512, "prompt": 8 if tiny else 128, "micro_batches": 1}


def peer_fields(peer: dict, pid: str, ours: Optional[float], key: str = "tokens_per_s") -> dict:
    """The peer's best figure beside ours, and the ratio ours / peer's (> 1: jaxagent faster)."""
    if peer is None:  # --no-peer
        return {}
    r = peer.get(pid)
    if r is None:
        return {"peer": None, "peer_note": peer.get("_note", "no peer run")}
    if "error" in r or "skipped" in r:
        return {"peer": None, "peer_note": r.get("error") or r.get("skipped"), "peer_settings": r.get("settings")}
    theirs = r.get(key)
    return {"peer": "transformers+torch", "peer_setting": r.get("best"), f"peer_{key}": theirs,
            "peer_time_spread": r.get("time_spread"),
            "peer_settings": {k: {kk: v[kk] for kk in (key, "time_s", "error") if kk in v}
                              for k, v in r.get("settings", {}).items()},
            "ratio": (ours / theirs) if positive(ours) and positive(theirs) else None}



# ----------------------------------------------------------------------------- the JAX side
def params_for(plan: Plan, cfg, dtype, mesh, key_offset: int = 0):
    import jax

    from jaxagent.models import qwen3, weights
    from jaxagent.study.stages import place_params
    if plan.checkpoint is not None:
        _, params = weights.load(plan.checkpoint, dtype=dtype, mesh=mesh)
        return params
    return place_params(qwen3.init(cfg, jax.random.key(plan.seed + key_offset), dtype), cfg, mesh)


def run(plan: Plan, emit: Callable, log: Callable, *, run_peer: Callable, rl_record: Callable) -> None:
    """The run: the peer first (`run_peer(items, budget_s, log)`: `experiments.peers.torch_accel.run_peer`), then each
    measurement as one record passed to `emit`, progress lines to `log`; `rl_record(plan, tmp, log)` times the RL
    iteration (`jaxagent.bench.accel_rl.rl_runner`)."""
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        check_dir = os.path.join(tmp, "check_model")
        peer = None
        if plan.peer:
            items = peer_items(plan, check_dir)
            log(f"peer: {len(items)} items, budget {plan.peer_budget_s:.0f} s")
            peer = run_peer(items, plan.peer_budget_s, log)
        # JAX claims the chip from here on (after the peer's process has exited)
        import jax
        import jax.numpy as jnp

        from jaxagent import sharding
        from jaxagent.bench import measure
        from jaxagent.bench.devices import custom_spec, device_spec
        from jaxagent.study import stages

        dev = jax.devices()[0]
        spec = (custom_spec(plan.peak_tflops, plan.hbm_gbps) if plan.peak_tflops is not None
                else device_spec(dev.device_kind))
        # on a CPU host the run checks the code paths; its peer ratios are no result (the CPU comparisons, with
        # the peer at its best thread setting and the machine's load recorded, are bench_model and bench_train)
        common = {"device_kind": dev.device_kind, "platform": dev.platform, "devices": jax.device_count(),
                  "smoke_test": dev.platform == "cpu"}
        info = (peer or {}).get("_info")
        emit({"bench": "device", **common, "jax": jax.__version__, "mesh": list(plan.mesh or (1, 1, 1)),
              **(spec.fields() if spec else {"spec_name": None}),
              "roofline_note": None if spec else f"device kind {dev.device_kind!r} is not in jaxagent.bench.devices: "
              "figures without roofline fractions (give --peak-tflops and --hbm-gbps to add them)",
              **({"peer_device": info["device"], "torch": info["torch"], "transformers": info["transformers"]}
                 if info else {"peer_note": "--no-peer" if peer is None else peer.get("_note", "nothing to run")})})
        mesh = None if not plan.mesh or tuple(plan.mesh) == (1, 1, 1) else sharding.make_mesh(*plan.mesh)

        def step(name: str, fn: Callable[[], dict], fields: dict):
            if time.perf_counter() - t_start > plan.budget_s:
                rec = {"bench": name, **fields, "skipped": f"the run's time budget ({plan.budget_s:g} s) is spent"}
            else:
                t0 = time.perf_counter()
                try:
                    rec = {"bench": name, **fields, **fn()}
                except Exception as err:  # noqa: BLE001 -- one failing measurement (OOM, a missing file) ends itself
                    rec = {"bench": name, **fields, "error": f"{type(err).__name__}: {str(err)[:500]}"}
                rec["wall_s"] = time.perf_counter() - t0
            rec.update(common, elapsed_s=time.perf_counter() - t_start)
            emit(rec)
            return rec

        for name in plan.models:
            cfg = model_cfg(plan, name)
            holder = {}

            def params(cfg=cfg, holder=holder):
                if "p" not in holder:
                    holder["p"] = params_for(plan, cfg, jnp.bfloat16, mesh)
                return holder["p"]
            if "decode" in plan.parts:
                for b in plan.decode_batches:
                    step("decode", lambda b=b, cfg=cfg, name=name: with_peer(measure.decode_steps(
                        measure.decoding_params(params(), cfg, jnp.bfloat16, mesh), cfg, batch=b,
                        context=plan.decode_context, steps=plan.decode_steps, repeats=plan.repeats,
                        warmup=plan.warmup, spec=spec, mesh=mesh, seed=plan.seed), peer, f"decode/{name}/{b}"),
                        {"model": name})
            if "prefill" in plan.parts:
                for c in plan.prefill_contexts:
                    step("prefill", lambda c=c, cfg=cfg, name=name: with_peer(measure.prefill(
                        measure.decoding_params(params(), cfg, jnp.bfloat16, mesh), cfg,
                        batch=max(1, plan.prefill_tokens // c), context=c, repeats=plan.repeats, warmup=plan.warmup,
                        spec=spec, mesh=mesh, seed=plan.seed), peer, f"prefill/{name}/{c}"), {"model": name})
            holder.clear()
        if "train" in plan.parts and plan.train_model:
            step("train_step", lambda: train(plan, peer, spec, mesh, measure, stages),
                 {"model": plan.train_model, "micro_batches": plan.micro_batches, "remat": plan.remat,
                  "compute_dtype": "bfloat16"})
        if "check" in plan.parts and plan.check_model:
            step("check", lambda: check(plan, peer, check_dir, measure, stages), {"model": plan.check_model})
        if "rl" in plan.parts and plan.rl_preset:
            # its compiles (rollout and train step) are the run's longest: it starts only with RL_MIN_S left
            left = plan.budget_s - (time.perf_counter() - t_start)
            if left < min(RL_MIN_S, plan.budget_s):
                emit({"bench": "rl_iteration", "rl_preset": plan.rl_preset, **common,
                      "skipped": f"{left:.0f} s of the run's budget left, under {RL_MIN_S:g} s"})
            else:
                step("rl_iteration", lambda: rl_record(plan, tmp, log), {"rl_preset": plan.rl_preset})


def with_peer(rec: dict, peer, pid: str) -> dict:
    return {**rec, **peer_fields(peer, pid, rec.get("tokens_per_s"))}


def train(plan: Plan, peer, spec, mesh, measure, stages) -> dict:
    import jax.numpy as jnp
    cfg = model_cfg(plan, plan.train_model)
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6)
    arm_step = stages.make_arm_step(cfg, arm, mesh=mesh, compute_dtype="bfloat16", micro_batches=plan.micro_batches,
                                    remat=plan.remat)
    rec = measure.train_step(cfg, params_for(plan, cfg, jnp.float32, mesh), arm_step, rows=plan.train_rows,
                             seq=plan.train_seq, prompt=plan.train_prompt, repeats=plan.repeats, warmup=plan.warmup,
                             spec=spec, mesh=mesh, seed=plan.seed)
    return {**rec, **peer_fields(peer, "train", rec["tokens_per_s"])}


def check(plan: Plan, peer, check_dir: str, measure, stages) -> dict:
    """Greedy tokens and the first loss of both sides on the peer's random checkpoint."""
    import jax.numpy as jnp

    from jaxagent.bench.data import prompts
    from jaxagent.models import weights
    r = (peer or {}).get("check")
    if r is None or "error" in r or "skipped" in r:
        note = "--no-peer" if peer is None else (r or {}).get("error") or (r or {}).get("skipped") or peer.get("_note")
        return {"peer": None, "peer_note": note}
    cfg, params = weights.load(check_dir)
    shape = check_shape(plan)
    toks = measure.greedy_tokens(measure.decoding_params(params, cfg, jnp.bfloat16), cfg,
                                 prompts(cfg.vocab_size, shape["prompt_rows"], shape["prompt_len"], plan.seed),
                                 shape["new_tokens"])
    arm_step = stages.make_arm_step(cfg, stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6),
                                    compute_dtype="bfloat16", micro_batches=shape["micro_batches"])
    ours = measure.train_step(cfg, params, arm_step, rows=shape["rows"], seq=shape["seq"], prompt=shape["prompt"],
                              repeats=1, warmup=0, seed=plan.seed)["first_loss"]
    return {"peer": "transformers+torch", **measure.agreement(toks, r["greedy_tokens"]), "greedy_tokens": toks.tolist(),
            "peer_greedy_tokens": r["greedy_tokens"], "first_loss": ours, "peer_first_loss": r["first_loss"],
            "first_loss_abs_diff": abs(ours - r["first_loss"]),
            "first_loss_rel_diff": abs(ours - r["first_loss"]) / max(abs(r["first_loss"]), 1e-12)}


FIGURES = {"decode": ("ms_per_step", "tokens_per_s"), "prefill": ("tokens_per_s",),
           "train_step": ("step_s", "tokens_per_s"), "rl_iteration": ("iteration_s",)}  # what each progress line prints


def positive(v) -> bool:
    """Whether `v` is a finite number > 0 (a time or a throughput that can be printed)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def summary(rec: dict) -> str:
    """The progress line of a record."""
    b, what = rec["bench"], rec.get("model") or rec.get("rl_preset") or rec.get("device_kind")
    if "error" in rec or "skipped" in rec:
        return f"{b} {what}: " + ("error: " + rec["error"] if "error" in rec else rec["skipped"])
    bad = [k for k in FIGURES.get(b, ()) if not positive(rec.get(k))]
    if bad:  # a time <= 0 or a missing count: no throughput is printed from it
        return f"{b} {what}: no throughput ({', '.join(bad)} missing or not > 0)"
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    vs = f", vs peer {fmt(rec['ratio'], '.2f')}x" if "ratio" in rec else ""
    if b == "decode":
        return (f"decode {what} batch {rec['batch']}: {rec['ms_per_step']:.2f} ms/step, "
                f"{rec['tokens_per_s']:.0f} tok/s, "
                f"HBM roofline {fmt(rec['hbm_roofline_frac'], '.2f')}{vs}")
    if b == "prefill":
        return (f"prefill {what} {rec['batch']}x{rec['context']}: {rec['tokens_per_s']:.0f} tok/s, "
                f"MFU {fmt(rec['mfu'], '.2f')}{vs}")
    if b == "train_step":
        return (f"train {what}: {rec['step_s']:.3f} s/step, {rec['tokens_per_s']:.0f} tok/s, "
                f"MFU {fmt(rec['mfu'], '.2f')}{vs}")
    if b == "rl_iteration":
        return (f"rl {what}: {rec['iteration_s']:.2f} s, rollout share {rec['rollout_share']:.2f}, finished-episode "
                f"decode slots {fmt(rec['decode_finished_share'], '.2f')}")
    if b == "check":
        return (f"check {what}: greedy tokens equal {fmt(rec.get('tokens_equal_frac'), '.2f')}, first loss "
                f"{fmt(rec.get('first_loss'), '.4f')} vs peer {fmt(rec.get('peer_first_loss'), '.4f')}")
    return f"{b}: {json.dumps({k: v for k, v in rec.items() if k != 'bench'})[:300]}"
