"""Shared argparse options of the study scripts."""
from __future__ import annotations

import argparse
import dataclasses

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
    return p


def preset_from(args):
    preset = PRESETS[args.preset]
    changes = {}
    if args.checkpoint:
        changes["checkpoint"] = args.checkpoint
    if args.iterations is not None:
        changes["iterations"] = args.iterations
    if args.seeds:
        changes["seeds"] = tuple(args.seeds)
    if preset.name.startswith("qwen3") and not (args.checkpoint or preset.checkpoint):
        raise SystemExit(f"preset {preset.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    return dataclasses.replace(preset, **changes)
