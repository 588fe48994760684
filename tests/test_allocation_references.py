"""An allocation always names a job, a node and GPUs of that node that exist, on SQLite (foreign
keys and a trigger) and on PostgreSQL (statement-level triggers that check a whole COPY at once),
and a node or job cannot be deleted from under an allocation, even by a transaction racing an
insert."""

import threading
import time

import numpy as np
import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from cluster.models import GPU
from scheduling.models import AllocatedGPU, Allocation, Job
from scheduling.store import NewAllocations, allocations


def _job(queues) -> Job:
    return Job.objects.create(
        queue=queues["vision"], gpus=2, chip_types=["H100-SXM"], topology="any", submitted_at=timezone.now()
    )


def _rows(job_id: int, gpu_ids) -> NewAllocations:
    rows = NewAllocations()
    rows.add(job_id, np.asarray(gpu_ids))
    return rows


def _check_now() -> None:
    """SQLite checks its (deferred) foreign keys at commit; ask for the check at once."""
    if connection.vendor == "sqlite":
        connection.check_constraints(table_names=[Allocation._meta.db_table])


def test_allocations_are_written_for_existing_jobs_and_gpus(queues):
    job = _job(queues)
    gpus = list(GPU.objects.order_by("id").values_list("id", flat=True)[:2])
    with transaction.atomic():
        allocations.insert(_rows(job.pk, gpus), timezone.now())
        _check_now()
    assert sorted(AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True)) == gpus


@pytest.mark.parametrize("missing", ["gpu", "job"])
def test_an_allocation_naming_a_missing_gpu_or_job_is_refused(queues, missing):
    job = _job(queues)
    gpu = GPU.objects.order_by("id").first()
    with pytest.raises(IntegrityError), transaction.atomic():
        if missing == "job":
            allocations.insert(_rows(10**9, [gpu.pk]), timezone.now())
        else:  # bank 1 of an 8-GPU node: GPUs 8-15, which it does not have
            Allocation.objects.create(job=job, node=gpu.node, bank=1, slots=1, created_at=timezone.now())
        _check_now()
    assert not Allocation.objects.exists()


def test_the_store_refuses_a_gpu_the_inventory_does_not_have(queues):
    job = _job(queues)
    with pytest.raises(ValueError, match="not in the inventory"), transaction.atomic():
        allocations.insert(_rows(job.pk, [10**9]), timezone.now())
    assert not Allocation.objects.exists()


def test_deleting_a_node_that_an_allocation_names_is_refused(queues):
    job = _job(queues)
    gpu = GPU.objects.order_by("id").first()
    with transaction.atomic():
        allocations.insert(_rows(job.pk, [gpu.pk]), timezone.now())
    Allocation.objects.filter(job=job).update(active=False, released_at=timezone.now())
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        gpu.node.gpus.all()._raw_delete(connection.alias)
        type(gpu.node).objects.filter(pk=gpu.node_id)._raw_delete(connection.alias)  # no ORM cascade
        _check_now()
    if connection.vendor == "postgresql":
        assert "a deleted node is still named by an allocation" in str(refused.value)
    assert GPU.objects.filter(pk=gpu.pk).exists()
    # the ORM deletes the allocations first (CASCADE), so deleting the job through it works
    job.delete()
    assert not Allocation.objects.exists()


def test_deleting_a_job_that_an_allocation_names_is_refused(queues):
    job = _job(queues)
    with transaction.atomic():
        allocations.insert(_rows(job.pk, [GPU.objects.order_by("id").first().pk]), timezone.now())
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        Job.objects.filter(pk=job.pk)._raw_delete(connection.alias)  # no ORM cascade
        _check_now()
    if connection.vendor == "postgresql":
        assert "a deleted job is still named by an allocation" in str(refused.value)
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.postgres
def test_an_allocations_job_and_node_never_change_and_its_gpus_never_grow(queues):
    job = _job(queues)
    first, second = GPU.objects.order_by("id")[:2]
    with transaction.atomic():
        allocations.insert(_rows(job.pk, [first.pk, second.pk]), timezone.now())
    other = type(first.node).objects.exclude(pk=first.node_id).first()
    row = Allocation.objects.get(job=job)
    for change in ({"node_id": other.pk}, {"bank": 1}, {"slots": row.slots | 4}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Allocation.objects.filter(pk=row.pk).update(**change)
    Allocation.objects.filter(pk=row.pk).update(slots=row.slots & ~2)  # giving GPUs back is allowed
    assert list(AllocatedGPU.objects.filter(job=job).values_list("gpu_id", flat=True)) == [first.pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_node_deleted_while_an_allocation_is_written_is_refused(queues):
    """The deleting transaction waits for the one writing the allocation, then sees its row."""
    job = _job(queues)
    first = GPU.objects.order_by("id").first()
    gpu, node = first.pk, first.node_id
    written, outcome = threading.Event(), {}

    def delete_gpu():
        written.wait(10)
        try:
            with transaction.atomic():
                type(first.node).objects.filter(pk=node)._raw_delete(connection.alias)
            outcome["deleted"] = True
        except IntegrityError as exc:
            outcome["refused"] = str(exc)
        finally:
            connection.close()

    deleter = threading.Thread(target=delete_gpu)
    deleter.start()
    with transaction.atomic():
        allocations.insert(_rows(job.pk, [gpu]), timezone.now())
        written.set()
        time.sleep(0.5)  # the deleter is now waiting for this transaction
        assert deleter.is_alive()
    deleter.join(10)
    assert "a deleted node is still named by an allocation" in outcome.get("refused", ""), outcome
    assert GPU.objects.filter(pk=gpu).exists()
    assert AllocatedGPU.objects.filter(gpu_id=gpu, active=True).count() == 1
