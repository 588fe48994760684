"""Per-job efficiency and wasted GPUs, brought forward at every telemetry frame (engine.efficiency).

Whoever writes a frame (the simulated fleet's tick, the agents' compose) calls ``record_frame``:
it stores and publishes the frame, then adds the frame's interval to two small values in the live
store, never a row per GPU per sample:

- the running jobs' totals (GPU-seconds, utilization, memory and power x GPU-seconds, idle
  GPU-seconds): a few numbers per running job, written to ``JobEfficiency`` rows about once a minute
  (one bulk upsert), so a finished job keeps its figures;
- the allocated GPUs idle now, with the frame time since which each is idle: a GPU held by a running
  job and below ``MYRIAD_IDLE_UTIL_PCT`` for ``MYRIAD_IDLE_AFTER_S`` is wasted
  (``myriad_wasted_gpus``, the efficiency page).

Frames carry their own time (the simulated fleet's may run faster than the wall clock); intervals
are measured in it, and a gap of more than ``MAX_GAP_S`` between two frames counts nothing. One
frame writer runs at a time (one fleet tick, or one agents' compose, per interval).
"""

from __future__ import annotations

import io
import logging
import time

import numpy as np
from django.conf import settings
from django.utils import timezone

from cluster.fields import FieldError
from cluster.snapshot import topology_cache
from engine import efficiency as eff
from monitoring.models import JobEfficiency
from monitoring.telemetry.livestore import FRAME_KEY, live_store, publish_frame
from scheduling.choices import JobState
from scheduling.models import Job, Queue
from scheduling.store import allocations

log = logging.getLogger("myriad.efficiency")

TOTALS_KEY = "myriad:efficiency:totals"
IDLE_KEY = "myriad:efficiency:idle"
MAX_GAP_S = 600.0
FLUSH_S = 60.0
_EMPTY = np.zeros(0, dtype=np.int64)


def _pack(**arrays) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _unpack(data: bytes | None) -> dict | None:
    if not data:
        return None
    try:
        with np.load(io.BytesIO(data)) as loaded:
            return {k: loaded[k] for k in loaded.files}
    except (ValueError, OSError, EOFError):
        return None


def record_frame(store, previous: bytes | None, encoded: bytes, frame: dict, t: float) -> None:
    """Store and publish a frame, then bring the efficiency totals and idle GPUs forward to it."""
    store.put(FRAME_KEY, encoded)
    publish_frame(previous, encoded)
    try:
        observe(frame, t, store)
    except Exception:  # noqa: BLE001 - the frame is written; a failure here must not stop the next
        log.exception("job efficiency was not brought forward to the frame at %s", t)


