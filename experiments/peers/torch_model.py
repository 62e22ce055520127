"""The PyTorch peer of `jaxagent.bench.model` (`python -m experiments.bench_model`): transformers' Qwen3 `generate`,
greedy, exactly the asked new tokens, under `torch.inference_mode`, timed in worker processes
(`workers.run_peer_workers`) at each torch thread count and OpenMP wait policy; it also writes the random
checkpoint that both sides load."""
from __future__ import annotations

import numpy as np

from experiments.peers.workers import run_peer_workers, torch_matmul_gflops
from jaxagent.bench.model import time_runners
from jaxagent.models.config import Qwen3Config


def write_checkpoint(cfg: Qwen3Config, seed: int, model_dir: str) -> None:
    """A random transformers Qwen3ForCausalLM of `cfg` (torch seed `seed`) saved to `model_dir`; this process's
    torch runs at one thread (it only builds the weights; the timed peer runs in workers)."""
    import torch

    torch.set_num_threads(1)
    _hf_model(cfg, seed).save_pretrained(model_dir)


def run_peer(spec: dict, settings) -> dict:
    """The peer's results per setting (`peer_worker` in worker processes)."""
    return run_peer_workers("experiments.peers.torch_model", spec, settings)


def torch_runner(model, prompt_BxL: np.ndarray):
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


def _hf_model(cfg: Qwen3Config, seed: int):
    import torch
    from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM

    torch.manual_seed(seed)
    hf_cfg = HFConfig.from_dict(cfg.to_hf_dict())
    return Qwen3ForCausalLM(hf_cfg).eval()


def peer_worker(spec: dict, threads: list[int]) -> dict:
    """Worker side (run by `workers`): the torch matmul peak and generate timings per thread count."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32).eval()
    prompt = np.asarray(spec["prompt"], np.int64)
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        peak = torch_matmul_gflops(spec["matmul_n"], spec["repeats"])
        r = time_runners({"torch": torch_runner(model, prompt)}, {"torch": 1}, spec["new_tokens"],
                         spec["repeats"])["torch"]
        out[t] = {"matmul_gflops": peak, "tokens": r["tokens"].tolist(),
                  **{k: r[k] for k in ("compile_s", "prefill_s", "prefill_min_s", "decode_s", "decode_min_s")}}
    return out
