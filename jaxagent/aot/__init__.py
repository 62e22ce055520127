"""Ahead-of-time analysis of accelerator programs: compile for a TPU topology or NVIDIA GPUs on a host without
them, and read each program's per-chip memory, FLOPs (with loop trip counts), roofline, collectives, custom calls,
fused attention (GPU) and a verdict.

    from jaxagent import aot
    rec = aot.analyze(jax.jit(f), *abstract_args, topology="v5p:2x2x1")   # any jitted function (`record.analyze`)

Modules: `topology` (compile-only devices, chip figures, the memory to fit), `gpu` (GPU targets: the target
config, the cards' figures), `hlo` (HLO text: trip counts, FLOP and collective accounting), `analytic` (Qwen3 FLOP targets), `memory` (what a run holds beside a program, `Resident`),
`verdict`, `record` (compile and read one program; `run_programs`), `check` (a preset's target, re-checking
stored records), `programs` / `host` / `arms` (the programs of a FrozenLake / host-domain preset's run and those
both share, imported on their own), `coverage` (a jitted call's signature: the list checked against a recorded
run), `report` (docs/aot.md's tables from stored records). The command line: experiments/aot_check.py.
The names below load their module on first use, so that a submodule of plain figures (`gpu`, `verdict`) is read
without JAX (the script's --help).
"""
from jaxagent.lazy import lazy_names

_EXPORTS = {
    "analytic": ("analytic_flops", "cached_forward_flops"),
    "hlo": ("hlo_summary", "loop_collective_bytes", "multipliers", "parse_hlo"),
    "memory": ("Resident", "add_resident", "per_chip_bytes"),
    "record": ("Program", "analyze", "compiled_record", "lowered_digest", "run_programs"),
    "topology": ("CHIPS", "GIB", "chip_specs", "hbm_limit", "topology_devices"),
    "verdict": ("FLOPS_TOLERANCE", "HBM_FRACTION", "foreign_calls", "program_verdict"),
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
