"""RL train-step throughput: jaxagent's jitted PPO-clip step vs the same step written in PyTorch.

    python -m experiments.bench_train --json                # CPU: ~10M Qwen3, jax vs torch, one JSON line

A regression guard on CPU; the accelerator benchmark (the study's GRPO step with micro-batches and remat, MFU,
memory, PyTorch on the same chip) is `python -m experiments.bench_accel`.

One train step = forward over B x T tokens, per-token log-probs of the taken tokens, the PPO-clip
token-mean loss on the policy tokens (clip 0.2 / 0.28, DAPO clip-higher), backward, global-norm
clipping to 1.0, and an AdamW update (lr 1e-6, weight decay 0.01); both sides also compute the
entropy, clip fraction and sampler drift metrics, and both skip a step with a non-finite gradient
norm (jax: `optim.make_optimizer`'s guard; torch: `if isfinite(norm): opt.step()`).

CPU mode: both frameworks get identical weights (jax params written with `weights.save` and read by
transformers' `Qwen3ForCausalLM.from_pretrained`, default sdpa attention), the same batch (first
`--prompt` tokens of each row are prompt, the rest policy tokens), f32. Compile / warm-up steps
are excluded; step time is the median of `--steps` timed steps. tokens/s = B x T / step time.
The first-step losses of both sides are reported (same weights and batch: they should agree to
float32 rounding). jax runs in this process; the PyTorch step then runs in worker processes, from the
same initial weights, at every thread count and OpenMP wait policy (`experiments.bench_common`): the
setting with the fastest median step is reported (`torch_threads`, `omp_wait_policy`), every setting's
step time in `torch_settings`. The run's machine load is reported (`other_cores`, `loadavg_1m_*`); on
a busy machine (the rule in bench_common) `train_ratio` is null and reported as `train_ratio_busy`.
Model FLOPs per step (PaLM's MFU convention, Chowdhery et al. 2022, App. B):
6 x N_matmul x B x T + 12 x L x H x E x T x B x T, with N_matmul = the matmul weights incl. the
unembedding (`jaxagent.bench.roofline.train_flops`); `*_frac_peak` = achieved FLOP/s / the best f32 matmul
GFLOP/s measured in this run
(max of jax's and torch's n x n matmul).

Legend: B batch rows, T tokens per row, L layers, H query heads, E head dim, V vocab, D width.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench_common import (LoadMeter, flag_busy, peer_settings, per_setting, pick_best,
                                     run_peer_workers, setting_fields)
from experiments.bench_model import matmul_peak_gflops
from experiments.peers.torch_grpo import CLIP_HIGH, CLIP_LOW, ppo_clip_terms
from jaxagent.bench.roofline import train_flops
from jaxagent.models import qwen3, weights
from jaxagent.models.config import PRESETS, Qwen3Config
from jaxagent.rl import optim, train_state
from jaxagent.rl import train_step as ts
from jaxagent.rl import logprobs as logprobs_lib
from jaxagent.xla_options import COMPILER_OPTIONS

LR, WD, MAX_NORM = 1e-6, 0.01, 1.0


def _median(times):
    return statistics.median(times)


def jax_matmul_gflops(n: int, repeats: int) -> float:
    """Best f32 n x n matmul GFLOP/s through XLA, with its default options and with jaxagent's."""
    return max(matmul_peak_gflops(n, repeats, compiler_options=o) for o in (None, COMPILER_OPTIONS))


def torch_matmul_gflops(n: int, repeats: int) -> float:
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def make_batch(cfg: Qwen3Config, batch: int, seq: int, prompt: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.broadcast_to(np.arange(seq)[None] >= prompt, (batch, seq))
    return {"tokens": rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32),
            "policy_mask": np.ascontiguousarray(mask),
            "advantages": rng.normal(size=(batch, seq)).astype(np.float32)}


