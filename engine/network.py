"""The network of the simulated fleet: rack uplinks, pod uplinks and datacenter links (pure, NumPy).

Capacities follow the fabric defaults of the step-time model (engine.steptime.Fabric): one
400 Gb/s NIC per GPU, non-blocking up to the pod (a rack's uplink carries all of its GPUs' NICs),
2:1 oversubscribed between pods, and the datacenter links of the inventory.

Traffic comes from the jobs placed on the fleet and their modelled plans: a training job's
gradient all-reduce (2(d-1)/d x 2N/(t*p) bytes per GPU per step) and pipeline sends
(2m x b*s*h*2/t bytes per boundary GPU per step), divided by its modelled step time, leave the
rack when the job spans racks and the pod when it spans pods; across datacenters the hierarchical
all-reduce sends 2(k-1)/k x 2N bytes per step over each datacenter link it uses. Utilization is
load / capacity (above 1: congested); error counters grow with utilization. A link-down fault on
a rack uplink interrupts every job that crosses it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from engine.steptime import MODELS, Fabric, ModelSpec, NoFeasiblePlan, best_plan
from engine.topology import TopologySnapshot

# corrected link errors (FEC/CRC) per TB carried, at 100% utilization; a modelling assumption (no
# published fleet figure): the counters only show where links run hot
ERRORS_PER_TB_AT_FULL_LOAD = 0.02


def model_for(parameters: float) -> ModelSpec:
    """A dense transformer of ``parameters`` shaped like the nearest Llama 3 model."""
    shape = min(MODELS.values(), key=lambda m: abs(np.log(m.params / max(parameters, 1.0))))
    return ModelSpec(parameters, shape.layers, shape.hidden, shape.seq_len, shape.batch_tokens, shape.name)


@lru_cache(maxsize=4096)
def traffic_per_gpu(parameters: float, chip: str, gpus: int) -> tuple[float, float]:
    """(inter-node bytes/s per GPU, cross-datacenter bytes/s per datacenter) of a training job."""
    if gpus < 2 or parameters <= 0:
        return 0.0, 0.0
    model = model_for(parameters)
    try:
        plan = best_plan(model, chip, gpus)
    except (NoFeasiblePlan, KeyError):
        return 0.0, 0.0
    d, tp, pp = plan.dp, plan.tp, plan.pp
    dp_bytes = 2 * (d - 1) / d * 2 * model.params / (tp * pp) if d > 1 else 0.0
    pp_bytes = (
        2 * plan.micro_batches * plan.micro_batch * model.seq_len * model.hidden * 2 / tp if pp > 1 else 0.0
    )
    cross_dc = 2 * 2 * model.params / plan.step_s
    return (dp_bytes + pp_bytes) / plan.step_s, cross_dc


class Network:
    def __init__(
        self,
        topo: TopologySnapshot,
        fabric: Fabric | None = None,
        datacenter_links: dict[tuple[int, int], float] | None = None,
    ):
        self.topo = topo
        self.fabric = fabric or Fabric()
        nic = self.fabric.nic_gbps_per_gpu * 1e9
        gpu_rack = topo.node_rack[topo.gpu_node]
        self.gpu_rack = gpu_rack.astype(np.int64)
        self.gpu_pod = topo.rack_pod[self.gpu_rack].astype(np.int64)
        self.gpu_dc = topo.pod_datacenter[self.gpu_pod].astype(np.int64)
        n_racks, n_pods = len(topo.rack_id), len(topo.pod_id)
        self.rack_capacity = np.bincount(self.gpu_rack, minlength=n_racks) * nic
        self.pod_capacity = (
            np.bincount(self.gpu_pod, minlength=n_pods) * nic / self.fabric.pod_oversubscription
        )
        default_link = self.fabric.datacenter_link_gbps * 1e9
        self.dc_links = {tuple(sorted(k)): v * 1e9 / 8 for k, v in (datacenter_links or {}).items()}
        self.default_dc_link = default_link
        self.rack_load = np.zeros(n_racks)
        self.pod_load = np.zeros(n_pods)
        self.dc_load: dict[tuple[int, int], float] = {}
        self.rack_errors = np.zeros(n_racks, dtype=np.int64)
        self.pod_errors = np.zeros(n_pods, dtype=np.int64)

    def dc_capacity(self, pair: tuple[int, int]) -> float:
        return self.dc_links.get(pair, self.default_dc_link)

    def load(self, jobs: list[tuple[np.ndarray, float, float]]) -> None:
        """``jobs``: (GPU indices, bytes/s per GPU leaving the node, cross-datacenter bytes/s)."""
        rack_idx, rack_w, pod_idx, pod_w = [], [], [], []
        self.dc_load = {}
        for gpus, per_gpu, cross in jobs:
            if per_gpu <= 0 or len(gpus) < 2:
                continue
            racks = self.gpu_rack[gpus]
            if racks.min() == racks.max():
                continue  # inside one rack: the traffic never leaves the rack switch
            rack_idx.append(racks)
            rack_w.append(np.full(len(gpus), per_gpu))
            pods = self.gpu_pod[gpus]
            if pods.min() == pods.max():
                continue
            pod_idx.append(pods)
            pod_w.append(np.full(len(gpus), per_gpu))
            dcs = np.unique(self.gpu_dc[gpus])
            k = len(dcs)
            for i in range(k):
                for j in range(i + 1, k):
                    # hierarchical all-reduce: each link carries 2S/k of the 2S per step
                    pair = (int(dcs[i]), int(dcs[j]))
                    self.dc_load[pair] = self.dc_load.get(pair, 0.0) + cross / k
        self.rack_load = self._sum(rack_idx, rack_w, len(self.rack_load))
        self.pod_load = self._sum(pod_idx, pod_w, len(self.pod_load))

    @staticmethod
    def _sum(index: list[np.ndarray], weights: list[np.ndarray], size: int) -> np.ndarray:
        if not index:
            return np.zeros(size)
        return np.bincount(np.concatenate(index), weights=np.concatenate(weights), minlength=size)

    def utilization(self) -> dict[str, np.ndarray | dict]:
        return {
            "rack": self.rack_load / np.maximum(self.rack_capacity, 1.0),
            "pod": self.pod_load / np.maximum(self.pod_capacity, 1.0),
            "datacenter": {pair: load / self.dc_capacity(pair) for pair, load in self.dc_load.items()},
        }

    def count_errors(self, seconds: float, rng: np.random.Generator) -> None:
        """Corrected errors over ``seconds`` at the current loads (more traffic, more errors)."""
        util = self.utilization()
        tiers = (
            (self.rack_load, util["rack"], self.rack_errors),
            (self.pod_load, util["pod"], self.pod_errors),
        )
        for load, used, errors in tiers:
            errors += rng.poisson(load * seconds / 1e12 * ERRORS_PER_TB_AT_FULL_LOAD * np.minimum(used, 2.0))

    def jobs_crossing_rack(self, rack: int, jobs: dict[int, np.ndarray]) -> list[int]:
        """Jobs with GPUs in ``rack`` that also use other racks: their traffic crosses its uplink."""
        out = []
        for job_id, gpus in jobs.items():
            racks = self.gpu_rack[gpus]
            if (racks == rack).any() and racks.min() != racks.max():
                out.append(job_id)
        return out


def datacenter_links(spec) -> dict[tuple[int, int], float]:
    """{(datacenter index, datacenter index): Gb/s} of a topology spec, in snapshot order."""
    order = [dc.name for _, dc in spec.datacenters()]
    return {
        tuple(sorted((order.index(link.a[1]), order.index(link.b[1])))): link.bandwidth_gbps
        for link in spec.links
        if link.a[1] in order and link.b[1] in order
    }
