"""A queue's history over any window, from the job events: admissions and their waits (mean and
p90), preemptions and their rate, the chip types under contention, the most borrowed quota, and the
queues starving now (work pending, nothing admitted for MYRIAD_QUEUE_STARVING_AFTER_S).

An admitted event carries the wait it ended (``wait_s``: since the job's last requeue, else its
submission, scheduling.apply), so a window reads one row per admission through the events' time
index, however long the history; events written before that carried it count from submission.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from cluster.fields import FieldError
from scheduling.choices import EventKind, JobState
from scheduling.models import Job, JobEvent, Queue, UsageDay
from scheduling.store import chip_names

MAX_WINDOW = timedelta(days=400)
CONTENDED_WAIT_S = 900.0  # a chip type whose p90 wait passes this is under contention


def _when(text: str | None, field: str) -> datetime | None:
    if not text:
        return None
    try:
        at = parse_datetime(text)
        if at is None and (day := parse_date(text)) is not None:
            at = datetime(day.year, day.month, day.day)
    except ValueError:
        at = None
    if at is None:
        raise FieldError(field, f"must be a time such as 2026-12-01T08:00:00Z or a date, not {text!r}")
    return timezone.make_aware(at, UTC) if timezone.is_naive(at) else at


def window(params, now: datetime | None = None) -> dict:
    """The query's window and settings, each checked: FieldError names the field."""
    now = now or timezone.now()
    first = JobEvent.objects.aggregate(at=Min("at"))["at"] or now
    until = _when(params.get("until"), "until") or now
    since = _when(params.get("since"), "since") or min(
        until - timedelta(seconds=1), max(first, until - timedelta(days=7))
    )
    if until <= since:
        raise FieldError("until", f"{until.isoformat()} is not after since ({since.isoformat()})")
    if until > now + timedelta(minutes=1):
        raise FieldError("until", f"{until.isoformat()} is in the future")
    if until - since > MAX_WINDOW:
        raise FieldError("since", f"the window is longer than {MAX_WINDOW.days} days")
    if since < first - timedelta(days=1):
        raise FieldError(
            "since", f"{since.isoformat()} is before the job history, which starts at {first.isoformat()}"
        )
    queue = params.get("queue") or None
    if queue and not Queue.objects.filter(name=queue).exists():
        raise FieldError("queue", f"no queue named {queue!r}")
    raw = params.get("starving_after_s") or settings.QUEUE_STARVING_AFTER_S
    try:
        starving_after_s = float(raw)
    except (TypeError, ValueError):
        raise FieldError("starving_after_s", f"must be a number of seconds, not {raw!r}") from None
    if not 60 <= starving_after_s <= 30 * 86400:
        raise FieldError("starving_after_s", "must be between 60 s and 30 days")
    return {"since": since, "until": until, "queue": queue, "starving_after_s": starving_after_s}


def _waits(values: list[float]) -> dict:
    if not values:
        return {"mean_wait_s": None, "p90_wait_s": None}
    arr = np.asarray(values, dtype=np.float64)
    return {"mean_wait_s": round(float(arr.mean()), 1), "p90_wait_s": round(float(np.percentile(arr, 90)), 1)}


def admission_wait(data: dict | None, at: datetime, submitted: datetime) -> float:
    """The wait an admitted event ended, in seconds: what the cycle recorded (``wait_s``, since
    the job's last requeue, else its submission), or for an event written before that, since the
    submission. ``_admissions`` below says the same in SQL."""
    wait = (data or {}).get("wait_s")
    if wait is None:
        wait = (at - submitted).total_seconds()
    return max(0.0, float(wait))


def _admissions(since: datetime, until: datetime, queue=None) -> list[tuple[str, float, str]]:
    """(queue, wait, chip) of every admission in the window, in one plain query: a month of a
    busy cluster is hundreds of thousands of rows, and no row needs a model or a datetime."""
    event, job, queues = JobEvent._meta.db_table, Job._meta.db_table, Queue._meta.db_table
    if connection.vendor == "postgresql":
        wait, chip = "(e.data->>'wait_s')::float8", "e.data->>'chip'"
        waited = "EXTRACT(EPOCH FROM (e.at - j.submitted_at))"  # events older than wait_s
    else:
        wait, chip = "json_extract(e.data, '$.wait_s')", "json_extract(e.data, '$.chip')"
        waited = "(julianday(e.at) - julianday(j.submitted_at)) * 86400.0"
    adapt = connection.ops.adapt_datetimefield_value
    params = [EventKind.ADMITTED.value, adapt(since), adapt(until)]
    where = ""
    if queue:
        where, params = " AND q.name = %s", [*params, queue]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT q.name, COALESCE({wait}, {waited}), {chip} FROM {event} e "
            f"JOIN {job} j ON j.id = e.job_id JOIN {queues} q ON q.id = j.queue_id "
            f"WHERE e.kind = %s AND e.at >= %s AND e.at < %s{where}",
            params,
        )
        return [(q, max(0.0, float(w or 0.0)), c) for q, w, c in cursor.fetchall()]