# ----------------------------------------------------------------------------- jax
def bench_jax(cfg, params, batch_np, steps: int, warmup: int, micro_batches: int = 1,
              compute_dtype=None) -> dict:
    tx = optim.make_optimizer(LR, weight_decay=WD, max_grad_norm=MAX_NORM)
    state = train_state.init_train_state(cfg, tx, jax.random.key(0), params=params)
    step = ts.make_train_step(cfg, tx, train_state.LossSettings(clip_low=CLIP_LOW, clip_high=CLIP_HIGH),
                              micro_batches=micro_batches, compute_dtype=compute_dtype)
    batch = {k: jnp.asarray(v) for k, v in batch_np.items()}
    t0 = time.perf_counter()
    state, m = step(state, batch)
    first_loss = float(m["loss"])
    compile_s = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        state, m = step(state, batch)
    jax.block_until_ready(state.params)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready((state.params, m))
        times.append(time.perf_counter() - t0)
    return {"step_s": _median(times), "compile_s": compile_s, "first_loss": first_loss,
            "skipped": float(m["skipped_total"])}


# ----------------------------------------------------------------------------- torch
def torch_model_from(model_dir: str):
    """The PyTorch model from a `weights.save` directory, in training mode."""
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.train()
    return model


def bench_torch(model, batch_np, steps: int, warmup: int, threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    tokens = torch.from_numpy(batch_np["tokens"]).long()
    mask = torch.from_numpy(batch_np["policy_mask"].astype(np.float32))
    adv = torch.from_numpy(batch_np["advantages"])
    old = torch.from_numpy(batch_np["old_logprobs"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=WD)

    def step():
        logits = model(input_ids=tokens, use_cache=False).logits
        loss_sum, n, metrics = ppo_clip_terms(logits, tokens, old, adv, mask)  # metrics: the jax step's work too
        loss = loss_sum / n.clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if torch.isfinite(norm):
            opt.step()
        return float(loss.detach()), metrics

    first_loss, _ = step()
    for _ in range(max(warmup - 1, 0)):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"step_s": _median(times), "min_step_s": min(times), "first_loss": first_loss}


def peer_worker(spec: dict, threads: list[int]) -> dict:
    """Worker side (run by bench_common): per thread count, the torch matmul peak and the train step
    from the saved initial weights."""
    import torch

    with np.load(spec["batch_npz"]) as f:
        batch_np = {k: f[k] for k in f.files}
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        peak = torch_matmul_gflops(spec["matmul_n"], spec["matmul_repeats"])
        r = bench_torch(torch_model_from(spec["model_dir"]), batch_np, spec["steps"], spec["warmup"], t)
        out[t] = {"matmul_gflops": peak, **r}
    return out


# ----------------------------------------------------------------------------- modes
def run_cpu(args) -> dict:
    cfg = PRESETS["tiny"] if args.tiny else PRESETS[args.preset or "bench_10m"]
    b, t = (2, 32) if args.tiny else (args.batch, args.seq)
    prompt = min(args.prompt, t // 2)
    params = qwen3.init(cfg, jax.random.key(args.seed))
    batch_np = make_batch(cfg, b, t, prompt, args.seed)
    # realistic old log-probs: the current policy's, plus sampler noise
    logp = jax.jit(lambda p, x: logprobs_lib.token_logprobs(p, cfg, x))(params, jnp.asarray(batch_np["tokens"]))
    rng = np.random.default_rng(args.seed + 1)
    batch_np["old_logprobs"] = (np.asarray(logp) + 0.05 * rng.normal(size=(b, t))).astype(np.float32)
    flops = train_flops(cfg, b, t)
    peak_jax = jax_matmul_gflops(args.matmul_n, args.matmul_repeats)
    out = {"bench": "train_step", "device": "cpu", "backend": jax.default_backend(),
           "preset": "tiny" if args.tiny else (args.preset or "bench_10m"),
           "params": cfg.num_params(), "batch": b, "seq": t, "prompt": prompt,
           "policy_tokens": int(batch_np["policy_mask"].sum()), "threads": args.threads or len(args.meter.cpus),
           "model_gflops_per_step": flops / 1e9, "jax_matmul_gflops": peak_jax}
    j = bench_jax(cfg, params, batch_np, args.steps, args.warmup, args.micro_batches)
    out.update(jax_step_s=j["step_s"], jax_tokens_per_s=b * t / j["step_s"],
               jax_compile_s=j["compile_s"], jax_first_loss=j["first_loss"])
    peak = peak_jax
    if not args.no_torch:
        with tempfile.TemporaryDirectory() as d:
            weights.save(os.path.join(d, "model"), cfg, params)
            np.savez(os.path.join(d, "batch.npz"), **batch_np)
            spec = {"model_dir": os.path.join(d, "model"), "batch_npz": os.path.join(d, "batch.npz"),
                    "steps": args.steps, "warmup": args.warmup, "matmul_n": args.matmul_n,
                    "matmul_repeats": args.matmul_repeats}
            peer = run_peer_workers("experiments.bench_train", spec,
                                    peer_settings(len(args.meter.cpus), threads=args.threads))
        best = pick_best({s: r["step_s"] for s, r in peer.items()})
        tr = peer[best]
        peak_torch = max(r["matmul_gflops"] for r in peer.values())
        peak = max(peak_jax, peak_torch)
        out.update(threads=best.threads, **setting_fields(best),
                   torch_settings=per_setting(peer, lambda r: {"step_s": r["step_s"], "min_step_s": r["min_step_s"],
                                                               "matmul_gflops": r["matmul_gflops"]}),
                   torch_matmul_gflops=peak_torch, torch_step_s=tr["step_s"],
                   torch_tokens_per_s=b * t / tr["step_s"], torch_first_loss=tr["first_loss"],
                   first_loss_abs_diff=abs(tr["first_loss"] - j["first_loss"]),
                   train_ratio=tr["step_s"] / j["step_s"],
                   torch_frac_peak=flops / tr["step_s"] / (peak * 1e9))
    out.update(peak_gflops=peak, jax_frac_peak=flops / j["step_s"] / (peak * 1e9))
    out.update(args.meter.fields())
    return flag_busy(out, ("train_ratio",))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu (the only mode here); accelerators: python -m experiments.bench_accel")
    p.add_argument("--tiny", action="store_true",
                   help="tiny model and shapes (2 x 32): a smoke test in seconds")
    p.add_argument("--preset", default=None,
                   help="model preset from jaxagent.models.config.PRESETS (default bench_10m)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default: 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default: 256)")
    p.add_argument("--prompt", type=int, default=64,
                   help="leading prompt tokens per row, outside the loss mask (default 64)")
    p.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps before timing, the first one compiles (default 2)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="gradient-accumulation micro-batches of the jax step (default 1)")
    p.add_argument("--threads", type=int, default=0,
                   help="cpu: torch intra-op threads of the PyTorch peer; 0: its best of 1..N (default 0)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch side (cpu mode)")
    p.add_argument("--matmul-n", type=int, default=1024,
                   help="size of the n x n f32 matmul that measures the peak (default 1024)")
    p.add_argument("--matmul-repeats", type=int, default=5, help="best-of repeats of that matmul")
    p.add_argument("--seed", type=int, default=0, help="weights and batch seed")
    args = p.parse_args(argv)
    args.meter = LoadMeter()  # the run's load window starts here
    if args.batch is None:
        args.batch = 8
    if args.seq is None:
        args.seq = 256
    for name in ("batch", "seq", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.device == "gpu":
        p.error("the accelerator benchmark is python -m experiments.bench_accel (GPU/TPU: roofline, PyTorch peer)")
    if args.preset is not None and args.preset not in PRESETS:
        p.error(f"unknown --preset {args.preset!r}; valid: {', '.join(PRESETS)}")
    result = run_cpu(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
