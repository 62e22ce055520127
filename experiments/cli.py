"""Shared argparse options of the study scripts."""
from __future__ import annotations

import argparse
import dataclasses

import jax

from experiments.presets import PRESETS


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="quick", choices=sorted(PRESETS),
                   help="study scale: quick (the README default, a 2-core CPU), full (hours on a CPU), "
                        "ci (seconds, for tests), or an accelerator preset that needs --checkpoint")
    p.add_argument("--name", default=None, help="run name: files go to <root>/<name> (default: the preset name)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--checkpoint", default=None,
                   help="local Hugging Face Qwen3 directory used as the base policy (skips the toy SFT)")
    p.add_argument("--iterations", type=int, default=None, help="override the preset's RL iterations per arm")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the preset's RL seeds")
    p.add_argument("--mesh", type=int, nargs=3, default=None, metavar=("DATA", "FSDP", "TENSOR"),
                   help="override the preset's device mesh (data, fsdp, tensor); the product must equal the "
                        "number of devices (all hosts together), 1 1 1 = the default device only")
    p.add_argument("--compute-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="override the preset's dtype of the RL forward passes (params stay float32)")
    g = p.add_argument_group("multi-host (one process per host, the same command on every host)")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() before anything touches the devices, so the "
                        "preset's mesh spans the devices of every host; without the three options below JAX "
                        "detects the cluster itself (Cloud TPU, SLURM, Open MPI)")
    g.add_argument("--coordinator-address", default=None, help="host:port of process 0 (with --distributed)")
    g.add_argument("--num-processes", type=int, default=None, help="number of processes (with --distributed)")
    g.add_argument("--process-id", type=int, default=None, help="this process's index (with --distributed)")
    return p


def init_distributed(args):
    """jax.distributed.initialize() when --distributed is given; must run before any device is touched."""
    given = {k: getattr(args, k, None) for k in ("coordinator_address", "num_processes", "process_id")}
    if not getattr(args, "distributed", False):
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise SystemExit(f"--{extra[0].replace('_', '-')} needs --distributed")
        return
    jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})


def preset_from(args):
    """The preset with the command line's overrides; calls `init_distributed` (call this before anything
    touches the devices)."""
    preset = PRESETS[args.preset]
    changes = {}
    if args.checkpoint:
        changes["checkpoint"] = args.checkpoint
    if args.iterations is not None:
        changes["iterations"] = args.iterations
    if args.seeds:
        changes["seeds"] = tuple(args.seeds)
    if getattr(args, "mesh", None):
        changes["mesh"] = tuple(args.mesh)
    if getattr(args, "compute_dtype", None):
        changes["compute_dtype"] = args.compute_dtype
    if preset.name.startswith("qwen3") and not (args.checkpoint or preset.checkpoint):
        raise SystemExit(f"preset {preset.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    init_distributed(args)
    return dataclasses.replace(preset, **changes)
