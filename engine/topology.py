"""The topology snapshot: the cluster as NumPy arrays indexed by a stable GPU index.

The scheduler, the simulator and the dashboard all read the cluster through this one shape.
GPU ``i`` lives on node ``gpu_node[i]``; a node's rack, pod, datacenter and region are node
arrays, so every per-GPU domain lookup is one fancy-index and every per-domain count one
``np.bincount``, never a Python loop over GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from engine.states import GPU_HEALTH_CODE, GPU_STATE_CODE, NODE_STATE_CODE


@dataclass(frozen=True, eq=False)
class TopologySnapshot:
    # GPUs, ordered by (node, index on node)
    gpu_id: np.ndarray  # int64 database id
    gpu_node: np.ndarray  # int32 node index
    gpu_slot: np.ndarray  # int16 index on the node
    gpu_state: np.ndarray  # int8 code of engine.states.GPU_STATES
    gpu_health: np.ndarray  # int8 code of engine.states.GPU_HEALTH
    # nodes
    node_id: np.ndarray  # int64
    node_rack: np.ndarray  # int32 rack index
    node_chip: np.ndarray  # int16 chip-type index
    node_state: np.ndarray  # int8 code of engine.states.NODE_STATES
    node_spare: np.ndarray  # bool
    node_hostname: tuple[str, ...]
    # racks, pods, datacenters, regions: parent index and database id
    rack_id: np.ndarray
    rack_pod: np.ndarray
    pod_id: np.ndarray
    pod_datacenter: np.ndarray
    datacenter_id: np.ndarray
    datacenter_region: np.ndarray
    region_id: np.ndarray
    chip_names: tuple[str, ...]
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # per node: until when a draining node lets its running work finish (seconds; NaN: no deadline,
    # the work leaves at once). None: no node has a deadline.
    node_drain_deadline: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.gpu_id)
        for attr in ("gpu_node", "gpu_slot", "gpu_state", "gpu_health"):
            if len(getattr(self, attr)) != n:
                raise ValueError(f"{attr} has {len(getattr(self, attr))} entries for {n} GPUs")
        m = len(self.node_id)
        for attr in ("node_rack", "node_chip", "node_state", "node_spare"):
            if len(getattr(self, attr)) != m:
                raise ValueError(f"{attr} has {len(getattr(self, attr))} entries for {m} nodes")
        if n and (self.gpu_node.min() < 0 or self.gpu_node.max() >= m):
            raise ValueError("gpu_node points outside the node table")

    # --- sizes -------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return len(self.gpu_id)

    @property
    def num_nodes(self) -> int:
        return len(self.node_id)

    def domain_count(self, level: str) -> int:
        return {
            "node": len(self.node_id),
            "rack": len(self.rack_id),
            "pod": len(self.pod_id),
            "datacenter": len(self.datacenter_id),
            "region": len(self.region_id),
        }[level]

    # --- node -> domain and GPU -> domain maps (computed once) --------------------------------
    @cached_property
    def node_pod(self) -> np.ndarray:
        return self.rack_pod[self.node_rack]

    @cached_property
    def node_datacenter(self) -> np.ndarray:
        return self.pod_datacenter[self.node_pod]

    @cached_property
    def node_region(self) -> np.ndarray:
        return self.datacenter_region[self.node_datacenter]

    def node_domain(self, level: str) -> np.ndarray:
        if level == "node":
            return np.arange(self.num_nodes, dtype=np.int32)
        return {
            "rack": self.node_rack,
            "pod": self.node_pod,
            "datacenter": self.node_datacenter,
            "region": self.node_region,
        }[level]

    def gpu_domain(self, level: str) -> np.ndarray:
        """The index of the ``level`` domain holding each GPU."""
        if level == "node":
            return self.gpu_node
        return self.node_domain(level)[self.gpu_node]

    @cached_property
    def gpu_chip(self) -> np.ndarray:
        return self.node_chip[self.gpu_node]

    # --- what can be placed on ----------------------------------------------------------------
    def usable(self) -> np.ndarray:
        """GPUs in service: GPU and node ready, health not critical (spare nodes included)."""
        return (
            (self.gpu_state == GPU_STATE_CODE["ready"])
            & (self.node_state[self.gpu_node] == NODE_STATE_CODE["ready"])
            & (self.gpu_health != GPU_HEALTH_CODE["critical"])
        )

    def schedulable(self) -> np.ndarray:
        """GPUs that new work may be placed on: usable and not on a spare node. Spare nodes stay
        idle for fault recovery (engine.recovery takes them first)."""
        return self.usable() & ~self.node_spare[self.gpu_node]

    def drain_deadlines(self, now: float) -> np.ndarray:
        """Per node, the time its running work must leave by: NaN for a node that is not draining,
        ``now`` for one draining without a deadline."""
        out = np.full(self.num_nodes, np.nan)
        draining = self.node_state == NODE_STATE_CODE["draining"]
        out[draining] = now
        if self.node_drain_deadline is not None:
            has = draining & ~np.isnan(self.node_drain_deadline)
            out[has] = self.node_drain_deadline[has]
        return out

    def count_by(self, level: str, mask: np.ndarray | None = None) -> np.ndarray:
        """Number of GPUs (or of those in ``mask``) in each ``level`` domain."""
        domains = self.gpu_domain(level)
        weights = None if mask is None else mask.astype(np.int32)
        return np.bincount(domains, weights=weights, minlength=self.domain_count(level)).astype(np.int64)

    def count_by_chip(self, mask: np.ndarray | None = None) -> dict[str, int]:
        weights = None if mask is None else mask.astype(np.int32)
        counts = np.bincount(self.gpu_chip, weights=weights, minlength=len(self.chip_names))
        return {name: int(counts[i]) for i, name in enumerate(self.chip_names)}
