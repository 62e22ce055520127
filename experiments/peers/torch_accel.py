"""The PyTorch peer of `experiments.bench_accel` on the same chip: transformers' Qwen3 for prefill and greedy
decoding, the study's GRPO train step in PyTorch, each at the best of the settings it tries; and the checks that
both frameworks compute the same thing (greedy tokens, first loss) on one random checkpoint.

    python -m experiments.peers.torch_accel SPEC.json OUT.json

SPEC: {"budget_s", "accelerator", "items": [{"id", "kind", ...}]}; OUT: {"device", "torch", "transformers",
"free_gb", "total_gb", "items": [{"id", ...result or "error" or "skipped"}]}, rewritten after every item. It runs
in its own process after the JAX stages' process has exited, so the two never share the chip's memory (`free_gb`:
what CUDA reports free when it starts). With "accelerator" true (the JAX side ran on a GPU or TPU) and no CUDA
device for torch, every item is skipped with that reason: a CPU peer is no comparison. Kinds:
  prefill  one forward of batch x context tokens (`use_cache`, logits of the last position only), bf16 weights;
           settings "eager" and "compiled" (`torch.compile` of the forward; on CUDA only: on a CPU host, a smoke
           test, the inductor's C++ build takes minutes);
  decode   `generate` of `steps` greedy tokens after a prompt of `context` tokens, bf16 weights; the time per step
           is measured inside the call: a logits processor stamps the clock (after a device synchronise) at every
           step, and the decode time is last stamp - first stamp (the first comes right after the prefill), over
           steps - 1 steps: a difference of two readings of one monotonic clock within one run, never negative.
           Settings "dynamic" (DynamicCache, eager) and "static" (StaticCache: `generate` compiles the forward
           with torch.compile on CUDA itself, the transformers recipe);
  train    the GRPO step (`torch_grpo`: PPO-clip token-mean) with f32 master weights, bf16 autocast, AdamW
           (fused on CUDA), gradient clipping at 1.0, `micro_batches` gradient-accumulation steps and gradient
           checkpointing (settings "checkpointed" and "plain");
  check    loads the random Qwen3 checkpoint the JAX side wrote to `dir` (f32), then its greedy tokens (bf16) for
           `prompt_rows` x `prompt_len` random prompts and the first loss of the train step on the check batch.
The time of every setting is reported; `best` names the fastest. Each item's error is recorded and the next runs.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from experiments.peers.torch_grpo import ppo_clip_terms
from experiments.peers.workers import REPO_ROOT
from jaxagent.bench.data import prompts, train_batch

LR, WEIGHT_DECAY, MAX_NORM = 1e-6, 0.01, 1.0  # `stages.make_arm_step`'s optimizer (optim.make_optimizer)


def _device():
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _model(hf_dict: dict, dtype, seed: int):
    """A random transformers Qwen3ForCausalLM of the given config, built on the device in `dtype`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config.from_dict(hf_dict)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(_device()):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def _stats(times: list) -> dict:
    med = statistics.median(times)
    return {"time_s": med, "time_min_s": min(times), "time_max_s": max(times),
            "time_spread": (max(times) - min(times)) / med, "repeats": len(times)}


def _timed(call, item: dict, tokens: int) -> dict:
    """`call()` timed alone between two device synchronisations: item['warmup'] untimed calls, then item['repeats']
    timed ones (`_stats`), and tokens / the median as tokens_per_s."""
    def once():
        _sync()
        t0 = time.perf_counter()
        call()
        _sync()
        return time.perf_counter() - t0
    for _ in range(item.get("warmup", 1)):
        once()
    out = _stats([once() for _ in range(item["repeats"])])
    out["tokens_per_s"] = tokens / out["time_s"]
    return out


def _best(settings: dict) -> dict:
    ok = {k: v for k, v in settings.items() if "time_s" in v}
    if not ok:
        return {"settings": settings, "error": "no setting ran: " + "; ".join(
            f"{k}: {v.get('error')}" for k, v in settings.items())}
    best = min(ok, key=lambda k: ok[k]["time_s"])
    return {"settings": settings, "best": best, **ok[best]}


def _try(fn) -> dict:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 -- one failing setting (OOM, a compile error) must not stop the rest
        return {"error": f"{type(err).__name__}: {str(err)[:400]}"}
    finally:
        _free()


