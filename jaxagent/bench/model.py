"""Prefill and decode throughput: jaxagent's KV-cache generate vs transformers' PyTorch `generate`
(`experiments.peers.torch_model`); the command line is `python -m experiments.bench_model` (`run_cpu`). A regression
guard on CPU; the accelerator benchmark (GPU/TPU: roofline, PyTorch on the same chip) is `experiments.bench_accel`.

Both frameworks get identical random weights, the same prompts and greedy decoding of exactly `--new-tokens`
tokens. Prefill = time to first token; decode per step = (total - prefill) / (new_tokens - 1), paired within a
round, then the median over `--repeats` rounds; compile and warm-up are excluded. The PyTorch peer runs at every
thread count and OpenMP wait policy, and a busy machine nulls the ratios (`jaxagent.bench.harness`). FLOPs count the
matmuls (2 per weight per token) plus causal attention (2 x 2 x H x E per query-key pair;
`jaxagent.bench.roofline.forward_flops`); `*_prefill_frac_peak` = achieved prefill FLOP/s / `matmul_peak_gflops`,
the best f32 square matmul measured in this run. Each side's timing and the JSON fields: docs/performance.md,
"What bench_model compares".

Legend: B batch, L prompt length, N new tokens, S cache slots.
"""
from __future__ import annotations

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.bench.harness import flag_busy, matmul_peak_gflops, per_setting, peer_settings, pick_best, setting_fields
from jaxagent.bench.roofline import forward_flops
from jaxagent.models import weights
from jaxagent.models.config import PRESETS, Qwen3Config
from jaxagent.sampling import GREEDY, generate
from jaxagent.xla_options import DECODING_CPU_OPTIONS


def jax_runner(params, cfg, prompt_BxL, new_tokens: int):
    """n -> runs generate with max_new_tokens=n: one compiled program for every n (it is traced)."""
    def run(n):
        out = generate(params, cfg, prompt_BxL, jax.random.key(0), max_new_tokens=n, max_steps=new_tokens,
                       sampler=GREEDY, stop_ids=())
        out.tokens.block_until_ready()
        return np.asarray(out.tokens)[:, :n]
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


def run_cpu(args, peer) -> dict:
    """One run: `args` holds the command line's settings (tiny, preset, batch, prompt_len, new_tokens, repeats,
    matmul_n, threads, seed, meter: a `LoadMeter` started with the run); `peer` writes the random checkpoint both
    sides load (`peer.write_checkpoint(cfg, seed, dir)`) and times its side per setting
    (`peer.run_peer(spec, settings)`: `experiments.peers.torch_model`)."""
    cfg = Qwen3Config() if args.tiny else PRESETS[args.preset]
    prompt = np.random.default_rng(args.seed).integers(0, cfg.vocab_size, (args.batch, args.prompt_len))
    with tempfile.TemporaryDirectory() as d:
        peer.write_checkpoint(cfg, args.seed, d)
        cfg_loaded, params = weights.load(d)
        if cfg_loaded != cfg:
            raise RuntimeError(f"config did not round-trip: {cfg_loaded} != {cfg}")
        jax_peaks = {"xla_default": matmul_peak_gflops(args.matmul_n, args.repeats),
                     "jaxagent_options": matmul_peak_gflops(args.matmul_n, args.repeats,
                                                            compiler_options=DECODING_CPU_OPTIONS)}
        # time to first token: jax with max_new_tokens=0 (the prompt forward, same compiled program),
        # torch with max_new_tokens=1 (prompt forward + one argmax)
        jx = time_runners({"jax": jax_runner(params, cfg, jnp.asarray(prompt, jnp.int32), args.new_tokens)},
                          {"jax": 0}, args.new_tokens, args.repeats)["jax"]
        spec = {"model_dir": d, "prompt": prompt.tolist(), "new_tokens": args.new_tokens,
                "repeats": args.repeats, "matmul_n": args.matmul_n}
        settings = peer_settings(len(args.meter.cpus), threads=args.threads)
        peer = peer.run_peer(spec, settings)
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
