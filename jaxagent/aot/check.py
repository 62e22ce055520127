"""A preset's compile target (topology, mesh, HBM to fit) and the re-check of stored records.

A preset (jaxagent/study/frozenlake/presets.py or jaxagent/study/host/presets.py) names its mesh (data, fsdp, tensor), the TPU
topology it is compiled for (`aot_topology`) and, for a GPU preset compiled on a TPU topology of the same
chip count as its proxy, the GPU's HBM (`aot_hbm_gib`): the fit is checked against min(chip, GPU) HBM.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from jax.sharding import Mesh

from jaxagent import sharding
from jaxagent.aot.memory import add_resident
from jaxagent.aot.record import Program
from jaxagent.aot.topology import GIB, chip_specs, topology_devices
from jaxagent.aot.verdict import HBM_FRACTION, verdict


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a preset's programs are compiled: `mesh` over the first `chips` devices of `topology`, each with
    the chip figures `spec` (`topology.CHIPS`), checked against `hbm_limit` bytes; `proxy` says what a GPU
    preset's TPU topology stands in for (None for a TPU preset)."""
    topology: str
    mesh: Mesh
    chips: int
    spec: dict
    hbm_limit: float
    proxy: Optional[str]


def preset_target(preset, topology: Optional[str] = None) -> Target:
    """The compile target of `preset` (its `aot_topology` unless `topology` is given); ValueError when the
    preset names none or its mesh does not divide the topology's chips."""
    topology = topology or preset.aot_topology
    if topology is None:
        raise ValueError(f"preset {preset.name} names no aot_topology: give a topology (e.g. 'v5p:2x2x1')")
    devices = topology_devices(topology)
    n = int(np.prod(preset.mesh))
    if n > len(devices) or len(devices) % n:
        raise ValueError(f"preset mesh {preset.mesh} ({n} chips) does not match topology {topology} "
                         f"({len(devices)} chips)")
    mesh = sharding.make_mesh(*preset.mesh, devices=devices[:n])
    spec = chip_specs(topology)
    hbm = spec["hbm"] if preset.aot_hbm_gib is None else min(spec["hbm"], preset.aot_hbm_gib * GIB)
    proxy = None
    if preset.aot_hbm_gib is not None:
        proxy = (f"{topology} ({n} chips, {spec['hbm'] / GIB:.1f} GiB each) stands in for {n} GPU(s) with "
                 f"{preset.aot_hbm_gib:g} GiB; checked against min(chip, GPU) HBM")
    return Target(topology, mesh, n, spec, hbm, proxy)


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
            rec["status"] = verdict(rec, fraction=fraction, flops_checked=pr.flops_checked)
        ok &= rec["status"] == "ok"
    return ok