def _seed(jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The totals already written for ``jobs`` (a job running again after a requeue, or after the
    live store was emptied)."""
    if not len(jobs):
        return _EMPTY, np.zeros((0, len(eff.COLUMNS)))
    rows = list(JobEfficiency.objects.filter(job_id__in=jobs.tolist()).values_list("job_id", *eff.COLUMNS))
    rows.sort()
    return (
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1:] for r in rows], dtype=np.float64).reshape(len(rows), len(eff.COLUMNS)),
    )


def observe(frame: dict, t: float, store=None) -> dict:
    """Add the interval up to the frame at ``t`` to the running jobs' totals; follow the idle
    allocated GPUs. Returns what it did (for the tests and the fleet's tick figures)."""
    store = store or live_store()
    state = _unpack(store.get(TOTALS_KEY)) or {}
    last_t = float(state.get("t", np.nan))
    if np.isfinite(last_t) and t <= last_t:
        return {"skipped": "not newer than the last frame"}
    dt = t - last_t if np.isfinite(last_t) and t - last_t <= MAX_GAP_S else 0.0
    jobs = state.get("jobs", _EMPTY)
    totals = state.get("totals", np.zeros((0, len(eff.COLUMNS))))
    before = state.get("running", _EMPTY)
    snapshot = topology_cache.current()
    pairs = allocations.active_pairs()
    util = frame["util"]
    if len(pairs) and len(util) == snapshot.num_gpus:
        idx = topology_cache.gpu_indices(pairs[:, 1])
        held_util = util[idx]
        running, rates = eff.job_rates(
            pairs[:, 0], held_util, frame["memory"][idx], frame["power"][idx], settings.IDLE_UTIL_PCT
        )
        new = np.setdiff1d(running, jobs)
        jobs, totals = eff.merge_totals(jobs, totals, *_seed(new))
        carried = np.isin(running, before)  # a job first seen now counts from this frame on
        jobs, totals = eff.merge_totals(jobs, totals, running[carried], rates[carried] * dt)
        idle = _unpack(store.get(IDLE_KEY)) or {}
        keys, since = eff.idle_since(
            idle.get("keys", _EMPTY),
            idle.get("since", np.zeros(0)),
            eff.pair_keys(pairs),
            held_util < settings.IDLE_UTIL_PCT,
            t,
        )
    else:
        running = _EMPTY
        keys, since = _EMPTY, np.zeros(0)
    flushed = float(state.get("flushed", 0.0))
    wall = time.time()
    if wall - flushed >= FLUSH_S:
        flush(jobs, totals)
        keep = np.isin(jobs, running)  # written: only running jobs stay in the live store
        jobs, totals, flushed = jobs[keep], totals[keep], wall
    store.put(TOTALS_KEY, _pack(jobs=jobs, totals=totals, running=running, t=t, flushed=flushed))
    store.put(IDLE_KEY, _pack(keys=keys, since=since, t=t))
    return {"dt": dt, "jobs": len(running), "idle": len(keys)}


def flush(jobs: np.ndarray, totals: np.ndarray) -> int:
    """Write the totals to ``JobEfficiency`` (one bulk upsert); jobs deleted meanwhile are left out."""
    if not len(jobs):
        return 0
    existing = set(Job.objects.filter(pk__in=jobs.tolist()).values_list("pk", flat=True))
    now = timezone.now()
    rows = [
        JobEfficiency(job_id=int(j), updated_at=now, **dict(zip(eff.COLUMNS, map(float, row), strict=True)))
        for j, row in zip(jobs, totals, strict=True)
        if int(j) in existing
    ]
    JobEfficiency.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["job"],
        update_fields=[*eff.COLUMNS, "updated_at"],
        batch_size=2000,
    )
    return len(rows)


def wasted_pairs(store=None) -> np.ndarray:
    """(job id, GPU id) of the allocated GPUs idle for MYRIAD_IDLE_AFTER_S at the newest frame."""
    idle = _unpack((store or live_store()).get(IDLE_KEY))
    if not idle:
        return np.zeros((0, 2), dtype=np.int64)
    return eff.wasted(idle["keys"], idle["since"], float(idle["t"]), settings.IDLE_AFTER_S)


def wasted_by_job(store=None) -> dict[int, int]:
    jobs, counts = np.unique(wasted_pairs(store)[:, 0], return_counts=True)
    return dict(zip(jobs.tolist(), counts.tolist(), strict=True))


def wasted_by_queue(store=None) -> dict[str, int]:
    per_job = wasted_by_job(store)
    out: dict[str, int] = {}
    for job_id, queue in Job.objects.filter(pk__in=list(per_job)).values_list("id", "queue__name"):
        out[queue] = out.get(queue, 0) + per_job[job_id]
    return out


def totals_of(job_ids: list[int], store=None) -> dict[int, np.ndarray]:
    """Each job's totals: the live ones where the job is running, else the last written."""
    out = {
        job_id: np.array(row, dtype=np.float64)
        for job_id, *row in JobEfficiency.objects.filter(job_id__in=job_ids).values_list(
            "job_id", *eff.COLUMNS
        )
    }
    state = _unpack((store or live_store()).get(TOTALS_KEY))
    if state:
        wanted = set(job_ids)
        for job_id, row in zip(state["jobs"].tolist(), state["totals"], strict=True):
            if job_id in wanted:
                out[job_id] = row
    return out


def efficiency_of(job_ids: list[int], store=None) -> dict[int, dict]:
    """{job id: gpu_hours, util_pct, memory_pct, power_pct, idle_gpu_hours, wasted_gpus}."""
    store = store or live_store()
    wasted = wasted_by_job(store)
    totals = totals_of(job_ids, store)
    return {
        job_id: {
            **eff.summary(totals.get(job_id, np.zeros(len(eff.COLUMNS)))),
            "wasted_gpus": wasted.get(job_id, 0),
        }
        for job_id in job_ids
    }


RANK_STATES = ("running", "all")


def ranking(*, state: str = "running", queue: str | None = None, limit: int = 100) -> list[dict]:
    """Jobs by idle GPU-hours (most first), with their owners: the running ones, or every job with
    figures (``all``). FieldError names the field of a bad argument."""
    if state not in RANK_STATES:
        raise FieldError("state", f"must be one of {', '.join(RANK_STATES)}, not {state!r}")
    if not 1 <= limit <= 1000:
        raise FieldError("limit", f"must be between 1 and 1000, not {limit}")
    jobs = Job.objects.all()
    if queue:
        if not Queue.objects.filter(name=queue).exists():
            raise FieldError("queue", f"no queue named {queue!r}")
        jobs = jobs.filter(queue__name=queue)
    running = list(jobs.filter(state=JobState.RUNNING).values_list("id", flat=True))
    ids = set(running)
    if state == "all":
        ids |= set(JobEfficiency.objects.filter(job__in=jobs).values_list("job_id", flat=True))
    figures = efficiency_of(sorted(ids))
    ordered = sorted(ids, key=lambda j: (-figures[j]["idle_gpu_hours"], -figures[j]["wasted_gpus"], j))
    top = ordered[:limit]
    info = {
        j["id"]: j
        for j in Job.objects.filter(pk__in=top).values(
            "id", "name", "state", "gpus", "queue__name", "owner__username"
        )
    }
    return [
        {
            "job": j,
            "name": info[j]["name"],
            "state": info[j]["state"],
            "queue": info[j]["queue__name"],
            "owner": info[j]["owner__username"] or "",
            "gpus": info[j]["gpus"],
            **figures[j],
        }
        for j in top
        if j in info
    ]
