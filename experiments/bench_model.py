"""Prefill and decode throughput: jaxagent's KV-cache generate vs transformers' PyTorch `generate`.

    python -m experiments.bench_model --json                # CPU: ~10M Qwen3, jax vs torch, one JSON line

A regression guard on CPU; the accelerator benchmark (GPU/TPU: roofline, PyTorch on the same chip) is
`python -m experiments.bench_accel`.

CPU mode: both frameworks get identical random weights (a transformers Qwen3ForCausalLM is built,
saved, and read back with `weights.load`), the same prompts (no padding), greedy decoding of exactly
`--new-tokens` tokens (no stop token; torch with min_new_tokens). Prefill = time to first token
(jax: the same compiled program with max_new_tokens=0, i.e. the prompt forward; torch: generate with
max_new_tokens=1). Decode per step = (total - prefill) / (new_tokens - 1) for both (paired within a
round, then the median over `--repeats` rounds). Compile / warm-up time is excluded and reported
separately; timings are medians, `*_best_*` and `*_ratio_best` use the fastest run of each side (the
least disturbed by other processes). jax runs in this process; the PyTorch peer then runs in worker
processes at every thread count and OpenMP wait policy (`experiments.bench_common`): its prefill
figures come from the setting with the fastest median prefill (`torch_prefill_threads`,
`torch_prefill_omp_wait_policy`), its decode figures from the fastest median decode (`torch_threads`,
`omp_wait_policy`), every setting's times are in `torch_settings`, and its `*_best_*` figures are its
fastest run at any setting. The run's machine load is reported (`other_cores`, `loadavg_1m_*`); on a
busy machine (the rule in bench_common) the ratios are null and reported as `*_ratio*_busy`.
FLOPs count the matmuls (2 per weight per token) plus causal attention (2 x 2 x H x E per query-key
pair; `jaxagent.bench.roofline.forward_flops` with every position unembedded); `*_prefill_frac_peak`
divides the achieved prefill FLOP/s by the machine's f32 matmul peak,
`matmul_peak_gflops`: the best of the same square matmul through XLA with its default options
(`jax_default_matmul_peak_gflops`), through XLA with `jaxagent.xla_options.COMPILER_OPTIONS`
(`jax_matmul_peak_gflops`) and through torch's BLAS at each peer setting (`torch_matmul_peak_gflops`),
all in this run.

Legend: B batch, L prompt length, N new tokens, S cache slots.
"""
from __future__ import annotations

import argparse
import json
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
from jaxagent.bench.roofline import forward_flops
from jaxagent.models import weights
from jaxagent.models.config import PRESETS, Qwen3Config
from jaxagent.sampling import GREEDY, generate
from jaxagent.xla_options import COMPILER_OPTIONS


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak_gflops(n: int, repeats: int, dtype=jnp.float32, compiler_options=None) -> float:
    """Best-of-`repeats` GFLOP/s of a jitted n x n @ n x n matmul (2 n^3 FLOPs)."""
    k1, k2 = jax.random.split(jax.random.key(0))
    a, b = jax.random.normal(k1, (n, n), dtype), jax.random.normal(k2, (n, n), dtype)
    mm = jax.jit(jnp.matmul, compiler_options=compiler_options)
    mm(a, b).block_until_ready()
    best = min(_median_time(lambda: mm(a, b).block_until_ready(), 1) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def torch_matmul_peak_gflops(n: int, repeats: int) -> float:
    """The same square f32 matmul through torch (its BLAS), for reference."""
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    return 2 * n ** 3 / min(_median_time(lambda: torch.mm(a, b), 1) for _ in range(repeats)) / 1e9


def _jax_runner(params, cfg, prompt_BxL, new_tokens: int):
    """n -> runs generate with max_new_tokens=n: one compiled program for every n (it is traced)."""
    def run(n):
        out = generate(params, cfg, prompt_BxL, jax.random.key(0), max_new_tokens=n, max_steps=new_tokens,
                       sampler=GREEDY, stop_ids=())
        out.tokens.block_until_ready()
        return np.asarray(out.tokens)[:, :n]
    return run


def _torch_runner(model, prompt_BxL: np.ndarray):
    """n -> transformers greedy generate of exactly n new tokens (no eos, min_new_tokens=n)."""
    import torch

    ids = torch.tensor(np.asarray(prompt_BxL), dtype=torch.long)
    mask = torch.ones_like(ids)

    def run(n):
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        return out[:, ids.shape[1]:].numpy()
    return run


def time_runners(runners: dict, prefill_n: dict, new_tokens: int, repeats: int) -> dict:
    """Warm-up (compile) time, then prefill and full-generation timings, the frameworks interleaved
    within each repeat so that both see the same background load; median and min per quantity."""
    res = {}
    for name, run in runners.items():
        t0 = time.perf_counter()
        toks = run(new_tokens)
        if toks.shape[1] != new_tokens:
            raise RuntimeError(f"{name} generated {toks.shape[1]} tokens, expected {new_tokens}")
        res[name] = {"compile_s": time.perf_counter() - t0, "tokens": toks, "prefill": [], "total": []}
    for _ in range(repeats):
        for key, n in (("prefill", None), ("total", new_tokens)):
            for name, run in runners.items():
                t0 = time.perf_counter()
                run(prefill_n[name] if n is None else n)
                res[name][key].append(time.perf_counter() - t0)
    for r in res.values():
        for key in ("prefill", "total"):
            r[f"{key}_s"], r[f"{key}_min_s"] = statistics.median(r[key]), min(r[key])
        # decode time of each round: that round's full run minus its own prefill (paired under drifting load)
        decode = [t - p for t, p in zip(r["total"], r["prefill"])]
        r["decode_s"], r["decode_min_s"] = statistics.median(decode), min(decode)
    return res


def _hf_model(cfg: Qwen3Config, seed: int):
    import torch
    from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM

    torch.manual_seed(seed)
    hf_cfg = HFConfig.from_dict(cfg.to_hf_dict())
    return Qwen3ForCausalLM(hf_cfg).eval()


def _single_thread() -> None:
    """One compute thread for XLA; must run before jax creates its CPU client."""
    os.environ["XLA_FLAGS"] = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 "
                               + os.environ.get("XLA_FLAGS", "")).strip()


