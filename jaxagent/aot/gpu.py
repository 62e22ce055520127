"""NVIDIA GPU targets compiled for on a host without a GPU: H100 and H200, one host of N cards.

XLA:GPU compiles without a device from a `GpuTargetConfigProto` (the card's compute capability, cores,
memory and the cuDNN version to plan for), given to the CUDA plugin's compile-only topology
(`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=TEXT, topology="1x1xN")`:
1 slice, 1 host, N cards on it). `target_config` writes that text from `CARDS`; no spec file is read.
Install the plugin, its PJRT runtime and cuDNN with `pip install -e '.[gpu-aot]'`.

A GPU compile that needs more memory than the card has still succeeds, so the check gates memory itself
(`usable_bytes`): JAX's GPU client preallocates XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of the
card's memory as the pool every buffer comes from; the rest is left to CUDA, cuBLAS and cuDNN.
"""
from __future__ import annotations

import functools

# Per card. Datasheet figures (NVIDIA H100 Tensor Core GPU datasheet, SXM5; NVIDIA H200 Tensor Core GPU
# datasheet): HBM 80 GB / 141 GB; dense bf16 989 TFLOP/s (the datasheets' 1,979 is with 2:4 sparsity);
# HBM bandwidth 3.35 / 4.8 TB/s. `memory` is the total a device reports to CUDA (cudaMemGetInfo), what the
# preallocation fraction is taken of. The compiler fields: SM 9.0 (Hopper), 132 SMs at 1.98 GHz boost,
# 50 MiB L2, 228 KiB shared memory per SM (227 KiB per block opted in), 64 Ki registers per SM.
CARDS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", memory=84_942_979_072, flops=989e12, bw=3.35e12),
    "h200": dict(name="NVIDIA H200 141GB HBM3e", memory=151_397_597_184, flops=989e12, bw=4.8e12),
}
HOPPER = dict(core_count=132, clock_rate_ghz=1.98, l2_cache_size=50 << 20, threads_per_block_limit=1024,
              threads_per_warp=32, threads_per_core_limit=2048, fpus_per_core=128, shared_memory_per_block=48 << 10,
              shared_memory_per_block_optin=227 << 10, shared_memory_per_core=228 << 10,
              registers_per_core_limit=65536, registers_per_block_limit=65536, block_dim_limit_x=2 ** 31 - 1,
              block_dim_limit_y=65535, block_dim_limit_z=65535)
CUDNN_VERSION = (9, 8, 0)  # the oldest cuDNN the plugin accepts (jax-cuda12-plugin: nvidia-cudnn-cu12>=9.8)
MEM_FRACTION = 0.75  # JAX's default XLA_PYTHON_CLIENT_MEM_FRACTION (its GPU memory preallocation)


def is_gpu(topology: str) -> bool:
    """Whether a topology name '<card>:1x1x<N>' names a GPU card of `CARDS`."""
    return topology.split(":")[0] in CARDS


def card(topology: str) -> dict:
    """The `CARDS` entry of a GPU topology name; ValueError naming the known cards otherwise."""
    name = topology.split(":")[0]
    if name not in CARDS:
        raise ValueError(f"unknown GPU {name!r} in topology {topology!r} (known: {sorted(CARDS)})")
    return CARDS[name]


def target_config(name: str) -> str:
    """The `GpuTargetConfigProto` text of card `name` (a `CARDS` key)."""
    c = CARDS[name]
    fields = {**HOPPER, "memory_bandwidth": int(c["bw"]), "device_memory_size": c["memory"]}
    info = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    major, minor, patch = CUDNN_VERSION
    return (f"gpu_device_info {{\n{info}\n  cuda_compute_capability {{ major: 9 minor: 0 }}\n}}\n"
            f'platform_name: "CUDA"\ndnn_version_info {{ major: {major} minor: {minor} patch: {patch} }}\n'
            f'device_description_str: "{c["name"]}"\n')


def gpu_count(topology: str) -> int:
    """N of a GPU topology name '<card>:1x1x<N>' (one host of N cards)."""
    card(topology)
    grid = topology.partition(":")[2]
    dims = grid.split("x")
    if len(dims) != 3 or not all(d.isdigit() for d in dims) or dims[:2] != ["1", "1"] or int(dims[2]) < 1:
        raise ValueError(f"GPU topology {topology!r} is not '<card>:1x1x<N>' (one host of N cards, e.g. 'h100:1x1x8')")
    return int(dims[2])


@functools.lru_cache(maxsize=8)
def gpu_devices(topology: str) -> tuple:
    """The compile-only devices of a GPU topology such as 'h100:1x1x8'; RuntimeError saying what to install when
    the CUDA plugin is missing."""
    n = gpu_count(topology)
    from jax.experimental import topologies  # the CUDA plugin is loaded only by a caller that compiles for a GPU
    try:
        desc = topologies.get_topology_desc(platform="cuda", target_config=target_config(topology.split(":")[0]),
                                            topology=f"1x1x{n}")
    except (NotImplementedError, RuntimeError) as e:
        raise RuntimeError(f"cannot compile for {topology}: {e}; install the CUDA plugin with "
                           "pip install -e '.[gpu-aot]'") from None
    return tuple(desc.devices)


def usable_bytes(topology: str, mem_fraction: float = MEM_FRACTION) -> float:
    """Bytes of one card a run's buffers may take: the preallocated pool, `mem_fraction` of the card's memory."""
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction {mem_fraction} is not in (0, 1]")
    return card(topology)["memory"] * mem_fraction
