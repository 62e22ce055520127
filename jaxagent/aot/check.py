"""A preset's compile target (topology, mesh, HBM to fit) and the re-check of stored records.

A preset (jaxagent/study/frozenlake/presets.py or jaxagent/study/host/presets.py) names its mesh (data, fsdp,
tensor), the topology it is compiled for (`aot_topology`: a TPU slice such as 'v5p:4x4x4', or GPUs such as
'h100:1x1x8') and the GPU's HBM (`aot_hbm_gib`), which applies where a TPU topology stands in for the GPUs
(`--topology v5p:...`): the fit is then checked against min(chip, GPU) HBM. On a GPU target the fit is checked
against the pool JAX preallocates on the card (`topology.hbm_limit`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from jax.sharding import Mesh

from jaxagent import sharding
from jaxagent.aot.memory import add_resident
from jaxagent.aot.record import Program
from jaxagent.aot import gpu
from jaxagent.aot.topology import GIB, chip_specs, hbm_limit, topology_devices
from jaxagent.aot.verdict import HBM_FRACTION, program_verdict


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a preset's programs are compiled: `mesh` over the first `chips` devices of `topology`, each with
    the chip figures `spec` (`topology.chip_specs`), checked against `hbm_limit` bytes (`hbm_note`: what they
    are); `proxy` says what a GPU preset's TPU topology stands in for (None otherwise)."""
    topology: str
    mesh: Mesh
    chips: int
    spec: dict
    hbm_limit: float
    proxy: Optional[str]
    hbm_note: str = ""


def gpu_topology(target: str, chips: int) -> str:
    """The topology name of `chips` cards of GPU `target` on one host (`gpu.CARDS`: 'h100' -> 'h100:1x1x<chips>')."""
    if target not in gpu.CARDS:
        raise ValueError(f"unknown GPU target {target!r} (known: {sorted(gpu.CARDS)})")
    return f"{target}:1x1x{chips}"


def preset_target(preset, topology: Optional[str] = None, *, target: Optional[str] = None,
                  gpu_mem_fraction: float = gpu.MEM_FRACTION) -> Target:
    """The compile target of `preset`: `topology`, else the GPU `target`'s cards (as many as the preset's mesh
    has devices), else the preset's `aot_topology`; ValueError when none is named or the preset's mesh does not
    divide the topology's chips. `gpu_mem_fraction`: the XLA_PYTHON_CLIENT_MEM_FRACTION the run uses."""
    n = int(np.prod(preset.mesh))
    if topology is not None and target is not None:
        raise ValueError("give a topology or a GPU target, not both")
    topology = topology or (gpu_topology(target, n) if target else preset.aot_topology)
    if topology is None:
        raise ValueError(f"preset {preset.name} names no aot_topology: give a topology (e.g. 'v5p:2x2x1') or a GPU "
                         f"target ({', '.join(sorted(gpu.CARDS))})")
    spec = chip_specs(topology)
    devices = topology_devices(topology)
    if n > len(devices) or len(devices) % n:
        raise ValueError(f"preset mesh {preset.mesh} ({n} chips) does not match topology {topology} "
                         f"({len(devices)} chips)")
    mesh = sharding.make_mesh(*preset.mesh, devices=devices[:n])
    is_proxy = spec["platform"] == "tpu" and preset.aot_hbm_gib is not None
    hbm, note = hbm_limit(topology, preset.aot_hbm_gib if is_proxy else None, gpu_mem_fraction)
    proxy = None
    if is_proxy:
        proxy = (f"{topology} ({n} chips, {spec['hbm'] / GIB:.1f} GiB each) stands in for {n} GPU(s) with "
                 f"{preset.aot_hbm_gib:g} GiB; checked against min(chip, GPU) HBM")
    return Target(topology, mesh, n, spec, hbm, proxy, note)


def recheck(records: list[dict], programs: list[Program], *, hbm_limit: float,
            fraction: float = HBM_FRACTION) -> bool:
    """Re-applies what the run holds beside each program (`Program.resident_bytes`, from the programs as built
    now) and the verdict to the stored `records` of those programs, in place, their compiled figures as they
    are (no compile); True when every record is then 'ok'. A record of a failed compile stays as it is."""
    by_name, ok = {pr.name: pr for pr in programs}, True
    missing = sorted({rec["program"] for rec in records} - set(by_name))
    if missing:
        raise ValueError(f"records of programs {missing} that were not built: {sorted(by_name)}")
    for rec in records:
        pr = by_name[rec["program"]]
        if rec.get("status") != "compile_error":
            add_resident(rec, pr.resident_bytes, pr.resident_note, hbm_limit)
            rec["status"] = program_verdict(rec, fraction=fraction, flops_checked=pr.flops_checked)
        ok &= rec["status"] == "ok"
    return ok
