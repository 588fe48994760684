"""The chip catalogue: public specifications of the accelerators Myriad schedules.

Figures are dense BF16 (not sparse), per chip. Sources:
- NVIDIA A100 datasheet (312 TFLOPS BF16, 80 GB HBM2e at 2.0 TB/s, NVLink 600 GB/s, 400 W SXM).
- NVIDIA H100 datasheet (989 TFLOPS BF16 dense SXM, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s, 700 W).
- NVIDIA H200 datasheet (989 TFLOPS, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s, 700 W).
- NVIDIA DGX B200 / HGX B200 figures (about 2,250 TFLOPS dense BF16 per GPU, 180 GB HBM3e at 8 TB/s,
  NVLink 5 at 1,800 GB/s, about 1,000 W).
- AMD Instinct MI300X datasheet (1,307 TFLOPS BF16 dense, 192 GB HBM3 at 5.3 TB/s, 896 GB/s
  Infinity Fabric mesh, 750 W).
- Huawei Ascend 910B public figures (about 320 TFLOPS FP16, 64 GB HBM2e, HCCS about 392 GB/s,
  about 400 W); sources disagree, so treat it as a parameter.
Prices are 2025-26 on-demand list prices per GPU-hour (middle of the published ranges) and the
failure-rate factor is relative to H100 = 1.0: A-series parts fail less often than H-series in
the vendor's reporting; the simulator uses it as a multiplier. See docs in `../shared/references/hetero.md`
and `faults.md` of the project's design notes for the ranges.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ChipSpec:
    name: str
    vendor: str
    model: str
    generation: str
    bf16_tflops: float
    memory_gib: float
    memory_bandwidth_tbps: float
    link_bandwidth_gbps: float  # intra-node scale-up bandwidth, GB/s per chip
    tdp_watts: int
    price_per_gpu_hour: float  # USD
    failure_rate_factor: float

    def as_dict(self) -> dict:
        return asdict(self)


CATALOGUE: tuple[ChipSpec, ...] = (
    ChipSpec("A100-80G", "NVIDIA", "A100 SXM4 80GB", "Ampere", 312.0, 80, 2.0, 600, 400, 1.8, 0.4),
    ChipSpec("H100-SXM", "NVIDIA", "H100 SXM5 80GB", "Hopper", 989.0, 80, 3.35, 900, 700, 3.0, 1.0),
    ChipSpec("H200", "NVIDIA", "H200 SXM 141GB", "Hopper", 989.0, 141, 4.8, 900, 700, 3.8, 1.0),
    ChipSpec("B200", "NVIDIA", "B200 SXM 180GB", "Blackwell", 2250.0, 180, 8.0, 1800, 1000, 6.0, 1.2),
    ChipSpec("MI300X", "AMD", "Instinct MI300X", "CDNA3", 1307.0, 192, 5.3, 896, 750, 1.8, 1.0),
    ChipSpec("Ascend-910B", "Huawei", "Ascend 910B", "Da Vinci", 320.0, 64, 1.6, 392, 400, 1.2, 1.0),
)

BY_NAME: dict[str, ChipSpec] = {chip.name: chip for chip in CATALOGUE}