def _free():
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- prefill
def prefill(item: dict) -> dict:
    import torch
    model = _model(item["model"], torch.bfloat16, item.get("seed", 0))
    ids = torch.as_tensor(prompts(item["model"]["vocab_size"], item["batch"], item["context"], item.get("seed", 0)),
                          dtype=torch.long, device=_device())

    def run(forward):
        def call():
            with torch.inference_mode():
                forward(input_ids=ids, use_cache=True, logits_to_keep=1)
        return _timed(call, item, item["batch"] * item["context"])

    settings = {}
    for name in item.get("settings") or (("eager", "compiled") if _device().type == "cuda" else ("eager",)):
        fwd = model.forward if name == "eager" else torch.compile(model.forward)
        settings[name] = _try(lambda fwd=fwd: run(fwd))
    return _best(settings)


# ----------------------------------------------------------------------------- decode
class _Stamps:
    """A logits processor that records the clock at every generation step (after a device synchronise)."""

    def __init__(self):
        self.t: list[float] = []

    def __call__(self, input_ids, scores):
        _sync()
        self.t.append(time.perf_counter())
        return scores


def _generate(model, ids, steps: int, static: bool, stamps=None):
    import torch
    from transformers import LogitsProcessorList
    kw = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if static:
        kw["cache_implementation"] = "static"
    else:
        kw["disable_compile"] = True
    if stamps is not None:
        kw["logits_processor"] = LogitsProcessorList([stamps])
    with torch.inference_mode():
        return model.generate(ids, **kw)


def decode(item: dict) -> dict:
    import torch
    model = _model(item["model"], torch.bfloat16, item.get("seed", 0))
    ids = torch.as_tensor(prompts(item["model"]["vocab_size"], item["batch"], item["context"], item.get("seed", 0)),
                          dtype=torch.long, device=_device())
    steps = item["steps"]
    if steps < 2:
        raise ValueError("decode needs steps >= 2 (the time per step is measured between steps)")

    def run(static: bool):
        def once():
            stamps = _Stamps()
            _generate(model, ids, steps, static, stamps)
            if len(stamps.t) != steps:
                raise RuntimeError(f"generate took {len(stamps.t)} steps, expected {steps}")
            return (stamps.t[-1] - stamps.t[0]) / (steps - 1)
        for _ in range(item.get("warmup", 1)):
            once()
        out = _stats([once() for _ in range(item["repeats"])])
        out["ms_per_step"] = out["time_s"] * 1e3
        out["tokens_per_s"] = item["batch"] / out["time_s"]
        return out

    settings = {name: _try(lambda s=name == "static": run(s)) for name in item.get("settings") or ("dynamic", "static")}
    return _best(settings)


