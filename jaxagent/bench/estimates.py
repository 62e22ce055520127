"""Roofline estimates (not measurements) of the benchmark's figures and of the study's presets on a chip of the
device table: what 100% of the chip would give, and the performance targets (docs/performance.md) as fractions of it.

Dimension legend (CONVENTIONS.md): B episodes or rows, S context slots, N turns (T_max), M reply tokens.

`model_rows`: per model shape, the benchmark's measurements at the roofline (`roofline`: prefill compute-bound,
decode reading the weights and the cache, the train step's model FLOPs).
`preset_rows`: per accelerator preset, one RL iteration's two big programs on its chips:
  - the train step from its AOT record (`docs/aot_records/*.jsonl`, `experiments/aot_check.py`): the per-chip
    FLOPs XLA compiled (dot FLOPs with while-loop trip counts) / the chip's peak, and its fraction of HBM;
  - the rollout's decoding, analytic: N x M decode steps, each reading the chip's share of the bf16 weights (split
    over `tensor`) and of the KV cache of its rows (rows over data x fsdp, heads over tensor), the cache half full
    on average (S / 2 of S slots: every turn appends, the presets size S for a full episode), divided by the HBM
    bandwidth. Appends (prompt chunks) and sampling are left out: a lower bound on the rollout's time.
The records were compiled for TPU v5p topologies; a GPU preset's (v5p:1x1x1 and 2x2x2 as one and eight 80 GB
GPUs) per-chip FLOPs are the same program's on a GPU of as many chips, which is how they are used here.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Mapping, Optional

from jaxagent.bench import roofline
from jaxagent.bench.devices import DeviceSpec
from jaxagent.models.config import Qwen3Config

TRAIN_PROGRAMS = ("train_step_grpo", "host_train_step")  # FrozenLake presets', host presets' GRPO step


def model_rows(name: str, cfg: Qwen3Config, spec: DeviceSpec, *, prefill_contexts=(512, 2048, 8192),
               prefill_tokens: int = 8192, decode_batches=(1, 16, 64, 256), decode_context: int = 1024,
               decode_steps: int = 32, train_rows: int = 16, train_seq: int = 2048) -> list[dict]:
    """The benchmark's default measurements of one model at the roofline of `spec` (bf16 weights and cache)."""
    out = []
    for c in prefill_contexts:
        b = max(1, prefill_tokens // c)
        fl = roofline.prefill_flops(cfg, b, c)
        s = fl / spec.peak_flops
        out.append({"model": name, "bench": "prefill", "shape": f"{b} x {c}", "roofline_tokens_per_s": b * c / s,
                    "bound": "compute"})
    mean_ctx = decode_context + (decode_steps - 1) / 2
    for b in decode_batches:
        by = roofline.decode_step_bytes(cfg, b, mean_ctx, 2, 2)
        r = roofline.roofline_seconds(roofline.decode_step_flops(cfg, b, mean_ctx), by["bytes"], spec.peak_flops,
                                      spec.hbm_bytes_per_s)
        out.append({"model": name, "bench": "decode", "shape": f"batch {b}, context {decode_context}",
                    "roofline_ms_per_step": r["roofline_s"] * 1e3, "roofline_tokens_per_s": b / r["roofline_s"],
                    "bound": r["bound"], "bytes_per_step_gb": by["bytes"] / 1e9})
    fl = roofline.train_flops(cfg, train_rows, train_seq)
    s = fl / spec.peak_flops
    state = 18.0 * cfg.num_params()  # f32 params, Adam's two moments, f32 gradients, a bf16 compute copy
    out.append({"model": name, "bench": "train_step", "shape": f"{train_rows} x {train_seq}",
                "roofline_s": s, "roofline_tokens_per_s": train_rows * train_seq / s, "bound": "compute",
                "state_gb": state / 1e9, "state_fits": state < 0.9 * spec.hbm_bytes if spec.hbm_bytes else None})
    return out


def read_records(paths: Iterable[str]) -> list[dict]:
    """The JSON lines of AOT record files (missing files skipped)."""
    out = []
    for p in paths:
        if os.path.isfile(p):
            with open(p) as f:
                out += [json.loads(line) for line in f if line.strip()]
    return out


def train_record(records: list[dict], preset: str) -> Optional[dict]:
    """The preset's GRPO train-step record (the last one written for it), or None."""
    got = [r for r in records if r.get("preset") == preset and r.get("program") in TRAIN_PROGRAMS
           and r.get("flops_per_chip")]
    return got[-1] if got else None


def rollout_decode_seconds(cfg: Qwen3Config, spec: DeviceSpec, *, episodes: int, t_max: int, reply_tokens: int,
                           context: int, mesh: tuple) -> dict:
    """The rollout's decoding at the HBM roofline (module docstring): N x M steps x (weights / tensor + rows per
    chip x S / 2 x KV bytes per token / tensor) / bandwidth."""
    data, fsdp, tensor = mesh
    rows = -(-episodes // (data * fsdp))
    step = roofline.decode_step_bytes(cfg, rows, context / 2, 2, 2)
    per_chip = step["weight_bytes"] / tensor + step["kv_bytes"] / tensor
    steps = t_max * reply_tokens
    return {"decode_steps": steps, "bytes_per_step_gb": per_chip / 1e9,
            "seconds": steps * per_chip / spec.hbm_bytes_per_s}


def preset_row(name: str, cfg: Qwen3Config, spec: DeviceSpec, record: Optional[dict], *, episodes: int, t_max: int,
               reply_tokens: int, context: int, mesh: tuple, mfu_target: float = 0.4,
               hbm_target: float = 0.75) -> dict:
    """One preset's RL iteration at the roofline and at the targets (MFU `mfu_target` for the train step, HBM
    fraction `hbm_target` for decoding)."""
    ro = rollout_decode_seconds(cfg, spec, episodes=episodes, t_max=t_max, reply_tokens=reply_tokens,
                                context=context, mesh=mesh)
    row = {"preset": name, "chip": spec.name, "chips": mesh[0] * mesh[1] * mesh[2], "episodes": episodes,
           "rollout_roofline_s": ro["seconds"], "rollout_at_target_s": ro["seconds"] / hbm_target,
           "decode_steps": ro["decode_steps"], "decode_gb_per_step_per_chip": ro["bytes_per_step_gb"]}
    if record is None:
        return {**row, "train_note": "no AOT record"}
    train_s = record["flops_per_chip"] / spec.peak_flops
    at_target = train_s / mfu_target
    row.update(train_program=record["program"], train_shape=record.get("shapes", "")[:80],
               train_flops_per_chip=record["flops_per_chip"], train_roofline_s=train_s, train_at_target_s=at_target,
               train_hbm_fraction_v5p=record.get("hbm_fraction"),
               rollout_share_at_targets=row["rollout_at_target_s"] / (row["rollout_at_target_s"] + at_target))
    return row


def markdown(rows: list[dict], columns: list[tuple]) -> str:
    """A Markdown table of `rows` with (header, key, format) columns; missing values print as '-'."""
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            v = r.get(key)
            cells.append("-" if v is None else format(v, fmt) if fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the tables
def preset_shape(p):
    """(cfg, chip spec name, episodes, t_max, reply tokens, context, mesh, decode groups) of an accelerator preset."""
    from jaxagent.bench.models import CONFIG_NAMES, model_config
    groups = getattr(p.task, "overlap_groups", 1)
    chip = "H200 SXM" if p.aot_hbm_gib else "TPU v5p"  # the GPU presets' target chip; the pods' TPU
    return (model_config(CONFIG_NAMES[p.aot_model]), chip, p.n_tasks * p.group_size, p.task.t_max,
            p.task.max_action_tokens, p.task.max_context, tuple(p.mesh), groups)


def tables(chip: str, presets: Optional[Mapping], aot_dir: str) -> str:
    """The Markdown estimate tables of the models on `chip` (a `devices.DEVICES` name) and, given `presets` (the
    study's, by name), of the accelerator presets from their AOT records in `aot_dir` and of the host presets'
    long-tail shares (`longtail.finished_share_mixture`). ValueError for an unknown chip."""
    import glob

    from jaxagent.bench.devices import DEVICES
    from jaxagent.bench.models import MODELS
    if chip not in DEVICES:
        raise ValueError(f"--estimate-chip: unknown chip {chip!r}; valid: {', '.join(DEVICES)}")
    min_turns_memo: dict = {}
    spec = DEVICES[chip]
    rows = [r for name, cfg in MODELS.items() if name != "tiny" for r in model_rows(name, cfg, spec)]
    for r in rows:  # the performance targets as fractions of the roofline
        r["at_target"] = r["roofline_tokens_per_s"] * {"prefill": 0.5, "decode": 0.75, "train_step": 0.4}[r["bench"]]
    out = [f"Model shapes on {chip} ({spec.peak_flops / 1e12:.0f} TFLOP/s bf16, {spec.hbm_bytes_per_s / 1e12:.2f} TB/s)"
           ": tokens/s at the roofline and at the targets (prefill 50% MFU, decode 75% of the HBM roofline, train "
           "step 40% MFU). ESTIMATES, not measurements.", "",
           markdown(rows, [("model", "model", ""), ("measurement", "bench", ""), ("shape", "shape", ""),
                               ("bound", "bound", ""), ("tokens/s at roofline", "roofline_tokens_per_s", ",.0f"),
                               ("tokens/s at target", "at_target", ",.0f"),
                               ("ms/step at roofline", "roofline_ms_per_step", ".2f"),
                               ("train state GB (18 B/param)", "state_gb", ".0f")])]
    if presets is None:
        return "\n".join(out)
    from jaxagent.bench.longtail import finished_share_mixture  # the rollout's modules, JAX among them
    records = read_records(sorted(glob.glob(os.path.join(aot_dir, "*.jsonl"))))
    prow = []
    for name, p in presets.items():
        if not getattr(p, "aot_model", None):
            continue
        cfg, chip_name, eps, t_max, m, ctx, mesh, groups = preset_shape(p)
        r = preset_row(name, cfg, DEVICES[chip_name], train_record(records, name), episodes=eps // groups,
                           t_max=t_max * groups, reply_tokens=m, context=ctx, mesh=mesh)
        r["episodes"], r["groups"] = eps, groups
        prow.append(r)
    out += ["", "One RL iteration of each accelerator preset at the roofline: the GRPO train step from its AOT record's "
            "per-chip FLOPs, the rollout's decoding from the bytes it must read (weights and the half-full cache per "
            "step, N x M steps per episode group). GPU presets on an H200, the pods on TPU v5p. ESTIMATES.", "",
            markdown(prow, [("preset", "preset", ""), ("chip", "chip", ""), ("chips", "chips", "d"),
                                ("episodes", "episodes", "d"), ("groups", "groups", "d"),
                                ("train step at roofline s", "train_roofline_s", ".2f"),
                                ("at 40% MFU s", "train_at_target_s", ".2f"),
                                ("decode steps", "decode_steps", "d"),
                                ("GB read per step per chip", "decode_gb_per_step_per_chip", ".2f"),
                                ("rollout decode at roofline s", "rollout_roofline_s", ".2f"),
                                ("at 75% HBM s", "rollout_at_target_s", ".2f"),
                                ("rollout share at targets", "rollout_share_at_targets", ".2f")])]
    out += ["", "Decode slots spent on finished episodes, host presets (`longtail.finished_share_mixture`): an "
            "episode ends at its task's reference turn count with probability p, else plays all T_max turns. "
            "ESTIMATES from the tasks' reference solutions.", ""]
    trows = []
    for name, p in presets.items():
        if not getattr(p, "aot_model", None) or not hasattr(p.task, "domain"):
            continue
        try:
            m = min_turns(p, min_turns_memo)
        except (ImportError, FileNotFoundError) as err:  # the domain's data is not installed here (bfcl-eval, the
            # tokenizer's package): a note in its row; any other error is a defect and propagates
            trows.append({"preset": name, "note": f"{type(err).__name__}: {err}"[:80]})
            continue
        trows.append({"preset": name, "t_max": p.task.t_max, "tasks": len(m), "mean_min_turns": float(m.mean()),
                      **{f"p{int(q * 100)}": finished_share_mixture(m, p.task.t_max, q) for q in (0.25, 0.5, 0.75, 1.0)}})
    out.append(markdown(trows, [("preset", "preset", ""), ("T_max", "t_max", "d"), ("train tasks", "tasks", "d"),
                                    ("mean reference turns", "mean_min_turns", ".2f"), ("p = 0.25", "p25", ".2f"),
                                    ("p = 0.5", "p50", ".2f"), ("p = 0.75", "p75", ".2f"), ("p = 1", "p100", ".2f"),
                                    ("note", "note", "")]))
    return "\n".join(out)



def min_turns(preset, memo: dict):
    """The reference solutions' turn counts of a host preset's train tasks (`HostWorld.min_turns`); `memo`
    keeps them per (domain, tasks, system tokens) across presets."""
    key = (preset.task.domain, preset.task.max_train_tasks, preset.task.max_system_tokens)
    if key not in memo:
        from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
        from jaxagent.study.host import stages as host_stages
        world = host_stages.make_host_world(preset.task, Tokenizer.from_dir(qwen3_tokenizer_dir()))
        memo[key] = world.min_turns(world.train_tasks)
    return memo[key]
