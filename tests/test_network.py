"""The fleet's network: traffic from placed jobs on rack, pod and datacenter links, and link-down
faults that interrupt every job crossing the link."""

import numpy as np

from engine.chips import BY_NAME
from engine.network import Network, traffic_per_gpu
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from sim.config import SimConfig
from sim.simulation import Simulation
from sim.workload import SimJob
from tests.engine_helpers import gpus_of_nodes

DOC = {
    "regions": [
        {
            "name": "r",
            "datacenters": [
                {
                    "name": f"dc{d}",
                    "pods": [
                        {
                            "chip_type": "H100-SXM",
                            "count": 2,
                            "racks": 2,
                            "nodes_per_rack": 2,
                            "gpus_per_node": 8,
                        }
                    ],
                }
                for d in (1, 2)
            ],
        }
    ],
    "links": [{"between": ["dc1", "dc2"], "distance_km": 50, "bandwidth_gbps": 3200}],
}


def topo():
    return snapshot_from_spec(parse_topology(DOC, set(BY_NAME)))


def test_training_traffic_is_real_and_below_the_nic():
    per_gpu, cross = traffic_per_gpu(70e9, "H100-SXM", 1024)
    assert 1e8 < per_gpu < 50e9  # some, but not more than a 400 Gb/s NIC
    assert cross > 0
    assert traffic_per_gpu(70e9, "H100-SXM", 1) == (0.0, 0.0)


def test_links_carry_only_the_traffic_that_leaves_them():
    t = topo()  # per datacenter: 2 pods x 2 racks x 2 nodes x 8
    net = Network(t, datacenter_links={(0, 1): 3200})
    from engine.placement import Layout

    lay = Layout(t)
    inside_rack = gpus_of_nodes(lay, 0, 1)  # rack 0
    across_racks = gpus_of_nodes(lay, 2, 4)  # racks 1 and 2 (pods 0 and 1)
    across_dcs = gpus_of_nodes(lay, 6, 8)  # rack 3 (dc1) and rack 4 (dc2)
    net.load([(inside_rack, 1e9, 0.0), (across_racks, 2e9, 0.0), (across_dcs, 1e9, 5e9)])
    util = net.utilization()
    assert net.rack_load[0] == 0  # the first job never leaves its rack
    assert net.rack_load[1] == 8 * 2e9 and net.rack_load[2] == 8 * 2e9 + 0
    assert net.pod_load[0] > 0 and net.pod_load[1] > 0
    assert util["datacenter"][(0, 1)] == 5e9 / 2 / (3200e9 / 8)
    net.count_errors(3600, np.random.default_rng(0))
    assert net.rack_errors[0] == 0


def test_a_link_down_interrupts_every_job_crossing_the_rack_uplink():
    t = topo()
    crossing = SimJob(1, "pretrain", 32, 0.0, 10 * 86400.0, "H100-SXM", "datacenter", 10, parameters=7e9)
    local = SimJob(2, "pretrain", 8, 0.0, 10 * 86400.0, "H100-SXM", "node", 10, parameters=7e9)
    sim = Simulation(t, [crossing, local], SimConfig(days=1, seed=0))
    sim._on_arrive(1)
    sim._on_arrive(2)
    sim._on_cycle()
    a, b = sim.running[1], sim.running[2]
    racks_a = set(np.unique(t.node_rack[t.gpu_node[a.held]]).tolist())
    assert len(racks_a) > 1
    rack_b = int(t.node_rack[t.gpu_node[b.held[0]]])
    # a rack that job 1 crosses: a fault on one of its nodes that holds neither job
    rack = next(r for r in racks_a)
    nodes = [
        n
        for n in np.flatnonzero(t.node_rack == rack)
        if not (sim.owner[gpus_of_nodes(sim.layout, n)] >= 0).any()
    ]
    target = int(nodes[0]) if nodes else int(np.flatnonzero(t.node_rack == rack)[0])
    sim._on_fault(target, "network")
    assert sim.jobs[1].interruptions == 1
    assert sim.jobs[2].interruptions == (1 if rack_b == rack and target in t.gpu_node[b.held] else 0)


def test_samples_report_link_utilization():
    t = topo()
    job = SimJob(1, "pretrain", 64, 0.0, 5 * 86400.0, "H100-SXM", "region", 10, parameters=7e9)
    out = Simulation(t, [job], SimConfig(days=0.5, seed=1)).run()
    sample = out["series"]["samples"][-1]
    assert sample["rack_uplink_util_max"] > 0 and sample["pod_uplink_util_max"] > 0
    assert "datacenter_link_util_max" in sample and "link_errors" in sample


def test_datacenter_links_come_from_the_topology():
    from engine.network import datacenter_links

    assert datacenter_links(parse_topology(DOC, set(BY_NAME))) == {(0, 1): 3200}
