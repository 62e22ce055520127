"""The PyTorch peer of `jaxagent.bench.train` (`python -m experiments.bench_train`): the same PPO-clip train step
(`torch_grpo.ppo_clip_terms`) with AdamW, gradient clipping and the non-finite-norm skip, timed in worker processes
(`workers.run_peer_workers`) at each torch thread count and OpenMP wait policy."""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from experiments.peers.torch_grpo import ppo_clip_terms
from experiments.peers.workers import run_peer_workers, torch_matmul_gflops
from jaxagent.bench.train import LR, MAX_NORM, WD
from jaxagent.models import weights


def _median(times):
    return statistics.median(times)


def run_peer(cfg, params, batch_np: dict, spec: dict, settings) -> dict:
    """The peer's results per setting: the initial weights and the batch written for the workers, which start from
    them at every setting."""
    with tempfile.TemporaryDirectory() as d:
        weights.save(os.path.join(d, "model"), cfg, params)
        np.savez(os.path.join(d, "batch.npz"), **batch_np)
        spec = {**spec, "model_dir": os.path.join(d, "model"), "batch_npz": os.path.join(d, "batch.npz")}
        return run_peer_workers("experiments.peers.torch_train", spec, settings)


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
    """Worker side (run by `workers`): per thread count, the torch matmul peak and the train step
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