def queue_history(*, since: datetime, until: datetime, queue=None, starving_after_s: float) -> dict:
    days = max((until - since).total_seconds() / 86400, 1e-9)
    events = JobEvent.objects.filter(at__gte=since, at__lt=until)
    if queue:
        events = events.filter(job__queue__name=queue)
    waits: dict[str, list] = defaultdict(list)
    chip_waits: dict[str, list] = defaultdict(list)
    for q, wait, chip in _admissions(since, until, queue):
        waits[q].append(wait)
        chip_waits[chip or "any"].append(wait)
    chips = chip_names()
    preempted: dict[str, int] = defaultdict(int)
    chip_preempted: dict[str, int] = defaultdict(int)
    for q, chip_id, job_chip in events.filter(kind=EventKind.PREEMPTED).values_list(
        "job__queue__name", "data__chip_id", "job__chip_id"
    ):
        preempted[q] += 1
        chip_preempted[chips.get(chip_id or job_chip, "any")] += 1
    names = [queue] if queue else list(Queue.objects.order_by("name").values_list("name", flat=True))
    queues = [
        {
            "queue": q,
            "admissions": len(waits[q]),
            **_waits(waits[q]),
            "preemptions": preempted[q],
            "preemptions_per_day": round(preempted[q] / days, 3),
        }
        for q in names
    ]
    contention = sorted(
        (
            {
                "chip_type": c,
                "admissions": len(chip_waits[c]),
                **_waits(chip_waits[c]),
                "preemptions": chip_preempted[c],
            }
            for c in sorted(set(chip_waits) | set(chip_preempted))
        ),
        key=lambda r: (-(r["p90_wait_s"] or 0), -r["preemptions"], r["chip_type"]),
    )
    for row in contention:
        row["contended"] = (row["p90_wait_s"] or 0) >= CONTENDED_WAIT_S or row["preemptions"] > 0
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "queues": queues,
        "contention": contention,
        "most_borrowed": most_borrowed(since, until, queue),
        "starving": starving(starving_after_s, queue),
        "starving_after_s": starving_after_s,
    }


def most_borrowed(since: datetime, until: datetime, queue=None, top: int = 10) -> list[dict]:
    """The quota borrowed most in the window: GPU-hours per queue and chip type (the usage rollup)."""
    rows = UsageDay.objects.filter(day__gte=since.date(), day__lte=until.date(), borrowed_gpu_s__gt=0)
    if queue:
        rows = rows.filter(queue__name=queue)
    ranked = (
        rows.values("queue__name", "chip_type__name")
        .annotate(s=Sum("borrowed_gpu_s"))
        .order_by("-s", "queue__name", "chip_type__name")[:top]
    )
    return [
        {
            "queue": r["queue__name"],
            "chip_type": r["chip_type__name"],
            "borrowed_gpu_hours": round(r["s"] / 3600, 3),
        }
        for r in ranked
    ]


def starving(after_s: float, queue=None, now: datetime | None = None) -> list[dict]:
    """Queues (not stopped) with work pending now and nothing admitted in the last ``after_s``."""
    now = now or timezone.now()
    queues = Queue.objects.filter(stopped=False)
    if queue:
        queues = queues.filter(name=queue)
    rows = queues.annotate(
        pending=Count("jobs", filter=Q(jobs__state=JobState.PENDING)),
        oldest=Min("jobs__submitted_at", filter=Q(jobs__state=JobState.PENDING)),
    ).filter(pending__gt=0)
    out = []
    recent = JobEvent.objects.filter(kind=EventKind.ADMITTED, at__gte=now - timedelta(seconds=after_s))
    for q in rows.order_by("name"):
        if not recent.filter(job__queue=q).exists():  # through the events' time index: recent ones only
            out.append({"queue": q.name, "pending": q.pending, "oldest_pending_since": q.oldest.isoformat()})
    return out