# ----------------------------------------------------------------------------- train
def _train_step_fn(model, batch: dict, micro_batches: int):
    """One GRPO update (module doc); returns () -> loss of the whole batch before the update."""
    import torch
    dev = _device()
    t = {k: torch.as_tensor(v, device=dev) for k, v in batch.items()}
    tokens, mask = t["tokens"].long(), t["policy_mask"].float()
    rows = tokens.shape[0]
    if rows % micro_batches:
        raise ValueError(f"rows {rows} not divisible by micro_batches {micro_batches}")
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY,
                            fused=fused)
    n_total = mask[:, 1:].sum().clamp(min=1.0)
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(micro_batches):
            sl = slice(i * rows // micro_batches, (i + 1) * rows // micro_batches)
            with amp:
                logits = model(input_ids=tokens[sl], use_cache=False).logits
            loss_sum, _, _ = ppo_clip_terms(logits, tokens[sl], t["old_logprobs"][sl], t["advantages"][sl], mask[sl])
            loss = loss_sum / n_total  # the whole batch's token mean, as the jax step
            loss.backward()
            total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if torch.isfinite(norm):
            opt.step()
        return total
    return step


def train(item: dict) -> dict:
    import torch

    batch = train_batch(item["model"]["vocab_size"], item["rows"], item["seq"], item["prompt"], item.get("seed", 0))

    def run(checkpointed: bool):
        model = _model(item["model"], torch.float32, item.get("seed", 0)).train()
        if checkpointed:  # transformers >= 5.2x names it activation_checkpointing_enable (the old name warns)
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        out = _timed(_train_step_fn(model, batch, item["micro_batches"]), item, item["rows"] * item["seq"])
        if torch.cuda.is_available():
            out["peak_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return out

    settings = {name: _try(lambda c=name == "checkpointed": run(c))
                for name in item.get("settings") or ("checkpointed", "plain")}
    return _best(settings)


# ----------------------------------------------------------------------------- check
def check(item: dict) -> dict:
    """The peer's greedy tokens and first loss on the JAX side's random checkpoint."""
    import torch
    from transformers import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(item["dir"], dtype=torch.float32).to(_device()).eval()
    out = {"dir": item["dir"]}
    vocab = model.config.vocab_size
    ids = torch.as_tensor(prompts(vocab, item["prompt_rows"], item["prompt_len"], item.get("seed", 0)),
                          dtype=torch.long, device=_device())
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    gen = _generate(bf16, ids, item["new_tokens"], static=False)
    out["greedy_tokens"] = gen[:, ids.shape[1]:].cpu().numpy().tolist()
    del bf16
    batch = train_batch(vocab, item["rows"], item["seq"], item["prompt"], item.get("seed", 0))
    out["first_loss"] = _train_step_fn(model.train(), batch, item.get("micro_batches", 1))()
    return out


KINDS = {"prefill": prefill, "decode": decode, "train": train, "check": check}


def run(spec: dict, out_path: Optional[str] = None) -> dict:
    import torch
    import transformers
    dev = _device()
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "items": []}
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        out.update(free_gb=free / 1e9, total_gb=total / 1e9)
    no_chip = spec.get("accelerator") and dev.type != "cuda"
    t0, budget = time.perf_counter(), spec.get("budget_s")
    for item in spec["items"]:
        rec = {"id": item["id"], "kind": item["kind"]}
        if no_chip:
            rec["skipped"] = "torch sees no CUDA device (the JAX side ran on an accelerator)"
        elif item["kind"] not in KINDS:
            rec["error"] = f"unknown kind {item['kind']!r}; known: {sorted(KINDS)}"
        elif budget is not None and time.perf_counter() - t0 > budget:
            rec["skipped"] = f"the peer's time budget ({budget:g} s) is spent"
        else:
            t1 = time.perf_counter()
            rec.update(_try(lambda: KINDS[item["kind"]](item)))
            rec["wall_s"] = time.perf_counter() - t1
        out["items"].append(rec)
        if out_path is not None:  # after every item: a caller that stops this process keeps what is done
            with open(out_path + ".tmp", "w") as f:
                json.dump(out, f)
            os.replace(out_path + ".tmp", out_path)
        print(f"[peer {time.perf_counter() - t0:.0f}s] {item['id']}: "
              + ("skipped" if "skipped" in rec else "error: " + rec["error"] if "error" in rec else "done"),
              file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m experiments.peers.torch_accel SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    with contextlib.suppress(Exception):
        import torch
        torch.backends.cuda.matmul.allow_tf32 = True
    run(spec, argv[1])
    return 0


# ----------------------------------------------------------------------------- the launcher (the run's process)
def run_peer(items: list, budget_s: float, log: Callable, *, hard_s: float, accelerator: bool) -> dict:
    """{id: the peer's result} from a fresh process (`experiments.peers.torch_accel`) that starts no item after
    `budget_s` and is stopped after `hard_s`; {} with a note when it cannot run (a crash, a stop)."""
    if not items:
        return {"_note": "nothing to run"}
    with tempfile.TemporaryDirectory() as d:
        spec, out = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec, "w") as f:
            json.dump({"budget_s": budget_s, "accelerator": accelerator, "items": items}, f)
        env = dict(os.environ, JAX_PLATFORMS="cpu",  # the peer's numpy-only imports must not claim the chip
                   PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
        try:
            proc = subprocess.run([sys.executable, "-m", "experiments.peers.torch_accel", spec, out], env=env,
                                  cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=hard_s)
            for line in (proc.stderr or "").splitlines()[-len(items) - 2:]:
                log(line)
            failed = None if proc.returncode == 0 else f"the peer failed (exit {proc.returncode}): " + (
                ((proc.stderr or "").strip().splitlines() or ["no output"])[-1][:300])
        except subprocess.TimeoutExpired:
            failed = f"the peer was stopped after {hard_s:.0f} s"
            log(f"peer: {failed}")
        if not os.path.isfile(out):
            return {"_note": failed or "the peer wrote no result"}
        with open(out) as f:  # the items done before a failure or a stop are kept
            res = json.load(f)
    got = {r["id"]: r for r in res["items"]}
    if failed:
        got["_note"] = failed
    got["_info"] = {k: res.get(k) for k in ("device", "torch", "transformers", "free_gb", "total_gb")}
    return got


if __name__ == "__main__":
    sys.exit(main())
