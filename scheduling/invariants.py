"""The invariant checker on the database: what must hold whatever ran before (cycles on several
workers, cancels, faults, finishes, a worker killed half-way). It reads the rows afresh, never a
cache, so it sees what another process committed:

- no GPU is held beyond its capacity (two whole-GPU allocations, or shares above 1000
  thousandths): a *double allocation*;
- every quota rule holds for the usage of the active allocations (the engine's own quota book,
  ``engine.quota.QuotaBook.violations``);
- an active allocation belongs to a running job, and a running job holds at least one GPU;
- a job that ended (cancelled, finished, failed) is never running again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Q, Sum

from cluster.models import ChipType
from engine.quota import build_quota_book
from scheduling.choices import JobState
from scheduling.models import AllocatedGPU, Allocation, Job
from scheduling.store import load_queues
from scheduling.usage import held_by_queue_and_chip


@dataclass
class StateReport:
    double_allocations: int = 0  # GPUs held beyond their capacity
    quota_violations: list[str] = field(default_factory=list)
    orphan_allocations: int = 0  # active allocations of jobs that are not running
    running_without_gpus: int = 0
    resurrected: int = 0  # running jobs that had already ended (cancelled, finished or failed)

    @property
    def problems(self) -> list[str]:
        out = list(self.quota_violations)
        if self.double_allocations:
            out.append(f"{self.double_allocations} GPUs are held beyond their capacity")
        if self.orphan_allocations:
            out.append(f"{self.orphan_allocations} active allocations belong to jobs that are not running")
        if self.running_without_gpus:
            out.append(f"{self.running_without_gpus} running jobs hold no GPU")
        if self.resurrected:
            out.append(f"{self.resurrected} running jobs had already ended")
        return out


def check_database() -> StateReport:
    """Read the committed state and report every broken rule (call it outside a cycle)."""
    active = AllocatedGPU.objects.filter(active=True)
    report = StateReport()
    report.double_allocations = (
        active.values("gpu_id").annotate(total=Sum("share")).filter(total__gt=1000).count()
    )
    report.orphan_allocations = (
        Allocation.objects.filter(active=True).exclude(job__state=JobState.RUNNING).gpu_count()
    )
    report.running_without_gpus = (
        Job.objects.filter(state=JobState.RUNNING)
        .annotate(held=Count("allocations", filter=Q(allocations__active=True)))
        .filter(held=0)
        .count()
    )
    report.resurrected = Job.objects.filter(state=JobState.RUNNING, finished_at__isnull=False).count()
    chips = list(ChipType.objects.order_by("name").values_list("name", flat=True))
    book = build_quota_book(load_queues(), chips, [], usage_by=held_by_queue_and_chip())
    report.quota_violations = book.violations()
    return report
