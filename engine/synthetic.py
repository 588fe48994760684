"""Build a ``TopologySnapshot`` straight from a topology document, without a database.

The simulator and the engine-only benchmarks use it; the node and GPU order is the same as the
database builder's, so a snapshot built here matches one loaded from a cluster built from the
same document.
"""

from __future__ import annotations

import numpy as np

from engine.chips import CATALOGUE
from engine.topology import TopologySnapshot
from engine.topology_spec import TopologySpec


def snapshot_from_spec(spec: TopologySpec, chip_names: tuple[str, ...] | None = None) -> TopologySnapshot:
    chip_names = chip_names or tuple(c.name for c in CATALOGUE)
    chip_index = {name: i for i, name in enumerate(chip_names)}
    region_names, dc_names, dc_region, pod_names, pod_dc = [], [], [], [], []
    rack_pod, node_rack, node_chip, node_spare, node_gpus, hostnames = [], [], [], [], [], []
    for region in spec.regions:
        region_names.append(region.name)
        for dc in region.datacenters:
            dc_names.append(dc.name)
            dc_region.append(len(region_names) - 1)
            for pod in dc.pods:
                pod_names.append(f"{dc.name}-{pod.name}")
                pod_dc.append(len(dc_names) - 1)
                first_spare = pod.nodes - pod.spare_nodes
                for r in range(pod.racks):
                    rack_pod.append(len(pod_names) - 1)
                    for n in range(pod.nodes_per_rack):
                        node_rack.append(len(rack_pod) - 1)
                        node_chip.append(chip_index[pod.chip_type])
                        node_spare.append(r * pod.nodes_per_rack + n >= first_spare)
                        node_gpus.append(pod.gpus_per_node)
                        hostnames.append(f"{dc.name}-{pod.name}-r{r + 1:02d}-n{n + 1:02d}")
    gpus_per_node = np.array(node_gpus, dtype=np.int64)
    num_gpus = int(gpus_per_node.sum())
    gpu_node = np.repeat(np.arange(len(node_gpus), dtype=np.int32), gpus_per_node)
    starts = np.repeat(np.cumsum(gpus_per_node) - gpus_per_node, gpus_per_node)
    return TopologySnapshot(
        gpu_id=np.arange(1, num_gpus + 1, dtype=np.int64),
        gpu_node=gpu_node,
        gpu_slot=(np.arange(num_gpus) - starts).astype(np.int16),
        gpu_state=np.zeros(num_gpus, dtype=np.int8),
        gpu_health=np.zeros(num_gpus, dtype=np.int8),
        node_id=np.arange(1, len(node_gpus) + 1, dtype=np.int64),
        node_rack=np.array(node_rack, dtype=np.int32),
        node_chip=np.array(node_chip, dtype=np.int16),
        node_state=np.zeros(len(node_gpus), dtype=np.int8),
        node_spare=np.array(node_spare, dtype=bool),
        node_hostname=tuple(hostnames),
        rack_id=np.arange(1, len(rack_pod) + 1, dtype=np.int64),
        rack_pod=np.array(rack_pod, dtype=np.int32),
        pod_id=np.arange(1, len(pod_names) + 1, dtype=np.int64),
        pod_datacenter=np.array(pod_dc, dtype=np.int32),
        datacenter_id=np.arange(1, len(dc_names) + 1, dtype=np.int64),
        datacenter_region=np.array(dc_region, dtype=np.int32),
        region_id=np.arange(1, len(region_names) + 1, dtype=np.int64),
        chip_names=tuple(chip_names),
        names={"region": tuple(region_names), "datacenter": tuple(dc_names), "pod": tuple(pod_names)},
    )
