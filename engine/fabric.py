"""The fabric above the nodes' NIC ports and the load on each of its links (pure, NumPy).

Rail-optimized by default (the HPN and Meta designs, engine.steptime.Fabric): port ``r`` of
every node of a pod goes to that pod's leaf switch of rail ``r``; each leaf goes up to the pod's
spines, non-blocking; a pod's spines go to the datacenter's core 2:1 oversubscribed, and the
datacenters are joined by the inventory's links. ``design="rack"`` is the classic tree instead:
every port of a rack goes to the rack's top-of-rack switch.

The load of a switch's uplink is the sum of the ports below it (the host counters cannot tell
traffic that turns at the leaf from traffic that goes up, so this is its upper bound); its
utilization is that over the uplink's capacity. A leaf's congestion is what its ports show: the
worst port's p99 utilization over 10 ms windows and the CNPs its ports sent per second; a pod
uplink's, oversubscribed above the leaves, its own utilization and its ports' CNPs. The
same arrays come from the agents' reports (monitoring.telemetry.fabric) and from the simulated
fleet's modelled traffic (sim.fleet_network), so the views, the congestion records and
placement read one figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.topology import TopologySnapshot

LEVELS = ("leaf", "pod")  # the switch tiers whose uplinks are measured from the ports


@dataclass(frozen=True)
class FabricSpec:
    design: str = "rail"  # "rail": a leaf per (pod, rail); "rack": a leaf per rack
    rails: int = 8  # NIC ports per node (one per GPU)
    leaf_oversubscription: float = 1.0  # leaf down / up capacity: non-blocking up to the spines
    pod_oversubscription: float = 2.0  # between pods of a datacenter
    congested_p99: float = 90.0  # a link whose worst port's p99 window is above this (percent) ...
    congested_cnp_per_s: float = 5000.0  # ... or whose ports send this many CNPs a second

    def __post_init__(self):
        if self.design not in ("rail", "rack"):
            raise ValueError(f"design: {self.design!r} is not rail or rack")
        if self.rails < 1:
            raise ValueError(f"rails: {self.rails} is below 1")


@dataclass
class PortLoads:
    """One entry per NIC port: where it is and what its newest summary says."""

    node: np.ndarray  # snapshot node index
    rail: np.ndarray
    rate_gbps: np.ndarray
    tx_bytes_s: np.ndarray  # mean over the summary
    rx_bytes_s: np.ndarray
    p99: np.ndarray  # percent: p99 of its 10 ms windows' utilization
    cnp_per_s: np.ndarray
    down: np.ndarray  # bool

    @classmethod
    def empty(cls) -> PortLoads:
        z = np.zeros(0)
        return cls(z.astype(np.int64), z.astype(np.int64), z, z, z, z, z, z.astype(bool))

    def __len__(self) -> int:
        return len(self.node)


def leaf_of(topo: TopologySnapshot, node: np.ndarray, rail: np.ndarray, spec: FabricSpec) -> np.ndarray:
    """The leaf switch index of each port (pod * rails + rail, or the rack)."""
    rack = topo.node_rack[node].astype(np.int64)
    if spec.design == "rack":
        return rack
    return topo.rack_pod[rack].astype(np.int64) * spec.rails + np.minimum(rail, spec.rails - 1)


def leaf_count(topo: TopologySnapshot, spec: FabricSpec) -> int:
    return len(topo.rack_id) if spec.design == "rack" else len(topo.pod_id) * spec.rails


def link_loads(topo: TopologySnapshot, ports: PortLoads, spec: FabricSpec | None = None) -> dict[str, dict]:
    """Per tier ("leaf", "pod"): each switch's uplink load (bytes/s), capacity (bytes/s),
    utilization (load / capacity, above 1 oversubscribed), its ports' worst p99 (percent) and
    CNPs per second, ports down, and whether it is congested. Arrays over the tier's switches."""
    spec = spec or FabricSpec()
    leaves = leaf_count(topo, spec)
    pods = len(topo.pod_id)
    if not len(ports):
        return {
            level: _tier(np.zeros(0, np.int64), ports, n, 1.0, spec)
            for level, n in (("leaf", leaves), ("pod", pods))
        }
    leaf = leaf_of(topo, ports.node, ports.rail, spec)
    pod = topo.rack_pod[topo.node_rack[ports.node]].astype(np.int64)
    return {
        "leaf": _tier(leaf, ports, leaves, spec.leaf_oversubscription, spec, by_p99=True),
        "pod": _tier(pod, ports, pods, spec.pod_oversubscription, spec, by_p99=False),
    }


def _tier(
    index: np.ndarray,
    ports: PortLoads,
    size: int,
    oversubscription: float,
    spec: FabricSpec,
    by_p99: bool = True,
) -> dict:
    """A leaf is congested by its worst port's p99 window (the ports burst into it); a pod's
    uplink, oversubscribed above the leaves, by its own load over its capacity; both by CNPs."""
    if not len(index):
        zeros = np.zeros(size)
        return {
            "load": zeros,
            "capacity": zeros,
            "util": zeros,
            "p99": zeros,
            "cnp_per_s": zeros,
            "ports": np.zeros(size, np.int64),
            "down": np.zeros(size, np.int64),
            "congested": np.zeros(size, bool),
        }
    busier = np.maximum(ports.tx_bytes_s, ports.rx_bytes_s)
    load = np.bincount(index, weights=busier, minlength=size)
    capacity = np.bincount(index, weights=ports.rate_gbps * 1e9 / 8, minlength=size) / oversubscription
    p99 = np.zeros(size)
    np.maximum.at(p99, index, ports.p99)
    cnp = np.bincount(index, weights=ports.cnp_per_s, minlength=size)
    util = load / np.maximum(capacity, 1.0)
    hot = p99 >= spec.congested_p99 if by_p99 else util * 100 >= spec.congested_p99
    congested = hot | (cnp >= spec.congested_cnp_per_s)
    return {
        "load": load,
        "capacity": capacity,
        "util": util,
        "p99": p99,
        "cnp_per_s": cnp,
        "ports": np.bincount(index, minlength=size),
        "down": np.bincount(index, weights=ports.down.astype(np.float64), minlength=size).astype(np.int64),
        "congested": congested,
    }


def congested_pods(
    topo: TopologySnapshot, loads: dict[str, dict], spec: FabricSpec | None = None
) -> np.ndarray:
    """Per pod: whether its uplink or any of its leaves is congested (bool array over pods)."""
    spec = spec or FabricSpec()
    pods = loads["pod"]["congested"].copy()
    leaf = loads["leaf"]["congested"]
    if spec.design == "rail" and len(leaf):
        pods |= leaf.reshape(len(topo.pod_id), spec.rails).any(axis=1)
    elif len(leaf):
        np.logical_or.at(pods, topo.rack_pod.astype(np.int64), leaf)
    return pods
