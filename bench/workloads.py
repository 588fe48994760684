"""The scheduling benchmark's workloads on the 100k preset (12,500 nodes x 8 GPUs), seeded.

- fill: 10,000 jobs of 1 to 64 whole nodes (uniform), one queue with the whole cluster's quota.
- mixed: 10,000 jobs of 1 to 2,048 GPUs (log-uniform) over four queues of one cohort, each
  with a quarter of every chip type as nominal quota, so busy queues borrow from idle ones.
Jobs ask for one chip type, drawn in proportion to the cluster's capacity of each type, and
must fit in one datacenter. Durations are log-uniform between 10 minutes and 10 hours.
"""

from __future__ import annotations

import numpy as np

from engine.topology import TopologySnapshot
from engine.workload import PendingJob, QueueSpec

SEED = 20261130
MIXED_QUEUES = ("pretrain", "finetune", "research", "batch")


def chip_mix(topo: TopologySnapshot) -> tuple[list[str], np.ndarray]:
    counts = topo.count_by_chip()
    names = [n for n, c in counts.items() if c]
    weights = np.array([counts[n] for n in names], dtype=float)
    return names, weights / weights.sum()


def fill_workload(topo: TopologySnapshot, n: int = 10_000):
    rng = np.random.default_rng(SEED)
    names, p = chip_mix(topo)
    capacity = topo.count_by_chip()
    queues = [QueueSpec("fill", nominal={c: capacity[c] for c in names})]
    nodes = rng.integers(1, 65, size=n)
    chips = rng.choice(len(names), size=n, p=p)
    durations = np.exp(rng.uniform(np.log(600), np.log(36_000), size=n))
    jobs = [
        PendingJob(
            i + 1,
            "fill",
            int(nodes[i]) * 8,
            chip_types=(names[chips[i]],),
            submitted_at=float(i) * 1e-3,
            estimated_duration_s=float(durations[i]),
        )
        for i in range(n)
    ]
    return queues, jobs


def mixed_workload(topo: TopologySnapshot, n: int = 10_000, elastic: float = 0.0, fractional: float = 0.0):
    """10,000 jobs of 1 to 2,048 GPUs over four borrowing queues; ``elastic`` and ``fractional``
    turn those shares of them into elastic jobs (half to full size, whole nodes) and jobs that
    ask for 0.1 to 0.9 of one GPU."""
    rng = np.random.default_rng(SEED + 1)
    names, p = chip_mix(topo)
    capacity = topo.count_by_chip()
    queues = [
        QueueSpec(
            q,
            cohort="shared",
            priority=0,
            nominal={c: capacity[c] // 4 for c in names},
            reclaim_within_cohort="never",
        )
        for q in MIXED_QUEUES
    ]
    sizes = np.floor(np.exp(rng.uniform(0, np.log(2049), size=n))).astype(int).clip(1, 2048)
    chips = rng.choice(len(names), size=n, p=p)
    queue_of = rng.integers(0, len(MIXED_QUEUES), size=n)
    durations = np.exp(rng.uniform(np.log(600), np.log(36_000), size=n))
    kind = rng.uniform(size=n)
    shares = rng.integers(1, 10, size=n) * 100
    jobs = []
    for i in range(n):
        size, extra = int(sizes[i]), {}
        if kind[i] < fractional:
            size, extra = 1, {"share": int(shares[i])}
        elif kind[i] < fractional + elastic and size >= 16:
            size = size - size % 8
            extra = {"min_gpus": max(8, (size // 2) - (size // 2) % 8), "size_step": 8}
        jobs.append(
            PendingJob(
                i + 1,
                MIXED_QUEUES[queue_of[i]],
                size,
                chip_types=(names[chips[i]],),
                submitted_at=float(i) * 1e-3,
                estimated_duration_s=float(durations[i]),
                **extra,
            )
        )
    return queues, jobs
