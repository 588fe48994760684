"""Effective training time (ETTR) of jobs, from their event log and checkpoint records.

ETTR = time with forward progress that survived to a durable or replicated checkpoint / wall time
from the job's first allocation to its end (or now). The loss buckets are reported separately:
checkpoint stalls (checkpoint records), detection latency and lost work (fault and preemption
events), restart
(reschedule + re-initialize + load, recovery events), degraded throughput (training on without a
replica group, recovery events; running slower across datacenters, the slowdown of its plan
events) and waiting for resources (time spent pending again after a
preemption or a fault). Productive time is the wall time less the buckets.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from engine.ettr import ETTR_BUCKETS, Ettr
from scheduling.choices import EventKind
from scheduling.models import Checkpoint, Job, JobEvent

BUCKETS = ETTR_BUCKETS
# the events the accounting reads (a job's others, submitted, placed, launched..., change nothing)
COUNTED = (
    EventKind.ADMITTED,
    EventKind.PLANNED,
    EventKind.REQUEUED,
    EventKind.RESIZED,
    EventKind.FAULTED,
    EventKind.PREEMPTED,
    EventKind.RECOVERED,
)
BATCH = 2000  # jobs read and accounted at a time: a day at 100k GPUs is tens of thousands of jobs


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def job_ettr(
    jobs: list[Job], since: datetime | None = None, until: datetime | None = None
) -> dict[int, dict]:
    """{job id: {"wall_s", "productive_s", "ettr", "<bucket>_s"...}} within [since, until]."""
    now = timezone.now()
    ids = [j.pk for j in jobs]
    events = defaultdict(list)
    for e in (
        JobEvent.objects.filter(job_id__in=ids, kind__in=COUNTED)
        .order_by("at", "id")
        .values("job_id", "kind", "at", "data")
    ):
        events[e["job_id"]].append(e)
    stalls = defaultdict(list)
    for c in Checkpoint.objects.filter(job_id__in=ids, stall_s__gt=0).values("job_id", "at", "stall_s"):
        stalls[c["job_id"]].append(c)
    out = {}
    for job in jobs:
        evs = events[job.pk]
        admitted = [e["at"] for e in evs if e["kind"] == EventKind.ADMITTED]
        if not admitted:
            continue
        start, end = admitted[0], job.finished_at or now
        lo, hi = since or start, until or end
        wall = _overlap(start, end, lo, hi)
        if wall <= 0:
            continue

        def in_window(at: datetime, since=since, until=until) -> bool:
            # without a window every event of the job counts (a modelled recovery may end after now)
            return (since is None or at >= since) and (until is None or at <= until)

        acc = Ettr(wall)
        b = acc.buckets
        b["checkpoint_stall"] = sum(c["stall_s"] for c in stalls[job.pk] if in_window(c["at"]))
        waiting_since = None
        slow_since, slow = None, 0.0  # a plan across datacenters: its slowdown, since when
        for e in evs:
            data = e["data"] or {}
            if e["kind"] in (EventKind.PLANNED, EventKind.REQUEUED, EventKind.RESIZED):
                b["degraded"] += _slower_s(slow_since, e["at"], slow, lo, hi)
                plan = data.get("plan") or data.get("new_plan") or {}
                slow_since, slow = (
                    e["at"],
                    0.0 if e["kind"] == EventKind.REQUEUED else plan.get("slowdown") or 0.0,
                )
            if e["kind"] == EventKind.FAULTED and in_window(e["at"]):
                b["detection"] += data.get("detection_s", 0.0)
                b["lost_work"] += data.get("lost_s", 0.0)
            elif e["kind"] == EventKind.PREEMPTED and in_window(e["at"]):
                b["lost_work"] += data.get("lost_s", 0.0)
            elif e["kind"] == EventKind.RECOVERED and in_window(e["at"]):
                b["restart"] += data.get("restart_s", 0.0)
                b["degraded"] += data.get("degraded_s", 0.0)
            elif e["kind"] == EventKind.REQUEUED:
                b["lost_work"] += data.get("lost_s", 0.0) if in_window(e["at"]) else 0.0  # a move
                waiting_since = e["at"]
            elif e["kind"] == EventKind.ADMITTED and waiting_since is not None:
                b["waiting"] += _overlap(waiting_since, e["at"], lo, hi)
                waiting_since = None
        if waiting_since is not None:
            b["waiting"] += _overlap(waiting_since, end, lo, hi)
        b["degraded"] += _slower_s(slow_since, end, slow, lo, hi)
        out[job.pk] = _as_row(acc)
    return out


def _slower_s(since: datetime | None, until: datetime, slowdown: float, lo: datetime, hi: datetime) -> float:
    """Full-speed seconds lost running ``slowdown`` slower (across datacenters) from ``since``."""
    if since is None or slowdown <= 0:
        return 0.0
    return _overlap(since, until, lo, hi) * slowdown / (1 + slowdown)


def _as_row(acc: Ettr) -> dict:
    return {
        "wall_s": round(acc.wall_s, 3),
        "productive_s": round(acc.productive_s, 3),
        "ettr": round(acc.ratio, 5),
        **{f"{k}_s": round(v, 3) for k, v in acc.buckets.items()},
    }


def cluster_ettr(since: datetime, until: datetime, queue: str | None = None) -> dict:
    """ETTR over every job that held GPUs in the window: productive time / wall time, GPU-weighted.
    The candidates are the jobs not finished before the window (one that never started has no
    admission and counts for nothing), read and accounted BATCH at a time, so a day of a 100k-GPU
    cluster never has all its jobs and their events in memory at once."""
    jobs = Job.objects.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
    if queue:
        jobs = jobs.filter(queue__name=queue)
    candidates = list(jobs.only("id", "gpus", "finished_at").order_by("id"))
    total, counted = Ettr(), 0
    for start in range(0, len(candidates), BATCH):
        batch = candidates[start : start + BATCH]
        gpus = {j.pk: j.gpus for j in batch}
        per_job = job_ettr(batch, since, until)
        total = total + Ettr.total(
            Ettr(r["wall_s"], {k: r[f"{k}_s"] for k in BUCKETS}).weighted(gpus[j]) for j, r in per_job.items()
        )
        counted += len(per_job)
    return {
        "since": since,
        "until": until,
        "jobs": counted,
        "gpu_seconds": round(total.wall_s, 1),
        "ettr": round(total.ratio, 5) if total.ratio is not None else None,
        "loss_share": {k: round(v, 5) for k, v in total.shares().items()},
    }
