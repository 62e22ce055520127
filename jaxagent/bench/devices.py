"""Peak dense bf16 FLOP/s, HBM bandwidth and HBM size of the accelerators users run (`DEVICES`), chosen by JAX's
`device_kind` string (`device_spec`; `custom_spec` for a chip the caller describes): every benchmark figure gets
its roofline beside it.

Vendor specifications, per chip. NVIDIA's datasheets print Tensor Core FLOP/s "with sparsity", twice the dense
rate, so the dense figure here is half the printed one: H100 SXM5 80 GB 1,979 -> 989 TFLOP/s, HBM3 3.35 TB/s; H100
PCIe 80 GB 1,513 -> 756, HBM2e 2.0 TB/s; H100 NVL 94 GB 1,671 -> 835, HBM3 3.9 TB/s (NVIDIA H100 Tensor Core GPU
datasheet, nvidia.com/en-us/data-center/h100); H200 SXM 141 GB 1,979 -> 989, HBM3e 4.8 TB/s; H200 NVL 141 GB 1,671
-> 835, 4.8 TB/s (H200 datasheet, nvidia.com/en-us/data-center/h200); A100 312 dense (624 with sparsity), HBM2e
2,039 GB/s (SXM4 80 GB), 1,935 GB/s (PCIe 80 GB), 1,555 GB/s (40 GB) (A100 datasheet,
nvidia.com/en-us/data-center/a100). Google Cloud TPU v5e: 197 TFLOP/s bf16, 819 GB/s, 16 GB HBM2
(cloud.google.com/tpu/docs/v5e); v5p: 459, 2,765 GB/s, 95 GB HBM2e (cloud.google.com/tpu/docs/v5p); v6e
(Trillium): 918, 1,640 GB/s, 32 GB (cloud.google.com/tpu/docs/v6e). A kind not in the table gets no spec
(`device_spec` returns None): the benchmark then prints its figures without roofline fractions and says so,
unless the caller gives the peak and bandwidth itself.
"""
from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One chip's vendor figures: peak dense bf16 FLOP/s, HBM bytes/s and HBM bytes."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    source: str

    def fields(self) -> dict:
        return {"spec_name": self.name, "peak_tflops": self.peak_flops / 1e12,
                "hbm_gbps": self.hbm_bytes_per_s / 1e9, "hbm_gb": self.hbm_bytes / 1e9, "spec_source": self.source}


_NV = "NVIDIA datasheet (dense = half the 'with sparsity' figure)"
DEVICES: dict[str, DeviceSpec] = {s.name: s for s in (
    DeviceSpec("H100 SXM", 989e12, 3.35e12, 80e9, _NV),
    DeviceSpec("H100 PCIe", 756e12, 2.0e12, 80e9, _NV),
    DeviceSpec("H100 NVL", 835e12, 3.9e12, 94e9, _NV),
    DeviceSpec("H200 SXM", 989e12, 4.8e12, 141e9, _NV),
    DeviceSpec("H200 NVL", 835e12, 4.8e12, 141e9, _NV),
    DeviceSpec("A100 SXM 80GB", 312e12, 2.039e12, 80e9, _NV),
    DeviceSpec("A100 PCIe 80GB", 312e12, 1.935e12, 80e9, _NV),
    DeviceSpec("A100 40GB", 312e12, 1.555e12, 40e9, _NV),
    DeviceSpec("TPU v5e", 197e12, 0.819e12, 16e9, "Cloud TPU v5e documentation"),
    DeviceSpec("TPU v5p", 459e12, 2.765e12, 95e9, "Cloud TPU v5p documentation"),
    DeviceSpec("TPU v6e", 918e12, 1.64e12, 32e9, "Cloud TPU v6e documentation"),
)}


def device_spec(device_kind: str) -> Optional[DeviceSpec]:
    """The spec of a JAX `device_kind` ('NVIDIA H200', 'NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB',
    'TPU v5 lite', 'TPU v5p', 'TPU v6 lite', ...), or None for a kind not in the table (CPU included)."""
    k = device_kind.lower().replace("-", " ")
    if "h200" in k:
        return DEVICES["H200 NVL" if "nvl" in k else "H200 SXM"]
    if "h100" in k:
        return DEVICES["H100 NVL" if "nvl" in k else "H100 PCIe" if "pcie" in k else "H100 SXM"]
    if "a100" in k:
        if "40gb" in k:
            return DEVICES["A100 40GB"]
        return DEVICES["A100 PCIe 80GB" if "pcie" in k else "A100 SXM 80GB"]
    if "tpu" in k:
        if "v6" in k:
            return DEVICES["TPU v6e"] if ("lite" in k or "v6e" in k) else None
        if "v5" in k:
            return DEVICES["TPU v5e"] if ("lite" in k or "v5e" in k) else DEVICES["TPU v5p"]
    return None


def custom_spec(peak_tflops: float, hbm_gbps: float, hbm_gb: float = 0.0) -> DeviceSpec:
    """A spec given by the caller (a chip not in the table, or a check of the arithmetic)."""
    if not (peak_tflops > 0 and hbm_gbps > 0 and hbm_gb >= 0):
        raise ValueError(f"need peak_tflops > 0 and hbm_gbps > 0, got {peak_tflops}, {hbm_gbps}")
    return DeviceSpec("given", peak_tflops * 1e12, hbm_gbps * 1e9, hbm_gb * 1e9, "given on the command line")
