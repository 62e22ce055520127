"""TPU topologies and GPU targets compiled for on a host without them, and each chip's published figures.

libtpu compiles for a topology such as 'v5p:4x4x4' through compile-only devices
(`jax.experimental.topologies`); no TPU is needed. Install the libtpu that matches jax with
`pip install -e '.[tpu-aot]'`. A GPU target is named '<card>:1x1x<N>' (N cards of one host, e.g. 'h100:1x1x8';
`jaxagent.aot.gpu`), compiled by the CUDA plugin: `pip install -e '.[gpu-aot]'`.
"""
from __future__ import annotations

import numpy as np

from jaxagent.aot import gpu

GIB = 2.0 ** 30
# Per chip: HBM bytes, peak bf16 FLOP/s, HBM bytes/s (public Cloud TPU figures).
CHIPS = {
    "v5p": dict(hbm=95.74e9, flops=459e12, bw=2.765e12, platform="tpu"),
    "v5e": dict(hbm=16 * GIB, flops=197e12, bw=0.819e12, platform="tpu"),
    "v6e": dict(hbm=32 * GIB, flops=918e12, bw=1.64e12, platform="tpu"),
}


def topology_dims(name: str) -> list[int]:
    """The chip grid of a topology name '<generation>:<A>x<B>[x<C>]' (e.g. 'v5p:4x4x4' -> [4, 4, 4])."""
    gen, _, grid = name.partition(":")
    try:
        dims = [int(x) for x in grid.split("x")]
    except ValueError:
        dims = []
    if not gen or not dims or min(dims) < 1:
        raise ValueError(f"topology {name!r} is not '<generation>:<A>x<B>[x<C>]' with positive sizes "
                         "(e.g. 'v5p:4x4x4')")
    return dims


def topology_devices(name: str):
    """The compile-only devices of a TPU topology such as 'v5p:4x4x4' (single-chip 'v5p:1x1x1' too) or a GPU
    target such as 'h100:1x1x8'."""
    if gpu.is_gpu(name):
        return list(gpu.gpu_devices(name))
    from jax.experimental import topologies  # libtpu is loaded only by a caller that compiles for a TPU
    kw = {}
    dims = topology_dims(name)
    if int(np.prod(dims)) == 1:  # one chip: the default host bounds (2x2x1) do not divide it
        kw["chips_per_host_bounds"] = tuple([1] * len(dims))
    return topologies.get_topology_desc(name, "tpu", **kw).devices


def chip_specs(topology: str) -> dict:
    """{'hbm': bytes, 'flops': peak bf16 FLOP/s, 'bw': HBM bytes/s, 'platform': 'tpu' | 'gpu'} of the topology's
    chip generation or GPU card (`gpu.CARDS`: 'hbm' is the memory the card reports)."""
    if gpu.is_gpu(topology):
        c = gpu.card(topology)
        return dict(hbm=float(c["memory"]), flops=c["flops"], bw=c["bw"], platform="gpu")
    gen = topology.split(":")[0]
    if gen not in CHIPS:
        raise ValueError(f"unknown TPU generation or GPU {gen!r} in topology {topology!r} (known: "
                         f"{sorted(CHIPS) + sorted(gpu.CARDS)})")
    return CHIPS[gen]


def hbm_limit(topology: str, hbm_gib=None, gpu_mem_fraction: float = gpu.MEM_FRACTION) -> tuple[float, str]:
    """(bytes, what they are) a program and what the run holds beside it may take on one chip of `topology`: a TPU
    chip's HBM, or min(that, `hbm_gib`) where the TPU stands in for a GPU of `hbm_gib` GiB; a GPU card's
    preallocated pool, `gpu_mem_fraction` of its memory (`gpu.usable_bytes`)."""
    spec = chip_specs(topology)
    if spec["platform"] == "gpu":
        pool = gpu.usable_bytes(topology, gpu_mem_fraction)
        return pool, (f"{gpu_mem_fraction:g} (XLA_PYTHON_CLIENT_MEM_FRACTION, JAX's default 0.75) of the card's "
                      f"{spec['hbm'] / GIB:.1f} GiB: the pool JAX preallocates")
    if hbm_gib is None:
        return spec["hbm"], "the chip's HBM"
    return min(spec["hbm"], hbm_gib * GIB), f"min(chip HBM, {hbm_gib:g} GiB of the GPU it stands in for)"
