"""Compile a program for a TPU topology or GPU target and read its record: memory per chip, FLOPs, roofline,
collectives, custom calls, loops, fused attention (GPU) and the verdict.

`analyze` does it for any jitted function on abstract arguments; `run_programs` for a list of `Program`s
(a preset's, `jaxagent.aot.programs` / `jaxagent.aot.host`), compiling a program whose lowered text equals
an earlier one's once. Every argument is abstract (`jax.ShapeDtypeStruct`, with a NamedSharding over the
topology's compile-only devices where it is sharded): no array is materialised.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from typing import Any, Callable, Optional

import jax

from jaxagent.aot.hlo import FUSED_ATTENTION, hlo_summary
from jaxagent.aot.memory import add_resident
from jaxagent.aot.topology import GIB, chip_specs, topology_devices
from jaxagent.aot.topology import hbm_limit as chip_limit
from jaxagent.aot.verdict import FLOPS_TOLERANCE, HBM_FRACTION, foreign_calls, program_verdict


@dataclasses.dataclass
class Program:
    """One program to compile: `lower()` gives its `jax.stages.Lowered`."""
    name: str
    lower: Callable[[], Any]             # () -> jax.stages.Lowered
    analytic_flops: float = 0.0          # all chips together
    note: str = ""
    flops_checked: bool = True           # False where the analytic figure is a scale, not a target (rollouts)
    resident_bytes: float = 0.0          # per chip: what the run holds beside the program's buffers (`Resident`)
    resident_note: str = ""
    calls: tuple = ()                    # `coverage.Call`s: the jitted call `lower` compiles, then the other
                                         # shapes of its family a run also calls (e.g. narrower appends)


def lowered_digest(lowered) -> str:
    """sha256 of a lowered program's text: equal digests, equal programs."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def compiled_record(compiled, *, chips: int, spec: dict, hbm_limit: float, analytic: float) -> dict:
    """The JSON figures of one compiled program (per chip unless said otherwise)."""
    mem = compiled.memory_analysis()
    arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
    alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
    total = arg + out - alias + temp + mem.generated_code_size_in_bytes
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    text = compiled.as_text()
    h = hlo_summary(text)
    flops_xla, bytes_xla = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    per_chip_analytic = analytic / chips
    compute_s = h["flops"] / spec["flops"]
    memory_s = bytes_xla / spec["bw"]
    return {
        "memory_gib": {"argument": round(arg / GIB, 3), "output": round(out / GIB, 3),
                       "alias": round(alias / GIB, 3), "temp": round(temp / GIB, 3), "total": round(total / GIB, 3)},
        "hbm_gib": round(hbm_limit / GIB, 2), "hbm_fraction": round(total / hbm_limit, 4),
        "flops_per_chip": h["flops"], "flops_per_chip_xla": flops_xla, "bytes_per_chip_xla": bytes_xla,
        "flops_note": "flops_per_chip: dot/convolution FLOPs of the per-chip HLO with while-loop trip counts "
                      "applied; *_xla: cost_analysis(), which counts every while-loop body once",
        "analytic_flops_per_chip": per_chip_analytic,
        "flops_ratio": round(h["flops"] / per_chip_analytic, 3) if per_chip_analytic else None,
        "roofline_s": round(max(compute_s, memory_s), 6), "roofline_compute_s": round(compute_s, 6),
        "roofline_memory_s": round(memory_s, 6),
        "collectives": h["collectives"], "custom_calls": h["custom_calls"],
        "foreign_custom_calls": foreign_calls(h["custom_calls"], platform=spec.get("platform", "tpu")),
        "loops": h["loops"][:8], "largest_buffers": h["largest"],
        **({} if spec.get("platform") != "gpu" else {
            "fused_attention_calls": sum(n for t, n in h["custom_calls"].items() if t.startswith(FUSED_ATTENTION)),
            "dense_scores": h["dense_scores"]}),
    }


