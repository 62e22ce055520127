"""RL train-step throughput: jaxagent's jitted PPO-clip step vs the same step written in PyTorch
(`experiments.peers.torch_train`); the command line is `python -m experiments.bench_train` (`run_cpu`). A regression
guard on CPU; the accelerator benchmark (the study's GRPO step, MFU, memory) is `experiments.bench_accel`.

One train step = forward over B x T tokens, per-token log-probs of the taken tokens, the PPO-clip token-mean loss
on the policy tokens (clip 0.2 / 0.28, DAPO clip-higher), backward, global-norm clipping to 1.0, and an AdamW
update (lr 1e-6, weight decay 0.01); both sides skip a step with a non-finite gradient norm. Both get identical
weights and batch in f32; step time is the median of `--steps` timed steps (compile and warm-up excluded), tokens/s
= B x T / step time, and the first-step losses of both are reported (they should agree to float32 rounding).
Model FLOPs per step (PaLM's MFU convention, Chowdhery et al. 2022, App. B): 6 x N_matmul x B x T + 12 x L x H x E
x T x B x T, N_matmul = the matmul weights incl. the unembedding (`jaxagent.bench.roofline.train_flops`);
`*_frac_peak` = achieved FLOP/s / the best f32 matmul GFLOP/s of this run. The peer's settings, the busy rule and
the JSON fields: docs/performance.md, "What bench_train compares".

Legend: B batch rows, T tokens per row, L layers, H query heads, E head dim, V vocab, D width.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.bench.harness import flag_busy, jax_matmul_gflops, peer_settings, per_setting, pick_best, setting_fields
from jaxagent.bench.roofline import train_flops
from jaxagent.models import qwen3
from jaxagent.models.config import PRESETS, Qwen3Config
from jaxagent.rl import logprobs as logprobs_lib
from jaxagent.rl import optim, train_state
from jaxagent.rl import train_step as ts
from jaxagent.rl.memory_plan import MemoryPlan

LR, WD, MAX_NORM = 1e-6, 0.01, 1.0
CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # DAPO clip-higher; the peer's `experiments.peers.torch_grpo` uses the same


def _median(times):
    return statistics.median(times)


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
    step = ts.build_train_step(cfg, tx, train_state.LossSettings(clip_low=CLIP_LOW, clip_high=CLIP_HIGH),
                               MemoryPlan(micro_batches=micro_batches, compute_dtype=compute_dtype))
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



# ----------------------------------------------------------------------------- modes
def run_cpu(args, run_peer: Optional[Callable] = None) -> dict:
    """One run: `args` holds the command line's settings (tiny, preset, batch, seq, prompt, steps, warmup,
    micro_batches, threads, matmul_n, matmul_repeats, seed, meter: a `LoadMeter` started with the run);
    `run_peer(cfg, params, batch_np, spec, settings)` gives the PyTorch peer's result per setting, None: no peer."""
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
    out = {"bench": "train_step", "device": "cpu", "backend": jax.devices()[0].platform,
           "preset": "tiny" if args.tiny else (args.preset or "bench_10m"),
           "params": cfg.num_params(), "batch": b, "seq": t, "prompt": prompt,
           "policy_tokens": int(batch_np["policy_mask"].sum()), "threads": args.threads or len(args.meter.cpus),
           "model_gflops_per_step": flops / 1e9, "jax_matmul_gflops": peak_jax}
    j = bench_jax(cfg, params, batch_np, args.steps, args.warmup, args.micro_batches)
    out.update(jax_step_s=j["step_s"], jax_tokens_per_s=b * t / j["step_s"],
               jax_compile_s=j["compile_s"], jax_first_loss=j["first_loss"])
    peak = peak_jax
    if run_peer is not None:
        spec = {"steps": args.steps, "warmup": args.warmup, "matmul_n": args.matmul_n,
                "matmul_repeats": args.matmul_repeats}
        peer = run_peer(cfg, params, batch_np, spec, peer_settings(len(args.meter.cpus), threads=args.threads))
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
