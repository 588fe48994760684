"""Live quota usage per queue and chip type: nominal, used, borrowed, lent, pending demand."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Sum
from django.utils import timezone

from engine.quota import build_quota_book
from engine.workload import MILLI
from scheduling.allocation_models import HELD_SHARE
from scheduling.choices import JobState
from scheduling.models import Allocation, Job, Queue
from scheduling.store import load_queues


def held_by_queue_and_chip() -> dict[tuple[str, str], int]:
    """{(queue, chip type): thousandths of GPUs held}, charged by the chip type of each GPU held,
    as the scheduler charges it: a mixed-chip job counts against each of its chip types, and a
    shared GPU its fraction. One row per allocation row, not per GPU."""
    return {
        (row["job__queue__name"], row["node__chip_type__name"]): int(row["n"])
        for row in Allocation.objects.filter(active=True)
        .values("job__queue__name", "node__chip_type__name")
        .annotate(n=Sum(HELD_SHARE))
    }


def queue_usage() -> dict[str, list[dict]]:
    """{queue name: [{chip_type, nominal, used, borrowed, lent, pending_demand, ...}, ...]}"""
    specs = load_queues()
    used = held_by_queue_and_chip()
    demand: dict[tuple[str, str], int] = defaultdict(int)
    for queue, chips, gpus, share in Job.objects.filter(state=JobState.PENDING).values_list(
        "queue__name", "chip_types", "gpus", "share"
    ):
        demand[(queue, chips[0] if chips else "any")] += gpus * share
    chip_names = sorted({c for q in specs for c in q.nominal} | {c for _, c in used} | {c for _, c in demand})
    chip_names = [c for c in chip_names if c and c != "any"]
    book = build_quota_book(specs, chip_names, [], used, unit=MILLI)

    def gpus(amount) -> float | int:
        value = int(amount) / MILLI
        return int(value) if value == int(value) else value

    out: dict[str, list[dict]] = {}
    for qi, q in enumerate(specs):
        rows = []
        for ci, chip in enumerate(chip_names):
            if not (q.nominal.get(chip) or book.usage[qi, ci] or demand.get((q.name, chip))):
                continue
            rows.append(
                {
                    "chip_type": chip,
                    "nominal": q.nominal.get(chip, 0),
                    "borrowing_limit": q.borrowing_limit.get(chip),
                    "lending_limit": q.lending_limit.get(chip),
                    "used": gpus(book.usage[qi, ci]),
                    "borrowed": gpus(book.borrowed(qi, ci)),
                    "lent": gpus(book.lent(qi, ci)),
                    "pending_demand": gpus(demand.get((q.name, chip), 0)),
                }
            )
        if demand.get((q.name, "any")):
            rows.append(
                {
                    "chip_type": "any",
                    "nominal": 0,
                    "borrowing_limit": None,
                    "lending_limit": None,
                    "used": 0,
                    "borrowed": 0,
                    "lent": 0,
                    "pending_demand": gpus(demand[(q.name, "any")]),
                }
            )
        out[q.name] = rows
    return out


def queue_health(usage: dict[str, list[dict]] | None = None) -> list[dict]:
    """Per queue: running and pending jobs, the oldest pending job's wait, stopped, GPUs used vs nominal."""
    from django.db.models import Count, Min, Q

    now = timezone.now()
    usage = queue_usage() if usage is None else usage
    rows = []
    for q in Queue.objects.annotate(
        running=Count("jobs", filter=Q(jobs__state=JobState.RUNNING)),
        pending=Count("jobs", filter=Q(jobs__state=JobState.PENDING)),
        oldest=Min("jobs__submitted_at", filter=Q(jobs__state=JobState.PENDING)),
    ).order_by("-priority", "name"):
        chips = usage.get(q.name, [])
        nominal = sum(c["nominal"] for c in chips)
        used = sum(c["used"] for c in chips)
        wait = (now - q.oldest).total_seconds() if q.oldest else 0.0
        if q.stopped:
            health = "stopped"
        elif q.pending and wait > 3600:
            health = "starving"
        elif used > nominal:
            health = "borrowing"
        else:
            health = "ok"
        rows.append(
            {
                "id": q.pk,
                "name": q.name,
                "running": q.running,
                "pending": q.pending,
                "oldest_pending_s": round(wait, 1),
                "nominal": nominal,
                "used": used,
                "health": health,
            }
        )
    return rows
