"""Compile every program of a preset for its TPU topology or GPUs on this (CPU) host, ahead of time.

    python -m experiments.aot_check --preset qwen3-8b-v5p [--topology v5p:4x4x4] [--json]
    python -m experiments.aot_check --preset qwen3-0.6b-1gpu [--target h100|h200] [--json]

Per program one JSON line (with --json; else a table): per-chip memory against the chip's HBM (a GPU: the pool JAX
preallocates, --gpu-mem-fraction of the card) with what the run holds beside the program, FLOPs with loop trip
counts against the analytic count, a roofline time, collectives, custom calls, the fused attention calls (GPU) and
the verdict (`jaxagent.aot`). The exit status is 1 unless every program is 'ok'. GPU presets are compiled for their
GPUs (`aot_topology` 'h100:1x1x<N>'; `--topology v5p:...` compiles them for a TPU proxy of their chip count, checked
against the GPU's HBM). Install the pinned libtpu with `pip install -e '.[tpu-aot]'`, the CUDA plugin and cuDNN with
`pip install -e '.[gpu-aot]'`. The fields and the figures: docs/aot.md.
"""
from __future__ import annotations

import os

# Before jax is imported. The compiles are deviceless (compile-only TPU / GPU topologies): no local accelerator is
# initialised, and the CUDA plugin loads on a host without a GPU only when jax's backends are limited to the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Several libtpu processes may coexist; no metadata server to query here.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

# Names and figures only: --help and usage errors answer without JAX (`main` imports the rest).
from jaxagent.aot import gpu  # noqa: E402
from jaxagent.aot.verdict import HBM_FRACTION  # noqa: E402
from jaxagent.models.config import PRESETS as MODEL_PRESETS  # noqa: E402
from jaxagent.study import preset_names  # noqa: E402
from experiments import cli  # noqa: E402


def table_line(rec: dict) -> str:
    if rec["status"] == "compile_error":
        return f"{rec['program']:<22} {rec['status']}: {rec['error'][:300]}"
    coll = ", ".join(f"{k} {v['count']}x/{v['gib']:.2f}GiB" for k, v in sorted(rec["collectives"].items()))
    dense = rec.get("dense_scores")
    attention = "" if rec.get("platform") != "gpu" else (
        f"  fused attention {rec['fused_attention_calls']}x" + (f", dense scores {dense['shape']}" if dense else ""))
    return (f"{rec['program']:<22} {rec['status']:<10} {rec['memory_gib']['total']:8.2f} / {rec['hbm_gib']:.1f} GiB"
            f"  flops/chip {rec['flops_per_chip']:.3g} (x{rec['flops_ratio']} analytic)"
            f"  roofline {rec['roofline_s']:.4g}s  custom {rec['foreign_custom_calls'] or '-'}{attention}  [{coll}]")


