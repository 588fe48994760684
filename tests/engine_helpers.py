"""Small clusters and a cycle driver for engine scenario tests (no database)."""

from __future__ import annotations

import numpy as np

from engine.chips import BY_NAME
from engine.invariants import check_cycle
from engine.placement import Layout
from engine.scheduler import schedule
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from engine.workload import RunningJob


def layout_for(pods_per_dc=2, racks=2, nodes_per_rack=2, gpus_per_node=8, datacenters=2, chips=("H100-SXM",)):
    """A region of ``datacenters`` datacenters; each holds ``pods_per_dc`` pods per chip type."""
    doc = {
        "regions": [
            {
                "name": "r1",
                "datacenters": [
                    {
                        "name": f"dc{d + 1}",
                        "pods": [
                            {
                                "chip_type": chip,
                                "count": pods_per_dc,
                                "racks": racks,
                                "nodes_per_rack": nodes_per_rack,
                                "gpus_per_node": gpus_per_node,
                            }
                            for chip in chips
                        ],
                    }
                    for d in range(datacenters)
                ],
            }
        ]
    }
    return Layout(snapshot_from_spec(parse_topology(doc, set(BY_NAME))))


def gpus_of_nodes(layout: Layout, *nodes: int) -> np.ndarray:
    return np.concatenate(
        [
            np.arange(layout.node_gpu_start[n], layout.node_gpu_start[n] + layout.node_gpu_count[n])
            for n in nodes
        ]
    )


def running(
    layout,
    job_id,
    queue,
    nodes=None,
    gpus=None,
    chip="H100-SXM",
    priority=0,
    started_at=0.0,
    end=None,
    checkpoint=None,
):
    gpu_idx = np.asarray(gpus if gpus is not None else gpus_of_nodes(layout, *nodes), dtype=np.int64)
    return RunningJob(job_id, queue, gpu_idx, chip, priority, started_at, end, checkpoint)


def cycle(layout, queues, running_jobs, pending, now=0.0, **kw):
    """One checked cycle: runs the invariant checker and returns (result, running after)."""
    result = schedule(layout, queues, running_jobs, pending, now, **kw)
    after = check_cycle(layout, queues, running_jobs, pending, result, now)
    return result, after


def domains_of(layout: Layout, gpus, level: str) -> set[int]:
    from engine.placement import LEVELS

    return set(np.unique(layout.node_domain[LEVELS.index(level)][layout.gpu_node[np.asarray(gpus)]]).tolist())
