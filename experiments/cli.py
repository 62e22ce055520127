"""Shared argparse options of the study scripts.

Numbers are validated by argparse (`--iterations -3` is a usage error, not an arm marked DONE after
zero iterations). `run_options=True` adds `--seed-offset` and `--force`, which `make_run` applies.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses

import jax

from experiments import study
from experiments.presets import PRESETS


def int_at_least(lo: int, what: str):
    """An argparse `type`: an integer >= lo, else a usage error saying so."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer ({what}), got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be {what} (>= {lo}), got {v}")
        return v
    parse.__name__ = what
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "a non-negative integer")


class _Distinct(argparse.Action):
    """nargs='+' values that must all differ (a seed given twice would be trained once, counted twice)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(set(values)) != len(values):
            parser.error(f"argument {option_string}: values must be distinct, got {' '.join(map(str, values))}")
        setattr(namespace, self.dest, values)


def parser(description: str, *, run_options: bool = False) -> argparse.ArgumentParser:
    """The shared options; `run_options` adds --seed-offset and --force (scripts that build the run with
    `make_run`)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="quick", choices=sorted(PRESETS),
                   help="study scale: quick (the README default, a 2-core CPU), full (hours on a CPU), "
                        "ci (seconds, for tests), or an accelerator preset that needs --checkpoint")
    p.add_argument("--name", default=None, help="run name: files go to <root>/<name> (default: the preset name)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--checkpoint", default=None,
                   help="local Hugging Face Qwen3 directory used as the base policy (skips the toy SFT)")
    p.add_argument("--iterations", type=positive_int, default=None,
                   help="override the preset's RL iterations per arm")
    p.add_argument("--seeds", type=non_negative_int, nargs="+", action=_Distinct, default=None,
                   help="override the preset's RL seeds")
    if run_options:
        p.add_argument("--seed-offset", type=non_negative_int, default=0, metavar="N",
                       help="run the preset on seeds shifted by N (RL seed k -> k+N, and the base SFT seed); "
                            "files go to <root>/<preset>-s<N> unless --name is given")
        p.add_argument("--force", action="store_true",
                       help="reuse a run directory made with other settings: redo every stage whose recorded "
                            "settings differ or were not recorded (older versions); default: refuse, naming them")
    p.add_argument("--mesh", type=positive_int, nargs=3, default=None, metavar=("DATA", "FSDP", "TENSOR"),
                   help="override the preset's device mesh (data, fsdp, tensor); the product must equal the "
                        "number of devices (all hosts together), 1 1 1 = the default device only")
    p.add_argument("--compute-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="override the preset's dtype of the RL forward passes (params stay float32)")
    p.add_argument("--micro-batches", type=positive_int, default=None,
                   help="override the preset's gradient-accumulation micro-batches per RL update (memory)")
    p.add_argument("--remat", default=None, choices=("none", "full", "dots", "dots_no_batch"),
                   help="override the preset's per-layer activation checkpointing policy (none: keep all)")
    g = p.add_argument_group("multi-host (one process per host, the same command on every host)")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() before anything touches the devices, so the "
                        "preset's mesh spans the devices of every host; without the three options below JAX "
                        "detects the cluster itself (Cloud TPU, SLURM, Open MPI)")
    g.add_argument("--coordinator-address", default=None, help="host:port of process 0 (with --distributed)")
    g.add_argument("--num-processes", type=positive_int, default=None,
                   help="number of processes (with --distributed)")
    g.add_argument("--process-id", type=non_negative_int, default=None,
                   help="this process's index (with --distributed)")
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
    if getattr(args, "micro_batches", None):
        changes["micro_batches"] = args.micro_batches
    if getattr(args, "remat", None):
        changes["remat"] = None if args.remat == "none" else args.remat
    if preset.name.startswith("qwen3") and not (args.checkpoint or preset.checkpoint):
        raise SystemExit(f"preset {preset.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    init_distributed(args)
    return dataclasses.replace(preset, **changes)


def make_run(args):
    """The study.Run of the command line: preset_from(args) with --seed-offset and --force applied."""
    return study.Run(preset_from(args), args.root, args.name, seed_offset=getattr(args, "seed_offset", 0),
                     force=getattr(args, "force", False))


@contextlib.contextmanager
def clear_errors():
    """A run-directory settings mismatch or a diverged RL stage ends the script with its message (exit 1)
    instead of a traceback."""
    try:
        yield
    except (study.SettingsMismatch, study.NonFiniteError) as e:
        raise SystemExit(f"error: {e}") from None
