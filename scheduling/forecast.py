"""Every pending job's expected start, refreshed in the background (Celery beat, every
MYRIAD_FORECAST_INTERVAL_S; engine.forecast plays the queue).

1. Read what the cycle reads (scheduling.store; no lock, no write): the inventory, the queues,
   the running and pending jobs, and what the engine is given besides (scheduling.cycle.surroundings).
2. Read what the play needs of the past: the jobs submitted in the last MYRIAD_FORECAST_WINDOW_S
   (the arrivals to come), how long the jobs that finished in that window ran against their
   estimates, and the forecasts checked against real starts over the last week (the p90's width).
3. Play the queue forward with the scheduler itself.
4. Write one row per pending job (JobForecast, one bulk upsert: its first forecast is kept),
   note the start of jobs that left the queue, and drop the rows of jobs long gone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from cluster.snapshot import topology_cache
from engine.forecast import Arrivals, Calibration, ForecastConfig, expected_starts, run_time_scale
from engine.workload import MILLI, PendingJob
from scheduling import sites, store
from scheduling.choices import JobState
from scheduling.cycle import surroundings
from scheduling.forecast_models import JobForecast
from scheduling.models import Job
from scheduling.pending import read_pending
from scheduling.running import load_running

log = logging.getLogger("myriad.scheduling")

CHECKED_DAYS = 7  # forecasts checked against real starts over this many days set the p90's width
STEP_S = ForecastConfig().first_step_s


@dataclass(frozen=True)
class Refresh:
    pending: int
    seconds: float
    p50_factor: float  # the played waits were multiplied by these (the checked plays' ratios)
    p90_factor: float
    run_time_scale: float

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def refresh(now: datetime | None = None) -> Refresh:
    """Forecast every pending job now and store it."""
    now = now or timezone.now()
    t0 = time.perf_counter()
    snapshot = topology_cache.current()
    layout = store.layouts.layout(snapshot)
    queues, running = store.load_queues(), load_running()
    pending = read_pending(now)
    window = float(settings.FORECAST_WINDOW_S)
    fc = ForecastConfig(
        horizon_s=float(settings.FORECAST_HORIZON_S), run_time_scale=_run_time_scale(now, window)
    )
    calibration = checked(now)
    estimates = expected_starts(
        layout,
        queues,
        running,
        pending,
        now.timestamp(),
        sites.config(),
        fc,
        _arrivals(now, window, float(sum(len(j.held) * j.share for j in running)) / MILLI),
        calibration,
        **surroundings(snapshot),
    )
    _write(estimates, now)
    seconds = time.perf_counter() - t0
    done = Refresh(len(pending), seconds, *calibration.factors(fc), fc.run_time_scale)
    log.info("forecast: %s", done.as_dict())
    return done


def _arrivals(now: datetime, window: float, busy_gpus: float) -> Arrivals:
    """The jobs submitted over the window, as the shapes of the jobs to come."""
    since = now - timedelta(seconds=window)
    submitted = Job.objects.filter(submitted_at__gt=since, submitted_at__lte=now, service__isnull=True)
    rows = submitted.values_list(
        "queue__name", "gpus", "priority", "chip_types", "topology", "estimated_duration_s", "min_gpus",
        "size_step", "share", "mixed_chips",
    )  # fmt: skip
    recent = tuple(
        PendingJob(0, q, gpus, prio, tuple(chips or ()), topo, 0.0, duration, low, step, share, bool(mixed))
        for q, gpus, prio, chips, topo, duration, low, step, share, mixed in rows
    )
    oldest = Job.objects.order_by("submitted_at").values_list("submitted_at", flat=True).first()
    seen = (now - oldest).total_seconds() if oldest is not None else 0.0
    return Arrivals(recent, min(window, max(seen, STEP_S)), busy_gpus)


def _run_time_scale(now: datetime, window: float) -> float:
    """How long the jobs that finished in the window ran (since their last start) against their
    estimates."""
    rows = Job.objects.filter(
        finished_at__gt=now - timedelta(seconds=window),
        state=JobState.FINISHED,
        started_at__isnull=False,
        estimated_duration_s__gt=0,
    ).values_list("started_at", "finished_at", "estimated_duration_s")[:5000]
    actual = [(end - start).total_seconds() for start, end, _ in rows]
    return run_time_scale(actual, [e for _, _, e in rows])


def checked(now: datetime) -> Calibration:
    """The first plays of the jobs that started over the last CHECKED_DAYS, against their starts,
    with their groups (engine.forecast.group_of: queue and first chip type)."""
    rows = JobForecast.objects.filter(
        started_at__isnull=False,
        first_played__isnull=False,
        first_at__gt=now - timedelta(days=CHECKED_DAYS),
    ).values_list("first_at", "first_played", "started_at", "job__queue__name", "job__chip_types")[:20_000]
    if not rows:
        return Calibration(np.empty(0))
    at, played, started = (np.array([r[i].timestamp() for r in rows]) for i in range(3))
    groups = [(queue, chips[0] if chips else "") for *_, queue, chips in rows]
    return Calibration.of(at, played, started, STEP_S, groups)


def _when(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds is not None else None


def _write(estimates, now: datetime) -> None:
    rows = []
    for job_id, e in estimates.items():
        p50, p90, played = _when(e.p50), _when(e.p90), _when(e.played)
        rows.append(
            JobForecast(
                job_id=job_id,
                p50=p50,
                p90=p90,
                computed_at=now,
                first_at=now,
                first_p50=p50,
                first_played=played,
            )
        )
    with transaction.atomic():
        JobForecast.objects.bulk_create(
            rows,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["job"],
            update_fields=["p50", "p90", "computed_at"],
        )
        # jobs that left the queue: their first start, once (for the check of their first forecast)
        started = Job.objects.filter(pk=OuterRef("job_id")).values("started_at")[:1]
        # (a job cancelled before it started has no start: its row is left as it is, and goes)
        JobForecast.objects.filter(
            started_at__isnull=True, computed_at__lt=now, job__started_at__isnull=False
        ).exclude(job__state=JobState.PENDING).update(started_at=Subquery(started))
        JobForecast.objects.filter(computed_at__lt=now - timedelta(days=CHECKED_DAYS)).delete()