def run_programs(programs: list[Program], *, preset: Optional[str], topology: str, chips: int, spec: dict,
                 hbm_limit: float, fraction: float = HBM_FRACTION, proxy: Optional[str] = None,
                 emit: Callable[[dict], None], on_compiled: Optional[Callable[[str, str], None]] = None,
                 flops_tolerance: float = FLOPS_TOLERANCE, hbm_note: str = "") -> bool:
    """Compiles each program and emits its record (`emit(record)`; `on_compiled(name, per-chip HLO text)` where
    given); True when every program compiled, fits, holds no foreign custom call and no all-to-all, and (where
    `flops_checked`) counts at most `flops_tolerance` x the analytic FLOPs. A program whose lowered text equals
    an earlier one's (the evaluation rollout is the training rollout's program) is compiled once: its record
    copies the first's figures and says `same_program_as`. `preset` None: the records name no preset.
    `hbm_note`: what `hbm_limit` is (`topology.hbm_limit`), stated in each record. On a GPU the check also
    fails a program that writes dense attention scores to memory (`hlo.dense_scores`)."""
    ok = True
    seen: dict[str, dict] = {}
    for prog in programs:
        rec = {"program": prog.name} if preset is None else {"program": prog.name, "preset": preset}
        rec.update(topology=topology, chips=chips)
        if spec.get("platform") == "gpu":
            rec["platform"] = "gpu"
        if proxy:
            rec["proxy"] = proxy
        if hbm_note:
            rec["hbm_note"] = hbm_note
        t0 = time.time()
        try:
            lowered = prog.lower()
            digest = lowered_digest(lowered)
            if digest in seen:
                first = json.loads(json.dumps(seen[digest]))
                rec.update({k: v for k, v in first.items() if k not in rec and k not in ("compile_s", "shapes")})
                rec["same_program_as"] = first["program"]
            else:
                compiled = lowered.compile()
                if on_compiled is not None:
                    on_compiled(prog.name, compiled.as_text())
                rec.update(compiled_record(compiled, chips=chips, spec=spec, hbm_limit=hbm_limit,
                                           analytic=prog.analytic_flops))
                rec["foreign_custom_calls"] = foreign_calls(rec["custom_calls"], lowered.as_text(),
                                                            platform=spec.get("platform", "tpu"))
                seen[digest] = json.loads(json.dumps(rec))  # its own figures, before what the run holds beside it
            add_resident(rec, prog.resident_bytes, prog.resident_note, hbm_limit)
            rec["status"] = program_verdict(rec, fraction=fraction, flops_checked=prog.flops_checked,
                                    flops_tolerance=flops_tolerance)
        except Exception as e:  # a failed compile is a result, reported per program
            rec["status"] = "compile_error"
            rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        rec["compile_s"] = round(time.time() - t0, 1)
        rec["shapes"] = prog.note
        ok &= rec["status"] == "ok"
        emit(rec)
    return ok


def analyze(fn, *args, topology: str, hbm_gib: Optional[float] = None, analytic_flops: float = 0.0,
            resident_bytes: float = 0.0, fraction: float = HBM_FRACTION, mesh=None, name: Optional[str] = None,
            **kwargs) -> dict:
    """The record of `fn(*args, **kwargs)` compiled for the TPU topology or GPU target `topology` (e.g. 'v5p:2x2x1',
    'h100:1x1x1') on this host: `fn` jitted (a plain function is wrapped in `jax.jit`), `args` abstract (`jax.ShapeDtypeStruct`s, their
    shardings on a mesh over `topology_devices(topology)`), `kwargs` its static arguments; lowered under
    `jax.set_mesh(mesh)` when a mesh is given. Chips: the devices the arguments are placed on (all of the
    topology's when none is). `hbm_gib`: check against min(chip HBM, hbm_gib) (a GPU's, with the TPU as its
    proxy); `analytic_flops` (all chips together): the FLOPs the program should compute, checked within
    `FLOPS_TOLERANCE` when given; `resident_bytes`: what the caller keeps on each chip beside the program.
    The record's fields: docs/aot.md ("What each record says"); `status` 'ok' or the first check failed.

    Example (needs libtpu: `pip install -e '.[tpu-aot]'`)::

        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from jaxagent import aot

        mesh = Mesh(np.array(aot.topology_devices("v5p:2x2x1")).reshape(2, 2), ("data", "model"))
        x = jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", "model")))
        w = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=NamedSharding(mesh, P("model", None)))
        rec = aot.analyze(jax.jit(lambda x, w: x @ w), x, w, topology="v5p:2x2x1",
                          analytic_flops=2 * 4096 * 8192 * 8192)
        rec["status"], rec["memory_gib"]["total"], rec["flops_ratio"], rec["collectives"]["all-reduce"]
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    spec = chip_specs(topology)
    devices = {d for x in jax.tree.leaves(args) for d in getattr(getattr(x, "sharding", None), "device_set", ())}
    chips = len(devices) or len(topology_devices(topology))
    hbm, note = chip_limit(topology, hbm_gib)

    def lower():
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            return jitted.lower(*args, **kwargs)
    prog = Program(name or getattr(fn, "__name__", "program"), lower, analytic_flops, flops_checked=analytic_flops > 0,
                   resident_bytes=resident_bytes)
    recs: list[dict] = []
    run_programs([prog], preset=None, topology=topology, chips=chips, spec=spec, hbm_limit=hbm, fraction=fraction,
                 emit=recs.append, hbm_note=note)
    return recs[0]