def parse_args(argv):
    p = cli.Parser(prog="python -m experiments.aot_check", description=__doc__.split("\n")[0])
    names = sorted(preset_names.FROZENLAKE) + sorted(preset_names.HOST)
    p.add_argument("--preset", required=True, choices=names, metavar="PRESET", help="one of " + ", ".join(names))
    p.add_argument("--topology", default=None,
                   help="TPU topology, e.g. v5p:4x4x4, or GPUs of one host, e.g. h100:1x1x8 (default: the preset's)")
    p.add_argument("--target", default=None, choices=sorted(gpu.CARDS),
                   help="compile for this GPU, as many cards as the preset's mesh has devices (instead of --topology)")
    p.add_argument("--gpu-mem-fraction", type=float, default=gpu.MEM_FRACTION,
                   help="on a GPU: the XLA_PYTHON_CLIENT_MEM_FRACTION the run uses (JAX's default 0.75): the pool "
                        "that memory is checked against")
    p.add_argument("--model", default=None, choices=sorted(MODEL_PRESETS),
                   help="architecture (default: the preset's aot_model, else its model config)")
    p.add_argument("--micro-batches", type=int, default=None, help="override the preset's micro-batches")
    p.add_argument("--remat", default=None, choices=("none", "full", "dots", "dots_no_batch"),
                   help="override the preset's remat policy")
    cli.add_scan_layers(p)
    p.add_argument("--mesh", type=int, nargs=3, default=None, metavar=("DATA", "FSDP", "TENSOR"),
                   help="override the preset's (data, fsdp, tensor) mesh (its product: the chips used)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the model's layer count (a shallow copy of the architecture: quick sharding checks)")
    p.add_argument("--programs", nargs="+", default=None, help="only these programs (names as printed)")
    p.add_argument("--hbm-fraction", type=float, default=HBM_FRACTION, help="most of a chip's HBM a program may use")
    p.add_argument("--json", action="store_true", help="one JSON line per program")
    p.add_argument("--hlo-dir", default=None, help="also write each program's per-chip HLO text here")
    p.add_argument("--recheck", default=None, metavar="JSONL",
                   help="no compiles: re-apply what the run holds beside each program (`Resident`) and the verdict to "
                        "the JSON records of an earlier run of this preset (their compiled figures as they are), for "
                        "the topology they were compiled for")
    p.add_argument("--lowered", action="store_true",
                   help="no compiles: print each program's lowered-text sha256 (equal digests, equal programs)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from jaxagent.aot import host, lowered_digest, programs, run_programs
    from jaxagent.aot.check import preset_target, recheck
    from jaxagent.models import ops_gpu
    from jaxagent.study.frozenlake.presets import PRESETS
    from jaxagent.study.common.arms import arm_settings
    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent.study.host.run import host_arm_settings
    records = []
    if args.recheck:
        with open(args.recheck) as f:
            records = [json.loads(line) for line in f if line.startswith("{")]
        bad = [r["program"] for r in records if r.get("preset") != args.preset or r.get("layers") != args.layers]
        if bad:
            raise SystemExit(f"{args.recheck}: records {bad} are not of --preset {args.preset} at --layers "
                             f"{args.layers}")
        args.programs = sorted({r["program"] for r in records})
        tops = sorted({r["topology"] for r in records if "topology" in r})
        if len(tops) == 1 and not (args.topology or args.target):
            args.topology = tops[0]  # re-checked for the topology the records were compiled for
    is_host = args.preset in HOST_PRESETS
    preset = HOST_PRESETS[args.preset] if is_host else PRESETS[args.preset]
    if getattr(preset, "pruned_vocabulary", False):
        raise SystemExit(f"--preset {args.preset}: its model's vocabulary is its pruned tokenizer's, made when the "
                         "study runs (a CPU toy); the AOT check is for the GPU and TPU presets")
    changes = {}
    if args.micro_batches:
        changes["micro_batches"] = args.micro_batches
    if args.remat:
        changes["remat"] = None if args.remat == "none" else args.remat
    if args.scan_layers:
        changes["scan_layers"] = True
    if args.mesh:
        if min(args.mesh) < 1:
            raise SystemExit(f"--mesh needs three positive sizes, got {args.mesh}")
        changes["mesh"] = tuple(args.mesh)
    preset = dataclasses.replace(preset, **changes)
    model = args.model or preset.aot_model
    cfg = MODEL_PRESETS[model] if model else (preset.tiny_model if is_host else preset.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    if args.programs:
        unknown = set(args.programs) - set(programs.PROGRAM_NAMES + host.PROGRAM_NAMES)
        if unknown:
            raise SystemExit(f"unknown programs {sorted(unknown)}; known: "
                             f"{list(programs.PROGRAM_NAMES + host.PROGRAM_NAMES)}")
    try:
        target = preset_target(preset, args.topology, target=args.target, gpu_mem_fraction=args.gpu_mem_fraction)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(str(e)) from None
    if target.spec["platform"] == "gpu" and not args.recheck and not ops_gpu.available():
        raise SystemExit(f"{target.topology}: cuDNN is not installed here, so the fused attention a GPU run uses cannot "
                         "be built (its programs would hold the dense [B, H, T, S] scores): pip install -e '.[gpu-aot]'")
    # the arms' settings as the study's run makes them (`common.arms.arm_settings`, `host.run.host_arm_settings`)
    arms = [(host_arm_settings if is_host else arm_settings)(preset, a) for a in preset.arms]
    build = host.host_programs if is_host else programs.preset_programs
    progs = build(preset, cfg, target.mesh, arms, only=args.programs)
    if args.programs and not progs:
        raise SystemExit(f"preset {preset.name} runs none of {args.programs}")

    def emit(rec):
        if args.layers:
            rec["layers"] = args.layers
        print(json.dumps(rec) if args.json else table_line(rec), flush=True)

    if args.lowered:
        for pr in progs:
            print(json.dumps({"program": pr.name, "preset": preset.name, "lowered_sha256": lowered_digest(pr.lower())}),
                  flush=True)
        return 0
    if args.recheck:
        ok = recheck(records, progs, hbm_limit=target.hbm_limit, fraction=args.hbm_fraction)
        for rec in records:
            print(json.dumps(rec) if args.json else table_line(rec), flush=True)
        return 0 if ok else 1

    def keep_hlo(name, text):
        os.makedirs(args.hlo_dir, exist_ok=True)
        with open(os.path.join(args.hlo_dir, f"{preset.name}.{name}.hlo.txt"), "w") as f:
            f.write(text)
    ok = run_programs(progs, preset=preset.name, topology=target.topology, chips=target.chips, spec=target.spec,
                      hbm_limit=target.hbm_limit, fraction=args.hbm_fraction, proxy=target.proxy, emit=emit,
                      on_compiled=keep_hlo if args.hlo_dir else None, hbm_note=target.hbm_note)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
