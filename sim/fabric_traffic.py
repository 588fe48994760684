"""The simulated fleet's NIC ports: what each port's agent would report, from modelled traffic.

Every GPU has its rail's NIC (one 400 Gb/s port per GPU, engine.steptime.Fabric). A training
job that spans nodes sends its modelled inter-node bytes per GPU (engine.network.traffic_per_gpu)
through each of its GPUs' ports. That traffic is not a flat line: it comes in the communication
phases of each step (the gradient all-reduce and the pipeline sends), modelled here as
``BURST_SHARE`` of each step (an assumption, not a published figure), so a port's 10 ms windows
run at mean / BURST_SHARE of its rate during them (capped at the line) and its p99 is that
burst level whenever bursts fill more than 1% of the windows. A burst that wants more than the
line is congested: the port's NIC sends CNPs in proportion to the excess (``CNP_PER_S_AT_2X``
at twice the line). A GPU's port is down when the GPU's node is down.
"""

from __future__ import annotations

import numpy as np

from engine.fabric import PortLoads
from engine.states import NODE_STATE_CODE
from engine.steptime import Fabric
from engine.topology import TopologySnapshot

BURST_SHARE = 0.25  # share of a step spent in communication phases (a modelling assumption)
CNP_PER_S_AT_2X = 20_000.0  # CNPs a port's NIC sends per second when its bursts want 2x the line
NODE_DOWN = NODE_STATE_CODE["down"]


def simulated_ports(
    topo: TopologySnapshot,
    jobs: list[tuple[np.ndarray, float]],
    rng: np.random.Generator,
    fabric: Fabric | None = None,
) -> PortLoads:
    """One port per GPU; ``jobs``: (GPU indices, inter-node bytes/s per GPU) of the training jobs
    that span nodes."""
    fabric = fabric or Fabric()
    n = topo.num_gpus
    line = fabric.nic_gbps_per_gpu * 1e9  # bytes/s
    sent = np.zeros(n)
    for gpus, per_gpu in jobs:
        if per_gpu > 0 and len(gpus) > 1:
            sent[gpus] += per_gpu
    # a little variation between ports of one job (stragglers, ECMP collisions): +-5%
    sent *= 1.0 + 0.05 * rng.standard_normal(n).clip(-2, 2)
    np.maximum(sent, 0.0, out=sent)
    mean = sent / line * 100.0  # percent of the line
    wanted = mean / BURST_SHARE
    p99 = np.where(mean > 0, np.minimum(wanted, 100.0), 0.0)
    cnp = np.where(wanted > 100.0, CNP_PER_S_AT_2X * (wanted / 100.0 - 1.0), 0.0)
    node = topo.gpu_node.astype(np.int64)
    down = topo.node_state[node] == NODE_DOWN
    carried = np.where(down, 0.0, np.minimum(sent, line))
    return PortLoads(
        node=node,
        rail=topo.gpu_slot.astype(np.int64),
        rate_gbps=np.full(n, fabric.nic_gbps_per_gpu * 8),
        tx_bytes_s=carried,
        rx_bytes_s=carried,
        p99=np.where(down, 0.0, p99),
        cnp_per_s=np.where(down, 0.0, cnp),
        down=down,
    )
