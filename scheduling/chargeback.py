"""Who used what: GPU-hours per queue (and its cohort), chip type and day, allocated, used,
borrowed, lent and lost to preemption, and their cost at each chip type's chargeback price.

The cluster sampler (every MYRIAD_SAMPLE_INTERVAL_S) adds its interval to the day's ``UsageDay``
rows, a few per queue, never a row per GPU: allocated and borrowed and lent from the quota book
(``queue_usage``, shares counted as their fraction), used from the newest telemetry frame's
utilization of the GPUs each queue holds. Preempted GPU-hours are the work preemptions threw away
(each preempted event's lost seconds x the job's GPUs). A month is 30 days x queues x chip types of
rows, read in one query.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import date, datetime, timedelta

import numpy as np
from django.db.models import F, Min
from django.utils import timezone

from cluster.fields import FieldError
from cluster.models import ChipType
from cluster.snapshot import topology_cache
from engine.efficiency import pair_keys
from scheduling.choices import EventKind
from scheduling.models import AllocatedGPU, Cohort, Job, JobEvent, Queue, UsageDay
from scheduling.store import allocations, chip_names
from scheduling.usage import queue_usage

MAX_WINDOW_DAYS = 400
COLUMNS = ("allocated", "used", "borrowed", "lent", "preempted")


def _utilized(util: np.ndarray | None) -> dict[tuple[str, str], float]:
    """{(queue, chip): held GPUs weighted by their utilization (0-1) and share} from a frame."""
    snap = topology_cache.current()
    pairs = allocations.active_pairs()
    if util is None or len(util) != snap.num_gpus or not len(pairs):
        return {}
    idx = topology_cache.gpu_indices(pairs[:, 1])
    weight = util[idx].astype(np.float64) / 100.0
    shared = list(
        AllocatedGPU.objects.filter(active=True, share__lt=1000).values_list("job_id", "gpu_id", "share")
    )
    if shared:
        keys = pair_keys(pairs)
        rows = np.array(shared, dtype=np.int64)
        pos = np.searchsorted(keys, pair_keys(rows[:, :2]))
        weight[pos] *= rows[:, 2] / 1000.0
    jobs, inverse = np.unique(pairs[:, 0], return_inverse=True)
    queue_of = dict(Job.objects.filter(pk__in=jobs.tolist()).values_list("id", "queue__name"))
    names = sorted(set(queue_of.values()))
    code = {q: i for i, q in enumerate(names)}
    job_queue = np.array([code.get(queue_of.get(int(j)), -1) for j in jobs], dtype=np.int64)[inverse]
    n_chips = len(snap.chip_names)
    known = job_queue >= 0
    cells = job_queue[known] * n_chips + snap.gpu_chip[idx][known]
    sums = np.bincount(cells, weights=weight[known], minlength=len(names) * n_chips)
    return {
        (names[c // n_chips], snap.chip_names[c % n_chips]): float(v) for c, v in enumerate(sums) if v > 0
    }


def record_usage(now: datetime, interval_s: float, util: np.ndarray | None = None) -> int:
    """Add ``interval_s`` seconds of what each queue holds now to the day's rows; returns the rows
    touched. ``util``: the newest frame's utilization per GPU (None: nothing counts as used)."""
    day = now.date()
    queue_ids = dict(Queue.objects.values_list("name", "id"))
    chip_ids = dict(ChipType.objects.values_list("name", "id"))
    used = _utilized(util)
    touched = 0
    for queue, rows in queue_usage().items():
        for row in rows:
            chip = row["chip_type"]
            if chip not in chip_ids or not (row["used"] or row["borrowed"] or row["lent"]):
                continue
            allocated = float(row["used"])
            add = {
                "allocated_gpu_s": allocated * interval_s,
                "used_gpu_s": min(used.get((queue, chip), 0.0), allocated) * interval_s,
                "borrowed_gpu_s": float(row["borrowed"]) * interval_s,
                "lent_gpu_s": float(row["lent"]) * interval_s,
            }
            entry, _ = UsageDay.objects.get_or_create(
                queue_id=queue_ids[queue], chip_type_id=chip_ids[chip], day=day
            )
            UsageDay.objects.filter(pk=entry.pk).update(**{f: F(f) + v for f, v in add.items()})
            touched += 1
    return touched


def _day(text: str | None, field: str) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise FieldError(field, f"must be a date such as 2026-12-01, not {text!r}") from None


