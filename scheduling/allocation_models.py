"""Allocations: which job holds which GPUs of a node, one row per job, node and bank of eight GPUs.

A node's GPU ``i`` is bit ``i % 8`` of the ``slots`` of the row whose ``bank`` is ``i // 8``: an
8-GPU node taken by one job is one row, not eight, and a 100k-GPU fill writes ~12,000 rows
instead of 90,000. The database keeps the rule that must never break, that a GPU is in at most
one active whole allocation, with one partial unique index per bit: ``(node, bank)`` is unique
among the active whole rows that have bit ``k`` set, for each ``k``. Shared GPUs (a job taking a
fraction) hold one bit; the shared-GPU triggers keep a whole allocation off a shared GPU and the
fractions of one GPU within 1000.

``AllocatedGPU`` reads the same rows one GPU at a time (a database view joining the GPUs): what
the pages, the API, chargeback and the checks ask of allocations, with the GPU's own lookups.
Writes go through ``scheduling.store`` (the cycle) or ``Allocation.objects.hold`` (one job).
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.db.models.lookups import Exact

BANK = 8  # GPU slots per row: bit k of ``slots`` is the node's GPU ``8 * bank + k``
WHOLE = 1000  # a share of 1000 thousandths is a whole GPU


def place(index: int) -> tuple[int, int]:
    """(bank, slot mask) of a node's GPU ``index``."""
    return index // BANK, 1 << (index % BANK)


def _bit(k: int) -> Q:
    return Q(Exact(F("slots").bitand(1 << k), 1 << k))


# how many GPUs a row holds (its set bits), as SQL both databases run
GPU_COUNT = sum((F("slots").bitrightshift(k).bitand(1) for k in range(1, BANK)), F("slots").bitand(1))


# a row's GPUs in thousandths (shared GPUs count their fraction), as the scheduler charges quota
HELD_SHARE = GPU_COUNT * F("share")


class AllocationQuerySet(models.QuerySet):
    def gpu_count(self) -> int:
        """How many GPUs these rows hold."""
        return int(self.aggregate(n=models.Sum(GPU_COUNT))["n"] or 0)


class AllocationManager(models.Manager.from_queryset(AllocationQuerySet)):
    def hold(self, job, gpus, *, created_at, share: int = WHOLE, active: bool = True) -> list:
        """Write ``job``'s hold on ``gpus`` (GPU objects): one row per node and bank."""
        rows: dict[tuple[int, int], int] = {}
        for gpu in gpus:
            bank, bit = place(gpu.index)
            rows[(gpu.node_id, bank)] = rows.get((gpu.node_id, bank), 0) | bit
        written = []
        for (node, bank), mask in sorted(rows.items()):
            written.append(
                self.create(
                    job=job,
                    node_id=node,
                    bank=bank,
                    slots=mask,
                    share=share,
                    active=active,
                    created_at=created_at,
                )
            )
        return written


class Allocation(models.Model):
    # No separate single-column indexes: (job, node, bank) of active rows serves job lookups and
    # the partial unique indexes serve "who holds this GPU"; fewer indexes keep a fill fast. On
    # PostgreSQL the references are checked per statement by triggers (migration 0035), not per row
    # by foreign keys; SQLite keeps its foreign keys. The rules are the same.
    job = models.ForeignKey(
        "scheduling.Job", on_delete=models.CASCADE, related_name="allocations", db_index=False
    )
    node = models.ForeignKey(
        "cluster.Node", on_delete=models.CASCADE, related_name="allocations", db_index=False
    )
    bank = models.PositiveSmallIntegerField(default=0, help_text="GPUs 8 x bank to 8 x bank + 7 of the node")
    slots = models.PositiveSmallIntegerField(help_text="Bit k set: the node's GPU 8 x bank + k")
    active = models.BooleanField(default=True)
    share = models.PositiveSmallIntegerField(default=WHOLE, help_text="Thousandths of each GPU")
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    objects = AllocationManager()

    class Meta:
        constraints = [
            # a whole GPU is in at most one active allocation: per bit, (node, bank) is unique among
            # the active whole rows with that bit set
            *(
                models.UniqueConstraint(
                    fields=["node", "bank"],
                    condition=Q(active=True, share=WHOLE) & _bit(k),
                    name=f"gpu_slot{k}_in_one_active_allocation",
                )
                for k in range(BANK)
            ),
            models.CheckConstraint(
                condition=Q(share__gte=1, share__lte=WHOLE), name="allocation_share_range"
            ),
            models.CheckConstraint(condition=Q(slots__gte=1, slots__lte=255), name="allocation_slots_range"),
            models.CheckConstraint(condition=Q(bank__lte=8), name="allocation_bank_range"),
            # a fraction is of one GPU
            models.CheckConstraint(
                condition=Q(share=WHOLE) | Q(slots__in=[1 << k for k in range(BANK)]),
                name="allocation_shared_one_gpu",
            ),
        ]
        indexes = [
            # Released allocations stay as history and outnumber the active ones as time goes on;
            # the cycle's reads ("every active allocation, by job") and the per-job lookups only
            # ever ask for active rows, so only those are indexed, job first.
            models.Index(
                fields=["job", "node", "bank", "slots"],
                include=["id"],
                condition=Q(active=True),
                name="allocation_active_rows",
            ),
            # the agents' "what runs on my node", recovery's "who holds these GPUs"
            models.Index(fields=["node", "bank"], condition=Q(active=True), name="allocation_active_by_node"),
            # "is any GPU shared?" answered at once (normally empty)
            models.Index(
                fields=["node", "bank"],
                condition=Q(active=True, share__lt=WHOLE),
                name="allocation_shared_rows",
            ),
        ]

    def __str__(self) -> str:
        gpus = ",".join(str(self.bank * BANK + k) for k in range(BANK) if self.slots >> k & 1)
        return f"job {self.job_id} on node {self.node_id} GPUs {gpus}" + (
            "" if self.active else " (released)"
        )


class AllocatedGPU(models.Model):
    """One GPU of an allocation (a read-only view over ``Allocation`` joined with the GPUs,
    migration 0034): ``id`` is the allocation's id x 128 + the GPU's index on its node."""

    id = models.BigIntegerField(primary_key=True)
    allocation = models.ForeignKey(
        Allocation, on_delete=models.DO_NOTHING, related_name="gpus", db_constraint=False
    )
    job = models.ForeignKey(
        "scheduling.Job", on_delete=models.DO_NOTHING, related_name="gpus_held", db_constraint=False
    )
    gpu = models.ForeignKey(
        "cluster.GPU", on_delete=models.DO_NOTHING, related_name="allocations", db_constraint=False
    )
    node = models.ForeignKey(
        "cluster.Node", on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    index = models.PositiveSmallIntegerField("index on node")
    active = models.BooleanField()
    share = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "scheduling_allocatedgpu"
        verbose_name = "allocated GPU"

    def __str__(self) -> str:
        return f"job {self.job_id} on GPU {self.gpu_id}" + ("" if self.active else " (released)")
