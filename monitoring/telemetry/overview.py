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
from django.conf import settings
from django.utils import timezone

from cluster.snapshot import topology_cache
from engine.frames import decode_frame
from engine.states import GPU_STATE_CODE, NODE_STATE_CODE
from monitoring.models import ClusterSample, FaultEvent
from monitoring.telemetry.livestore import newest_frame
from scheduling.chargeback import record_usage
from scheduling.choices import JobState
from scheduling.ettr import cluster_ettr
from scheduling.models import Job
from scheduling.store import allocations

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
            | (node_state == NODE_STATE_CODE["drained"])
            | (snap.gpu_state == GPU_STATE_CODE["cordoned"])
        )
    )
    held = np.zeros(n, dtype=bool)
    pairs = allocations.active_pairs()
    if len(pairs):
        held[topology_cache.gpu_indices(pairs[:, 1])] = True
    held &= ~down & ~repairing & ~cordoned
    idle = np.zeros(n, dtype=bool)
    frame_seq = None
    data = newest_frame()
    if data:
        try:
            frame_seq, _, values = decode_frame(data)
            if len(values["util"]) == n:
                idle = held & (values["util"] < settings.IDLE_UTIL_PCT)
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


WINDOWS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}
SERIES = (
    "free",
    "allocated",
    "allocated_idle",
    "cordoned",
    "down",
    "repairing",
    "running_jobs",
    "pending_jobs",
)


def take_sample(now=None):
    """Store one ClusterSample: the overview's counts now and the faults of the last hour; add the
    interval since the last one to each queue's usage of the day (scheduling.chargeback)."""
    now = now or timezone.now()
    data = overview()
    previous = ClusterSample.objects.filter(at__lt=now.replace(microsecond=0)).order_by("-at").first()
    interval = settings.SAMPLE_INTERVAL_S
    if previous is not None:  # what the sampler saw since; a long gap counts two intervals at most
        interval = min((now - previous.at).total_seconds(), 2 * settings.SAMPLE_INTERVAL_S)
    record_usage(now, interval, _newest_util())
    return ClusterSample.objects.update_or_create(
        at=now.replace(microsecond=0),
        defaults={
            "gpus": data["gpus"],
            **data["counts"],
            "running_jobs": data["running_jobs"],
            "pending_jobs": data["pending_jobs"],
            "open_faults": data["open_faults"],
            "faults_last_hour": FaultEvent.objects.filter(
                at__gte=now - timedelta(hours=1), at__lte=now
            ).count(),
        },
    )[0]


def _newest_util():
    data = newest_frame()
    if not data:
        return None
    try:
        return decode_frame(data)[2]["util"]
    except ValueError:
        return None


def history(window: str = "day", now=None, points: int = 360) -> dict:
    """Samples over the last hour, day or week, thinned to at most `points` evenly spaced rows."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
    now = now or timezone.now()
    rows = list(
        ClusterSample.objects.filter(at__gte=now - WINDOWS[window], at__lte=now)
        .order_by("at")
        .values("at", "gpus", "open_faults", "faults_last_hour", *SERIES)
    )
    if len(rows) > points:
        keep = np.linspace(0, len(rows) - 1, points).round().astype(int)
        rows = [rows[i] for i in keep]
    out = {"window": window, "at": [r["at"].isoformat() for r in rows]}
    for key in ("gpus", "open_faults", "faults_last_hour", *SERIES):
        out[key] = [r[key] for r in rows]
    out["busy_share"] = [round(r["allocated"] / r["gpus"], 4) if r["gpus"] else 0.0 for r in rows]
    return out


def ettr_last_day(now=None) -> dict:
    """Cluster ETTR over the last 24 h and where the rest went (GPU-weighted)."""

    now = now or timezone.now()
    data = cluster_ettr(now - timedelta(hours=24), now)
    return {"ettr": data["ettr"], "jobs": data["jobs"], "loss_share": data["loss_share"]}
