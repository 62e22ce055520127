"""TPU topologies compiled for on a host without a TPU, and each chip generation's published figures.

libtpu compiles for a topology such as 'v5p:4x4x4' through compile-only devices
(`jax.experimental.topologies`); no TPU is needed. Install the libtpu that matches jax with
`pip install -e '.[tpu-aot]'`.
"""
from __future__ import annotations

import numpy as np

GIB = 2.0 ** 30
# Per chip: HBM bytes, peak bf16 FLOP/s, HBM bytes/s (public Cloud TPU figures).
CHIPS = {
    "v5p": dict(hbm=95.74e9, flops=459e12, bw=2.765e12),
    "v5e": dict(hbm=16 * GIB, flops=197e12, bw=0.819e12),
    "v6e": dict(hbm=32 * GIB, flops=918e12, bw=1.64e12),
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
    """The compile-only devices of a TPU topology such as 'v5p:4x4x4' (single-chip 'v5p:1x1x1' too)."""
    from jax.experimental import topologies  # libtpu is loaded only by a caller that compiles for a TPU
    kw = {}
    dims = topology_dims(name)
    if int(np.prod(dims)) == 1:  # one chip: the default host bounds (2x2x1) do not divide it
        kw["chips_per_host_bounds"] = tuple([1] * len(dims))
    return topologies.get_topology_desc(name, "tpu", **kw).devices


def chip_specs(topology: str) -> dict:
    """{'hbm': bytes, 'flops': peak bf16 FLOP/s, 'bw': HBM bytes/s} of the topology's chip generation."""
    gen = topology.split(":")[0]
    if gen not in CHIPS:
        raise ValueError(f"unknown TPU generation {gen!r} in topology {topology!r} (known: {sorted(CHIPS)})")
    return CHIPS[gen]