def window(params, today: date | None = None) -> dict:
    """The query's window and filters, each checked: FieldError names the field."""
    today = today or timezone.now().date()
    first = UsageDay.objects.aggregate(d=Min("day"))["d"] or today
    until = _day(params.get("until"), "until") or today
    since = _day(params.get("since"), "since") or max(first, until - timedelta(days=29))
    if until < since:
        raise FieldError("until", f"{until} is before since ({since})")
    if until > today:
        raise FieldError("until", f"{until} is in the future (today is {today})")
    if (until - since).days + 1 > MAX_WINDOW_DAYS:
        raise FieldError("since", f"the window is longer than {MAX_WINDOW_DAYS} days")
    if since < first:
        raise FieldError("since", f"{since} is before the usage history, which starts on {first}")
    out = {"since": since, "until": until}
    for field, model in (("queue", Queue), ("cohort", Cohort), ("chip_type", ChipType)):
        value = params.get(field) or None
        if value and not model.objects.filter(name=value).exists():
            raise FieldError(field, f"no {field.replace('_', ' ')} named {value!r}")
        out[field] = value
    return out


def _price(row: dict) -> float:
    charge = row["chip_type__charge_per_gpu_hour"]
    return float(charge if charge is not None else row["chip_type__price_per_gpu_hour"])


def _add_preempted(cells: dict, events, chip_type: str | None) -> None:
    """Each preempted event's lost seconds x the GPUs and chip it held then (older events: the
    job's own), added to its day, queue and chip type."""
    cohorts = dict(Queue.objects.values_list("name", "cohort__name"))
    chips = chip_names()
    for at, q, data, chip, gpus in events.values_list(
        "at", "job__queue__name", "data", "job__chip__name", "job__gpus"
    ):
        lost_s, gpus = data["lost_s"], data.get("gpus") or gpus
        chip = chips.get(data.get("chip_id")) or chip or "any"
        if chip_type and chip != chip_type:
            continue
        key = (at.date(), q, chip)
        cell = cells.setdefault(
            key, {"cohort": cohorts.get(q) or "", "price": 0.0, **dict.fromkeys(COLUMNS, 0.0)}
        )
        cell["preempted"] += float(lost_s) * gpus / 3600


def report(*, since: date, until: date, queue=None, cohort=None, chip_type=None) -> dict:
    """Rows per day, queue and chip type (GPU-hours, cost) and totals per queue and per cohort."""
    days = UsageDay.objects.filter(day__gte=since, day__lte=until)
    events = JobEvent.objects.filter(
        kind=EventKind.PREEMPTED, at__date__gte=since, at__date__lte=until, data__lost_s__gt=0
    )
    for field, path in (("queue", "queue__name"), ("cohort", "queue__cohort__name"), ("chip_type", None)):
        value = {"queue": queue, "cohort": cohort, "chip_type": chip_type}[field]
        if value and path:
            days = days.filter(**{path: value})
            events = events.filter(**{f"job__{path}": value})
        elif value:
            days = days.filter(chip_type__name=value)  # the events' chip is read below
    cells: dict[tuple, dict] = {}
    for r in days.values(
        "day",
        "queue__name",
        "queue__cohort__name",
        "chip_type__name",
        "chip_type__price_per_gpu_hour",
        "chip_type__charge_per_gpu_hour",
        "allocated_gpu_s",
        "used_gpu_s",
        "borrowed_gpu_s",
        "lent_gpu_s",
    ):
        key = (r["day"], r["queue__name"], r["chip_type__name"])
        cells[key] = {
            "cohort": r["queue__cohort__name"] or "",
            "price": _price(r),
            **{c: r[f"{c}_gpu_s"] / 3600 for c in COLUMNS[:4]},
            "preempted": 0.0,
        }
    _add_preempted(cells, events, chip_type)
    rows = []
    by_queue: dict[str, dict] = defaultdict(lambda: dict.fromkeys((*COLUMNS, "cost"), 0.0))
    by_cohort: dict[str, dict] = defaultdict(lambda: dict.fromkeys((*COLUMNS, "cost"), 0.0))
    for (day, q, chip), cell in sorted(cells.items()):
        cost = cell["allocated"] * cell["price"]
        row = {
            "day": day.isoformat(),
            "queue": q,
            "cohort": cell["cohort"],
            "chip_type": chip,
            **{f"{c}_gpu_hours": round(cell[c], 3) for c in COLUMNS},
            "cost": round(cost, 2),
        }
        rows.append(row)
        for total in (by_queue[q], by_cohort[cell["cohort"] or "(none)"]):
            for c in COLUMNS:
                total[c] += cell[c]
            total["cost"] += cost

    def rounded(totals: dict) -> dict:
        return {
            name: {**{f"{c}_gpu_hours": round(t[c], 3) for c in COLUMNS}, "cost": round(t["cost"], 2)}
            for name, t in sorted(totals.items())
        }

    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "rows": rows,
        "queues": rounded(by_queue),
        "cohorts": rounded(by_cohort),
    }


def as_csv(data: dict) -> str:
    out = io.StringIO()
    fields = ["day", "queue", "cohort", "chip_type", *(f"{c}_gpu_hours" for c in COLUMNS), "cost"]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(data["rows"])
    return out.getvalue()
