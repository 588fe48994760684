"""What the operator reads first: GPUs by state as counts and shares, busy share, jobs, faults.

Every GPU is in exactly one bucket, in this order of precedence: down (its node or itself is
down), in repair, cordoned (node cordoned or draining, or the GPU cordoned), allocated (held by a
job) and busy, allocated but idle (held, yet under 5% utilization in the newest telemetry frame),
free. Arrays come from the topology snapshot and the packed allocation read; nothing loops over
GPUs in Python.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.utils import timezone

from cluster.snapshot import topology_cache
from engine.fleet import decode_frame
from engine.states import GPU_STATE_CODE, NODE_STATE_CODE
from monitoring.livestore import FRAME_KEY, live_store
from monitoring.models import FaultEvent
from scheduling.choices import JobState
from scheduling.cycle import _active_allocations
from scheduling.models import Job

IDLE_UTIL_PCT = 5
BUCKETS = ("free", "allocated", "allocated_idle", "cordoned", "down", "repairing")


def overview() -> dict:
    snap = topology_cache.current()
    n = snap.num_gpus
    node_state = snap.node_state[snap.gpu_node]
    down = (node_state == NODE_STATE_CODE["down"]) | (snap.gpu_state == GPU_STATE_CODE["down"])
    repairing = ~down & (
        (node_state == NODE_STATE_CODE["repairing"]) | (snap.gpu_state == GPU_STATE_CODE["repairing"])
    )
    cordoned = (
        ~down
        & ~repairing
        & (
            (node_state == NODE_STATE_CODE["cordoned"])
            | (node_state == NODE_STATE_CODE["draining"])
            | (snap.gpu_state == GPU_STATE_CODE["cordoned"])
        )
    )
    held = np.zeros(n, dtype=bool)
    pairs = _active_allocations()
    if len(pairs):
        held[topology_cache.gpu_indices(pairs[:, 1])] = True
    held &= ~down & ~repairing & ~cordoned
    idle = np.zeros(n, dtype=bool)
    frame_seq = None
    data = live_store().get(FRAME_KEY)
    if data:
        try:
            frame_seq, _, values = decode_frame(data)
            if len(values["util"]) == n:
                idle = held & (values["util"] < IDLE_UTIL_PCT)
        except ValueError:
            frame_seq = None
    counts = {
        "down": int(down.sum()),
        "repairing": int(repairing.sum()),
        "cordoned": int(cordoned.sum()),
        "allocated": int((held & ~idle).sum()),
        "allocated_idle": int(idle.sum()),
    }
    counts["free"] = n - sum(counts.values())
    now = timezone.now()
    faults_24h = FaultEvent.objects.filter(at__gte=now - timedelta(hours=24)).count()
    return {
        "gpus": n,
        "counts": {b: counts[b] for b in BUCKETS},
        "shares": {b: round(counts[b] / n, 4) if n else 0.0 for b in BUCKETS},
        "busy_share": round(counts["allocated"] / n, 4) if n else 0.0,
        "running_jobs": Job.objects.filter(state=JobState.RUNNING).count(),
        "pending_jobs": Job.objects.filter(state=JobState.PENDING).count(),
        "faults_per_hour_24h": round(faults_24h / 24, 2),
        "open_faults": FaultEvent.objects.filter(cleared_at__isnull=True).count(),
        "telemetry_frame": frame_seq,
    }
