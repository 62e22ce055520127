"""The PyTorch peer's part of the accelerator benchmark, without JAX (the process that launches the peer never
initialises a device): the peer's work list, built after the JAX stages from the plan and their records (ids
match), and the records that set its results beside ours.

Work list order (the peer starts no item after its budget): the check (greedy tokens and first loss on the random
checkpoint the JAX side wrote), then the first decode batch and prefill context of each model (the targets'
shapes), the train step at the model the JAX side trained, then the other shapes. Settings: decode with the eager
dynamic cache, prefill eager, the train step with gradient checkpointing; `--peer-compile` adds transformers'
compiled static-cache decode (smallest and largest batch), `torch.compile`d prefill and the plain train step
(each `torch.compile` of an 8B forward takes about a minute).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from jaxagent.bench.accel_plan import Plan
from jaxagent.bench.models import model_config


def model_cfg(plan: Plan, name: str):
    """The shape of model `name`: the --checkpoint's when one is given (for every model but the check's, which is
    random), else `bench.models`'."""
    from jaxagent.models.config import Qwen3Config
    if plan.checkpoint is not None and name != plan.check_model:
        return Qwen3Config.from_dir(plan.checkpoint)
    return model_config(name)


def check_shape(plan: Plan) -> dict:
    tiny = plan.check_model == "tiny"
    return {"prompt_rows": 4, "prompt_len": 16 if tiny else 64, "new_tokens": 8 if tiny else 16,
            "rows": 2 if tiny else 8, "seq": 32 if tiny else 512, "prompt": 8 if tiny else 128, "micro_batches": 1}


def peer_items(plan: Plan, ours: dict, check_dir: Optional[str]) -> list:
    """The peer's items (module docstring); `ours`: the JAX side's records by id (the train record names the model
    it trained, --train-model auto's choice); `check_dir`: the checkpoint the JAX check wrote."""
    common = {"repeats": plan.repeats, "warmup": plan.warmup, "seed": plan.seed}
    first, rest = [], []
    if check_dir is not None and "check" in ours and "error" not in ours["check"] and "skipped" not in ours["check"]:
        first.append({"id": "check", "kind": "check", "dir": check_dir, **check_shape(plan), "seed": plan.seed})
    for name in plan.models:
        hf = model_cfg(plan, name).to_hf_dict()
        ends = (min(plan.decode_batches), max(plan.decode_batches))
        for i, b in enumerate(plan.decode_batches if "decode" in plan.parts else ()):
            static = plan.peer_compile and b in ends
            (first if i == 0 else rest).append(
                {"id": f"decode/{name}/{b}", "kind": "decode", "model": hf, "batch": b, "context": plan.decode_context,
                 "steps": plan.decode_steps, "settings": ["dynamic", "static"] if static else ["dynamic"], **common})
        for i, c in enumerate(plan.prefill_contexts if "prefill" in plan.parts else ()):
            (first if i == 0 else rest).append(
                {"id": f"prefill/{name}/{c}", "kind": "prefill", "model": hf, "batch": max(1, plan.prefill_tokens // c),
                 "context": c, "settings": ["eager", "compiled"] if plan.peer_compile else ["eager"], **common})
    train = ours.get("train")
    if train is not None and train.get("model") and "skipped" not in train:
        first.append({"id": "train", "kind": "train", "model": model_cfg(plan, train["model"]).to_hf_dict(),
                      "rows": plan.train_rows, "seq": plan.train_seq, "prompt": plan.train_prompt,
                      "micro_batches": plan.micro_batches,
                      "settings": ["checkpointed", "plain"] if plan.peer_compile else ["checkpointed"], **common})
    return first + rest


def positive(v) -> bool:
    """Whether `v` is a finite number > 0 (a time or a throughput that can be printed)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0


def agreement(a_BxM, b_BxM) -> dict:
    """Greedy tokens of two implementations: the share of equal tokens and the mean share of each row's common
    prefix (after a first difference, the contexts differ and the rest is not comparable)."""
    a, b = np.asarray(a_BxM), np.asarray(b_BxM)
    if a.shape != b.shape:
        raise ValueError(f"token arrays differ in shape: {a.shape} vs {b.shape}")
    same = a == b
    prefix = np.where(same.all(axis=1), a.shape[1], np.argmin(same, axis=1))
    return {"tokens_equal_frac": float(same.mean()), "common_prefix_frac": float(prefix.mean() / a.shape[1])}


def peer_fields(r: Optional[dict], ours: Optional[float], key: str = "tokens_per_s") -> dict:
    """The peer's best figure of one item beside ours, and the ratio ours / peer's (> 1: jaxagent faster)."""
    if r is None:
        return {"peer": None, "peer_note": "the peer did not reach this item"}
    if "error" in r or "skipped" in r:
        return {"peer": None, "peer_note": r.get("error") or r.get("skipped"), "peer_settings": r.get("settings")}
    theirs = r.get(key)
    return {"peer": "transformers+torch", "peer_setting": r.get("best"), f"peer_{key}": theirs,
            "peer_time_spread": r.get("time_spread"),
            "peer_settings": {k: {kk: v[kk] for kk in (key, "time_s", "error") if kk in v}
                              for k, v in r.get("settings", {}).items()},
            "ratio": (ours / theirs) if positive(ours) and positive(theirs) else None}


def compare(items: list, peer: dict, ours: dict) -> list:
    """One record per peer item: `peer` records (its figure, ours, the ratio) and the `check` comparison."""
    out = []
    for item in items:
        pid, r, mine = item["id"], peer.get(item["id"]), ours.get(item["id"], {})
        if item["kind"] == "check":
            out.append(check_record(r, mine))
            continue
        out.append({"bench": "peer", "id": pid, "kind": item["kind"], "model": mine.get("model"),
                    "tokens_per_s": mine.get("tokens_per_s"), **peer_fields(r, mine.get("tokens_per_s"))})
    return out


def check_record(r: Optional[dict], mine: dict) -> dict:
    """Greedy tokens and the first train-step loss of both sides on one random checkpoint."""
    rec = {"bench": "check", "id": "check", "model": mine.get("model")}
    if r is None or "error" in r or "skipped" in r:
        return {**rec, "peer": None, "peer_note": "the peer did not reach the check" if r is None
                else r.get("error") or r.get("skipped")}
    ours_loss, theirs = mine["first_loss"], r["first_loss"]
    return {**rec, "peer": "transformers+torch", **agreement(mine["greedy_tokens"], r["greedy_tokens"]),
            "greedy_tokens": mine["greedy_tokens"], "peer_greedy_tokens": r["greedy_tokens"], "first_loss": ours_loss,
            "peer_first_loss": theirs, "first_loss_abs_diff": abs(ours_loss - theirs),
            "first_loss_rel_diff": abs(ours_loss - theirs) / max(abs(theirs), 1e-12)}
