"""Default fault and recovery physics. Every number is configurable and has a source; change a
default only with a cited source, never to flatter a result.

- Interruption rate 4.74e-4 per GPU-day: Llama 3 405B, 419 unexpected interruptions in 54 days on
  16,384 H100 = 419 / 16,384 / 54 (The Llama 3 Herd of Models, arXiv 2407.21783, section 3.3.4;
  its 466 interruptions in total include 47 planned ones, which are not faults).
- Cause mix: the counts of Llama 3's Table 5 (419 unexpected interruptions).
- Repeat faults concentrate on a few lemon nodes (Lablup/SKT on 504 B200: the top 3 nodes caused
  more than half of the exclusions; Meta RSC, arXiv 2410.21680): 1% of nodes fault 10x as often.
- Node repair time: lognormal with median 0.85 days and mean 5.5 days (StepFun's production trace,
  InfiniteHBD, SIGCOMM'25). A GPU reset takes the GPU out for 5 minutes, a reboot the node for 15.
- Detection: 30 s for XID-reported faults, 300 s for hangs found by the collective watchdog,
  60 s for a lost heartbeat (engine.faults).
- Restart: rescheduling + process start + communicator initialization growing with job size
  (MegaScale: under 30 s above 10k GPUs with optimized initialization) + checkpoint load.
- Checkpoint state: 16 bytes per parameter (bf16 weights, fp32 master weights and Adam moments).
- Storage: durable storage bandwidth scales with the job: 2 TB/s per 16,384 GPUs (122 MB/s per
  GPU), what Meta's Tectonic sustained for Llama 3's checkpoints; 50 GB/s GPU-to-host copy per GPU
  (PCIe Gen5 x16); 25 GB/s to load a shard from a peer's host memory (one 200 Gb/s NIC). A small
  job is limited by its nodes' storage NICs (100 Gb/s each) and gets at least a 200 GB/s share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# cause -> (count in Llama 3 Table 5, fault source, XID or None, memory readable after the fault)
LLAMA3_CAUSES: dict[str, tuple[int, str, int | None]] = {
    "faulty_gpu": (148, "xid", 79),
    "gpu_hbm3": (72, "xid", 95),
    "software": (54, "xid", 13),
    "network": (35, "link_down", None),
    "host_maintenance": (32, "host_maintenance", None),
    "gpu_sram": (19, "xid", 48),
    "gpu_gsp": (17, "xid", 119),
    "nic": (7, "link_down", None),
    "nccl_watchdog": (7, "job_hang", None),
    "silent_data_corruption": (6, "job_hang", None),
    "gpu_thermal": (6, "xid", 62),
    "host_other": (16, "heartbeat_loss", None),
}


@dataclass(frozen=True)
class Physics:
    gpu_interruptions_per_day: float = 419 / 16384 / 54  # 4.74e-4
    causes: dict[str, tuple[int, str, int | None]] = field(default_factory=lambda: dict(LLAMA3_CAUSES))
    lemon_node_fraction: float = 0.01
    lemon_rate_factor: float = 10.0
    repair_median_days: float = 0.85
    repair_mean_days: float = 5.5
    gpu_reset_s: float = 300.0
    node_reboot_s: float = 900.0
    reschedule_s: float = 5.0  # choosing a spare and swapping it in
    process_start_s: float = 20.0  # container / process start on the new set of nodes
    comm_init_s_per_doubling: float = 2.0  # communicator init: 2 s x log2(GPUs): 27 s at 10k, 33 s at 100k
    bytes_per_parameter: float = 16.0
    storage_gbps_per_gpu: float = 2000.0 / 16384
    storage_floor_gbps: float = 200.0  # what a small job can get from the file system
    node_storage_gbps: float = 12.5  # one 100 Gb/s storage NIC per node
    host_copy_gbps: float = 50.0
    peer_load_gbps: float = 25.0  # a replacement node loads its shard from a peer's host memory

    def cause_shares(self) -> tuple[list[str], list[float]]:
        names = list(self.causes)
        counts = [self.causes[n][0] for n in names]
        total = float(sum(counts))
        return names, [c / total for c in counts]

    def repair_sigma(self) -> float:
        return math.sqrt(2.0 * math.log(self.repair_mean_days / self.repair_median_days))

    def out_of_service_s(self, returns: str, rng) -> float | None:
        """How long what a fault took out of service stays out, by how it returns (a fault
        verdict's ``returns``: "reset", "reboot", "repair"); None when it does not come back by
        itself (a lemon waits for an operator) or nothing left service. A repair is drawn from
        ``rng`` (a NumPy Generator)."""
        if returns == "reset":
            return self.gpu_reset_s
        if returns == "reboot":
            return self.node_reboot_s
        if returns == "repair":
            return float(rng.lognormal(math.log(self.repair_median_days), self.repair_sigma())) * 86_400.0
        return None

    def storage_gbps(self, gpus: int, gpus_per_node: int = 8) -> float:
        """Durable-storage bandwidth a job of this size gets: its share of the file system (never
        below the file system's floor), but no more than its nodes' storage NICs can carry."""
        share = max(self.storage_gbps_per_gpu * gpus, self.storage_floor_gbps)
        return min(share, self.node_storage_gbps * max(1, gpus // gpus_per_node))

    def restart_s(self, gpus: int) -> float:
        """Reschedule + process start + communicator initialization (checkpoint load not included)."""
        return self.reschedule_s + self.process_start_s + self.comm_init_s(gpus)

    def comm_init_s(self, gpus: int) -> float:
        return self.comm_init_s_per_doubling * math.log2(max(gpus, 2))
