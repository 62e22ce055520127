"""Per-chip memory: what a run holds on each chip beside a program (`Resident`) and the fit against HBM.

A compiled program's own footprint (`compiled.memory_analysis()`: arguments + outputs - donated + temporaries +
code) is not what a chip holds while it runs: a study run keeps the base params and an arm's TrainState on
the device between programs. `add_resident` adds that to a record's memory, and the fit (`hbm_fraction`,
the verdict's `over_hbm`) is taken on the sum.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxagent.aot.topology import GIB
from jaxagent.study import stages


def per_chip_bytes(tree) -> float:
    """Bytes one chip holds of an abstract tree (ShapeDtypeStructs, sharded where they carry a sharding)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sh = getattr(x, "sharding", None)
        shape = sh.shard_shape(x.shape) if sh is not None else x.shape
        total += int(np.prod(shape)) * x.dtype.itemsize  # key arrays too (their dtype is no numpy dtype)
    return float(total)


@dataclasses.dataclass(frozen=True)
class Resident:
    """What a study run keeps on each chip beside a program's own arguments and temporaries: the base params (f32:
    every arm starts from them and the evaluation compares with them) and, while an arm trains, its TrainState
    (params, Adam moments, PPO's critic, the reference with kl_coef > 0; the largest arm's). The evaluation holds
    the base and one policy at a time (`study.SavedPolicies`), no more than that. The train step's state is its
    own argument, so the base alone is resident beside it."""
    base: float                          # bytes per chip
    state: float

    @classmethod
    def of(cls, cfg, mesh, run_mesh, arms, **step_kw) -> "Resident":
        """From the arms' `stages.make_arm_step` states on `mesh` (`step_kw`: its options)."""
        distinct = {stages.shared_key(a): a for a in arms}.values()  # arms with equal settings hold equal states
        states = [stages.make_arm_step(cfg, a, mesh=run_mesh, **step_kw).abstract_state(cfg, mesh) for a in distinct]
        return cls(per_chip_bytes(states[0].params), max(per_chip_bytes(st) for st in states))

    def apply(self, progs: list, train_steps: tuple[str, ...], alone: tuple[str, ...] = ("sft_step",)) -> list:
        """Adds the resident bytes to each `Program` of `progs`: the base beside the `train_steps`, nothing beside
        the programs `alone` (the SFT step: it runs before any arm; the making of the params or of a TrainState
        from the base: the base is its argument), the base and the state beside every other program."""
        for pr in progs:
            if pr.name in train_steps:
                pr.resident_bytes += self.base
                pr.resident_note = "; ".join(filter(None, [pr.resident_note, "the base params"]))
            elif pr.name not in alone:
                pr.resident_bytes += self.base + self.state
                pr.resident_note = "; ".join(filter(None, [pr.resident_note, "the base params and an arm's TrainState"]))
        return progs


def add_resident(rec: dict, resident: float, note: str, hbm_limit: float) -> dict:
    """Adds what the run holds on each chip beside the program (`resident` bytes, `Resident`) to the record's memory:
    memory_gib program (the compiled program's own total), resident, and total = their sum, which `hbm_fraction`
    and the verdict use."""
    mem = rec["memory_gib"]
    own = mem.get("program", mem["total"])
    mem.update(program=own, resident=round(resident / GIB, 3), total=round(own + resident / GIB, 3))
    rec["hbm_fraction"] = round(mem["total"] * GIB / hbm_limit, 4)
    if note:
        rec["resident"] = note
    return rec