def peer_worker(spec: dict, threads: list[int]) -> dict:
    """Worker side (run by bench_common): the torch matmul peak and generate timings per thread count."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32).eval()
    prompt = np.asarray(spec["prompt"], np.int64)
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        peak = torch_matmul_peak_gflops(spec["matmul_n"], spec["repeats"])
        r = time_runners({"torch": _torch_runner(model, prompt)}, {"torch": 1}, spec["new_tokens"],
                         spec["repeats"])["torch"]
        out[t] = {"matmul_gflops": peak, "tokens": r["tokens"].tolist(),
                  **{k: r[k] for k in ("compile_s", "prefill_s", "prefill_min_s", "decode_s", "decode_min_s")}}
    return out


def run_cpu(args) -> dict:
    import torch

    torch.set_num_threads(1)  # this process only builds the weights with torch; the peer runs in workers
    cfg = Qwen3Config() if args.tiny else PRESETS[args.preset]
    model = _hf_model(cfg, args.seed)
    prompt = np.random.default_rng(args.seed).integers(0, cfg.vocab_size, (args.batch, args.prompt_len))
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        del model
        cfg_loaded, params = weights.load(d)
        if cfg_loaded != cfg:
            raise RuntimeError(f"config did not round-trip: {cfg_loaded} != {cfg}")
        jax_peaks = {"xla_default": matmul_peak_gflops(args.matmul_n, args.repeats),
                     "jaxagent_options": matmul_peak_gflops(args.matmul_n, args.repeats,
                                                            compiler_options=COMPILER_OPTIONS)}
        # time to first token: jax with max_new_tokens=0 (the prompt forward, same compiled program),
        # torch with max_new_tokens=1 (prompt forward + one argmax)
        jx = time_runners({"jax": _jax_runner(params, cfg, jnp.asarray(prompt, jnp.int32), args.new_tokens)},
                          {"jax": 0}, args.new_tokens, args.repeats)["jax"]
        spec = {"model_dir": d, "prompt": prompt.tolist(), "new_tokens": args.new_tokens,
                "repeats": args.repeats, "matmul_n": args.matmul_n}
        settings = peer_settings(len(args.meter.cpus), threads=args.threads)
        peer = run_peer_workers("experiments.bench_model", spec, settings)
    dec = pick_best({s: r["decode_s"] for s, r in peer.items()})
    pre = pick_best({s: r["prefill_s"] for s, r in peer.items()})
    tr = {"compile_s": peer[dec]["compile_s"], "decode_s": peer[dec]["decode_s"],
          "prefill_s": peer[pre]["prefill_s"], "prefill_min_s": min(r["prefill_min_s"] for r in peer.values()),
          "decode_min_s": min(r["decode_min_s"] for r in peer.values())}
    torch_peak = max(r["matmul_gflops"] for r in peer.values())
    peak = max(*jax_peaks.values(), torch_peak)  # the machine's best f32 matmul, whoever reaches it
    n_prompt = args.batch * args.prompt_len
    prefill_flops = forward_flops(cfg, args.batch, args.prompt_len, 0)
    steps = max(args.new_tokens - 1, 1)
    out = {"mode": "cpu", "preset": "tiny" if args.tiny else args.preset, "params": cfg.num_params(),
           "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
           "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab_size,
           "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
           "repeats": args.repeats, "jax_devices": str(jax.devices()[0].platform), "threads": args.threads,
           **setting_fields(dec), **setting_fields(pre, "torch_prefill_threads", "torch_prefill_omp_wait_policy"),
           "torch_settings": per_setting(peer, lambda r: {
               "prefill_ms": r["prefill_s"] * 1e3, "decode_ms_per_step": r["decode_s"] / steps * 1e3,
               "best_prefill_ms": r["prefill_min_s"] * 1e3, "best_decode_ms_per_step": r["decode_min_s"] / steps * 1e3,
               "compile_s": r["compile_s"], "matmul_gflops": r["matmul_gflops"]})}
    for name, r in (("jax", jx), ("torch", tr)):
        decode_s = r["decode_s"] / steps
        out[f"{name}_prefill_tok_s"] = n_prompt / r["prefill_s"]
        out[f"{name}_decode_tok_s"] = args.batch / decode_s
        out[f"{name}_decode_ms_per_step"] = decode_s * 1e3
        out[f"{name}_prefill_ms"] = r["prefill_s"] * 1e3
        out[f"{name}_prefill_frac_peak"] = prefill_flops / r["prefill_s"] / 1e9 / peak
        out[f"{name}_compile_s"] = r["compile_s"]
        out[f"{name}_best_prefill_ms"] = r["prefill_min_s"] * 1e3
        out[f"{name}_best_decode_ms_per_step"] = r["decode_min_s"] / steps * 1e3
    out["prefill_ratio"] = out["jax_prefill_tok_s"] / out["torch_prefill_tok_s"]
    out["decode_ratio"] = out["jax_decode_tok_s"] / out["torch_decode_tok_s"]
    out["prefill_ratio_best"] = out["torch_best_prefill_ms"] / out["jax_best_prefill_ms"]
    out["decode_ratio_best"] = out["torch_best_decode_ms_per_step"] / out["jax_best_decode_ms_per_step"]
    out["matmul_peak_gflops"] = peak
    out["jax_matmul_peak_gflops"] = jax_peaks["jaxagent_options"]
    out["jax_default_matmul_peak_gflops"] = jax_peaks["xla_default"]
    out["torch_matmul_peak_gflops"] = torch_peak
    out["greedy_tokens_agree"] = min(float((jx["tokens"] == np.asarray(r["tokens"])).mean()) for r in peer.values())
    out.update(args.meter.fields())
    return flag_busy(out, ("prefill_ratio", "decode_ratio", "prefill_ratio_best", "decode_ratio_best"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_model", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu (the only mode here); accelerators: python -m experiments.bench_accel")
    p.add_argument("--json", action="store_true", help="print exactly one JSON line (default: indented JSON)")
    p.add_argument("--preset", default="bench_10m", choices=sorted(PRESETS),
                   help="cpu mode: model shape from jaxagent.models.config.PRESETS (default: bench_10m)")
    p.add_argument("--tiny", action="store_true",
                   help="smoke test: the tiny preset with small batches/lengths")
    p.add_argument("--batch", type=int, default=16, help="cpu mode: batch size (default: 16)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per row (default: 128)")
    p.add_argument("--new-tokens", type=int, default=64, help="generated tokens per row (default: 64)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds (jax and torch alternate); medians and bests reported (default: 5)")
    p.add_argument("--matmul-n", type=int, default=2048,
                   help="cpu mode: side of the square f32 matmul that measures the peak (default: 2048)")
    p.add_argument("--threads", type=int, default=0, choices=(0, 1),
                   help="0: XLA's default CPU threading, the PyTorch peer at its best of 1..N threads; 1: both "
                        "single-threaded (XLA without its Eigen pool, the peer at 1 thread) (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and prompts (default: 0)")
    args = p.parse_args(argv)
    args.meter = LoadMeter()  # the run's load window starts here
    if args.threads == 1:
        _single_thread()
    if args.tiny:
        args.batch, args.prompt_len, args.new_tokens = min(args.batch, 4), min(args.prompt_len, 16), \
            min(args.new_tokens, 8)
        args.matmul_n = min(args.matmul_n, 256)
    for name in ("batch", "prompt_len", "new_tokens", "repeats", "matmul_n"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.device == "gpu":
        p.error("the accelerator benchmark is python -m experiments.bench_accel (GPU/TPU: roofline, PyTorch peer)")
    result = run_cpu(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
