"""Upgrading a database with allocations written one row per GPU (migration 0033) to rows per node
and bank (0034-0035) keeps every allocation, active and released, and the guarantees after it."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from cluster.models import GPU
from scheduling.models import AllocatedGPU, Allocation, Job
from scheduling.store import AllocationStore

BEFORE = [("scheduling", "0033_running_totals")]


def _migrate(target) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def _latest():
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == "scheduling"]


def _job(queues, name: str) -> Job:
    return Job.objects.create(
        queue=queues["vision"], gpus=2, chip_types=["H100-SXM"], name=name, submitted_at=timezone.now()
    )


@pytest.mark.django_db(transaction=True)
def test_rows_per_gpu_become_rows_per_node_and_bank(queues):
    latest = _latest()
    a, b, c = (_job(queues, name) for name in "abc")
    gpus = list(GPU.objects.order_by("node_id", "index")[:24])  # three 8-GPU nodes
    then, later = timezone.now(), timezone.now()
    old = [(a.pk, g.pk, True, 1000, then, None) for g in gpus[:10]]  # a whole node and two GPUs
    old += [(b.pk, g.pk, False, 1000, then, later) for g in gpus[:4]]  # history on a's GPUs
    old += [(b.pk, gpus[12].pk, True, 500, then, None), (c.pk, gpus[12].pk, True, 500, then, None)]
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO scheduling_allocation (job_id, gpu_id, active, share, created_at, released_at) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                old,
            )
    finally:
        _migrate(latest)
    AllocationStore().reset()
    rows = sorted(Allocation.objects.values_list("job_id", "node_id", "bank", "slots", "active", "share"))
    n0, n1 = gpus[0].node_id, gpus[8].node_id
    assert rows == sorted(
        [
            (a.pk, n0, 0, 255, True, 1000),
            (a.pk, n1, 0, 3, True, 1000),
            (b.pk, n0, 0, 15, False, 1000),
            (b.pk, n1, 0, 16, True, 500),
            (c.pk, n1, 0, 16, True, 500),
        ]
    )
    per_gpu = sorted(
        AllocatedGPU.objects.values_list("job_id", "gpu_id", "active", "share", "created_at", "released_at")
    )
    assert per_gpu == sorted(old)
    # the guarantee holds on the carried rows: a's GPUs cannot be taken again
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.hold(c, [gpus[9]], created_at=timezone.now())
