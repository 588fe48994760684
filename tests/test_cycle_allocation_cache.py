"""The cycle carries its cached view of the active allocations over its own changes (admissions,
preemptions, shrinks) instead of reading every row again, and never trusts it once anyone else
changed an allocation."""

import importlib
from dataclasses import fields

import numpy as np
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cluster.models import GPU
from cluster.snapshot import topology_cache
from engine.steps.state import RunningIndex
from engine.workload import RunningJob
from scheduling import cycle
from scheduling.bulk import update_rows
from scheduling.models import AllocatedGPU, Allocation, AllocationTotals, Job, Queue
from scheduling.running import COLUMNS, RunningStore, load_running, load_running_index
from scheduling.services import change_state, submit_job
from scheduling.store import AllocationStore, NewAllocations, allocations

RUNNING_FIELDS = [f.name for f in fields(RunningJob)]


def _fresh() -> np.ndarray:
    return AllocationStore().active_pairs()  # a store with nothing cached reads every row


def _carried_matches_the_database() -> bool:
    carried, rows = allocations.cached, allocations.cached_rows
    fresh = AllocationStore()
    return (
        allocations.is_current()
        and np.array_equal(carried, fresh.active_pairs())
        and np.array_equal(rows, fresh.active_rows())
    )


def _post(client, capture, body):
    with capture(execute=True):
        response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def test_admissions_shrinks_and_preemptions_are_carried_exactly(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    small = _post(operator_client, capture, {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert small.state == "running"  # the first cycle had nothing running: nothing cached yet
    elastic = _post(
        operator_client,
        capture,
        {
            "queue": "vision",
            "gpus": 40,
            "min_gpus": 8,
            "size_step": 8,
            "chip_types": ["H100-SXM"],
            "topology": "any",
        },
    )
    assert _carried_matches_the_database()
    # nlp reclaims its lent quota: the elastic job shrinks (a resize released by the cycle itself)
    claimer = _post(
        operator_client,
        capture,
        {"queue": "nlp", "gpus": 24, "chip_types": ["H100-SXM"], "topology": "any", "priority": 5},
    )
    elastic.refresh_from_db()
    assert claimer.state == "running" and elastic.events.filter(kind="resized").exists()
    assert _carried_matches_the_database()


def test_giving_back_part_of_a_node_narrows_its_row_and_is_carried_exactly(
    queues, django_capture_on_commit_callbacks
):
    """A shrink that gives back half of an 8-GPU node (as ``apply`` does it: release the GPUs,
    then carry the view over the change): the node's row is narrowed, a released row records the
    GPUs given back, and the carried view is what a fresh read sees."""
    job = submit_job(queue=queues["vision"], gpus=16, chip_types=["H100-SXM"], name="elastic")
    gpus = np.array(GPU.objects.order_by("node_id", "index").values_list("id", flat=True)[:16])
    rows = NewAllocations()
    rows.add(job.pk, gpus)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        allocations.insert(rows, timezone.now())
        allocations.carry([], [], np.zeros((0, 2), dtype=np.int64))
    allocations.active_pairs()
    assert _carried_matches_the_database()
    given_back = gpus[12:]  # the last four GPUs of the second node
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        allocations.release(timezone.now(), job=job, gpu_ids=given_back.tolist())
        allocations.carry([], [(job.pk, given_back)], np.zeros((0, 2), dtype=np.int64))
    assert sorted(Allocation.objects.filter(job=job).values_list("bank", "slots", "active")) == [
        (0, 15, True),
        (0, 240, False),
        (0, 255, True),
    ]
    held = sorted(AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True))
    assert held == sorted(gpus[:12].tolist())
    assert _carried_matches_the_database() and allocations.cached_rows[:, 3].tolist() == [255, 15]


def test_the_cached_gpu_ids_follow_the_inventory(queues, django_capture_on_commit_callbacks):
    """A row names a node and GPU slots; the GPU ids come from the inventory. A GPU replaced under
    a held slot (a new row, a new id) shows with its new id, though no allocation changed."""
    job = submit_job(queue=queues["vision"], gpus=2, chip_types=["H100-SXM"], name="held")
    first, second = GPU.objects.order_by("node_id", "index")[:2]
    rows = NewAllocations()
    rows.add(job.pk, np.array([first.pk, second.pk]))
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        allocations.insert(rows, timezone.now())
    assert allocations.active_pairs()[:, 1].tolist() == [first.pk, second.pk]
    node, index = first.node, first.index
    first.delete()
    replaced = GPU.objects.create(node=node, index=index, uuid="GPU-replaced", serial="replaced-1")
    topology_cache.current()  # the next cycle reads the inventory first
    assert sorted(allocations.active_pairs()[:, 1].tolist()) == sorted([replaced.pk, second.pk])
    assert _carried_matches_the_database()


def test_a_release_by_anyone_else_makes_the_next_cycle_read_everything(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _post(operator_client, capture, {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"]})
    other = _post(operator_client, capture, {"queue": "nlp", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert _carried_matches_the_database()
    # released outside any cycle (as a node agent's report or an operator would)
    Allocation.objects.filter(job=other, active=True).update(active=False)
    stale = allocations.cached
    assert len(stale) == 24 and len(allocations.active_pairs()) == 16  # the key no longer matches
    assert set(allocations.active_pairs()[:, 0].tolist()) == {job.pk}


def test_a_preemption_is_carried_exactly(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    _post(
        operator_client,
        capture,
        {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    borrower = _post(
        operator_client,
        capture,
        {"queue": "vision", "gpus": 32, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    assert borrower.state == "running" and _carried_matches_the_database()
    claimer = _post(
        operator_client, capture, {"queue": "nlp", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "any"}
    )  # 8 free GPUs and vision's borrowed 8 go back (its 32 within nominal stay)
    assert claimer.state == "running" and Job.objects.filter(preemptions=1).exists()
    assert _carried_matches_the_database()


def test_a_release_during_a_cycle_is_not_hidden_by_the_carried_view(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks, monkeypatch
):
    """Another writer releases allocations after the cycle read them and before it commits: the
    carried view is kept under the key it implies, and the next read sees the database's."""
    capture = django_capture_on_commit_callbacks
    first = _post(operator_client, capture, {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert _carried_matches_the_database()
    original = cycle.apply_decisions

    def apply_then_someone_releases(*args, **kwargs):
        gpus = original(*args, **kwargs)
        Allocation.objects.filter(job=first, active=True).update(active=False)  # mid-cycle
        return gpus

    monkeypatch.setattr(cycle, "apply_decisions", apply_then_someone_releases)
    second = _post(operator_client, capture, {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"]})
    assert second.state == "running"
    monkeypatch.undo()
    assert not _carried_matches_the_database()  # the carried pairs still hold the first job
    read = allocations.active_pairs()
    assert set(read[:, 0].tolist()) == {second.pk} and len(read) == 16
    assert _carried_matches_the_database()  # the read replaced them


def _as_read(jobs) -> list[tuple]:
    return [(*(getattr(j, f) for f in RUNNING_FIELDS if f != "held"), j.held.tolist()) for j in jobs]


def _running_matches_a_fresh_read() -> bool:
    return _as_read(load_running()) == _as_read(RunningStore().load())


def test_running_jobs_kept_between_cycles_are_what_a_fresh_read_sees(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    """The cycle reuses a running job it read before only while its row, its GPUs, its queue's and
    chip's names are unchanged: every change made elsewhere shows in the next read."""
    capture = django_capture_on_commit_callbacks
    body = {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}
    jobs = [_post(operator_client, capture, body) for _ in range(3)]
    elastic = _post(operator_client, capture, {**body, "gpus": 16, "min_gpus": 8, "size_step": 8})
    assert _running_matches_a_fresh_read()
    first = {j.id: j for j in load_running()}
    assert _running_matches_a_fresh_read() and all(
        j is first[j.id] for j in load_running()
    )  # nothing changed: every job is the one read before
    Job.objects.filter(pk=jobs[0].pk).update(priority=7, last_checkpoint_at=jobs[0].started_at)
    gpu = AllocatedGPU.objects.filter(job=jobs[1], active=True).order_by("gpu_id").first()
    allocations.release(timezone.now(), job=jobs[1], gpu_ids=[gpu.gpu_id])  # a GPU taken away by someone else
    change_state(jobs[2].pk, "finish", actor="test")
    again = {j.id: j for j in load_running()}
    assert jobs[2].pk not in again and again[jobs[0].pk].priority == 7
    assert again[jobs[0].pk].last_checkpoint_at is not None and len(again[jobs[1].pk].held) == 7
    assert again[elastic.pk] is first[elastic.pk]  # unchanged: kept
    assert _running_matches_a_fresh_read()
    Queue.objects.filter(name="vision").update(name="vision-renamed")
    assert {j.queue for j in load_running()} == {"vision-renamed"}
    assert _running_matches_a_fresh_read()


def _allocation_reads(queries) -> int:
    return sum("group_concat(job_id" in q["sql"] or "concat_ws(',', job_id" in q["sql"] for q in queries)


def test_jobs_that_finished_between_cycles_cost_no_read_of_the_allocations(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    """Between two cycles jobs mostly finish: their GPUs leave the cached pairs without reading
    every active allocation again, and only while that gives exactly what the database holds."""
    capture = django_capture_on_commit_callbacks
    body = {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}
    jobs = [_post(operator_client, capture, body) for _ in range(4)]
    assert _running_matches_a_fresh_read()
    change_state(jobs[0].pk, "finish", actor="test")
    change_state(jobs[1].pk, "cancel", actor="test")
    with CaptureQueriesContext(connection) as queries:
        running = load_running()
    assert _allocation_reads(queries.captured_queries) == 0
    assert {j.id for j in running} == {jobs[2].pk, jobs[3].pk}
    assert _running_matches_a_fresh_read() and _carried_matches_the_database()
    # a job finishes and someone else also takes a GPU from another: the pairs without the
    # finished job's GPUs are not what the database holds, so everything is read
    change_state(jobs[2].pk, "finish", actor="test")
    gpu = AllocatedGPU.objects.filter(job=jobs[3], active=True).order_by("gpu_id").first()
    allocations.release(timezone.now(), job=jobs[3], gpu_ids=[gpu.gpu_id])
    with CaptureQueriesContext(connection) as queries:
        running = load_running()
    assert _allocation_reads(queries.captured_queries) == 1
    assert [(j.id, len(j.held)) for j in running] == [(jobs[3].pk, 7)]
    assert _running_matches_a_fresh_read() and _carried_matches_the_database()


def _index_figures(index):
    usage, by_queue_chip, by_chip, fractional = index.maps({"vision": 0, "nlp": 1}, {"H100-SXM": 0})
    return (
        [j.id for j in index.jobs],
        usage,
        {k: [j.id for j in v] for k, v in by_queue_chip.items()},
        sorted(index.owned().tolist()),
    )


def test_the_engines_index_of_running_jobs_grows_by_started_jobs_and_is_rebuilt_otherwise(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    """Jobs only started since the last read: the index the cycle gives the engine is the one kept,
    grown by them. Anything else (a job finished): a new one. Either way it is what a fresh read
    of every running job gives."""
    capture = django_capture_on_commit_callbacks
    body = {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}
    first = _post(operator_client, capture, body)
    kept = load_running_index()
    _post(operator_client, capture, body)
    _post(operator_client, capture, {**body, "queue": "nlp"})
    grown = load_running_index()
    assert grown is kept and len(grown.jobs) == 3
    assert _index_figures(grown) == _index_figures(RunningIndex(RunningStore().load()))
    change_state(first.pk, "finish", actor="test")
    rebuilt = load_running_index()
    assert rebuilt is not kept and len(rebuilt.jobs) == 2
    assert _index_figures(rebuilt) == _index_figures(RunningIndex(RunningStore().load()))


def test_a_changed_job_that_stops_between_the_two_reads_leaves_the_index(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks, monkeypatch
):
    """A running job changed since the last read and stopped before its row was read again (it is
    not rebuilt): neither the jobs nor the engine's index keep it, though every other job is as
    it was."""
    capture = django_capture_on_commit_callbacks
    body = {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}
    first = _post(operator_client, capture, body)
    second = _post(operator_client, capture, body)
    assert len(load_running_index().jobs) == 2
    Job.objects.filter(pk=second.pk).update(priority=3)
    build = RunningStore._build

    def stopped_meanwhile(self, ids, *args):
        return {i: j for i, j in build(self, ids, *args).items() if i != second.pk}

    monkeypatch.setattr(RunningStore, "_build", stopped_meanwhile)
    index = load_running_index()
    assert [j.id for j in index.jobs] == [first.pk] and [j.id for j in load_running()] == [first.pk]


def test_the_database_raises_a_jobs_revision_on_every_write_the_scheduler_reads(queues):
    """The trigger behind the running jobs' cache: ORM saves, bulk statements and raw SQL raise the
    revision when they name a column the engine reads; a pending reason alone does not."""
    job = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], name="r")

    def revision() -> int:
        return Job.objects.values_list("revision", flat=True).get(pk=job.pk)

    start = revision()
    Job.objects.filter(pk=job.pk).update(pending_reason="waiting", pending_kind="other")
    assert revision() == start
    Job.objects.filter(pk=job.pk).update(priority=3)
    update_rows(Job, ["gpus"], [(job.pk, 16)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET last_checkpoint_at = started_at WHERE id = %s", [job.pk]
        )
    job.refresh_from_db()
    job.save()
    assert revision() == start + 4
    watched = importlib.import_module("scheduling.migrations.0031_job_revision_pending_columns").WATCHED
    assert set(COLUMNS) | {"queue_id", "chip_id"} <= {c.strip() for c in watched.split(",")}


def _summed(rows: np.ndarray) -> tuple[int, int, int, int]:
    """What the key counts, computed here from the rows themselves (job, node, bank, slots)."""
    jobs, place = rows[:, 0], rows[:, 1] * 16 + rows[:, 2]
    mix = (jobs * 2654435761 + place * 40503 + rows[:, 3] * 69069) % 1000000007
    return len(rows), int(jobs.sum()), int(place.sum()), int(mix.sum())


def _key_figures() -> tuple:
    with connection.cursor() as cursor:
        return AllocationStore().key(cursor)[2:]


@pytest.mark.postgres
def test_the_totals_postgresql_keeps_follow_every_writer(queues, monkeypatch):
    """The key PostgreSQL keeps by trigger (AllocationTotals) is what the active rows add up to
    after inserts, releases, a GPU given back and taken again, deletes, any writer, and after
    the cycle folds its rows into one."""
    from scheduling import store

    jobs = [
        submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], name=f"t{i}") for i in range(3)
    ]
    gpus = list(GPU.objects.order_by("id").values_list("id", flat=True)[:24])
    rows = NewAllocations()
    for i, job in enumerate(jobs):
        rows.add(job.pk, np.asarray(gpus[8 * i : 8 * i + 8]))
    allocations.insert(rows, timezone.now())
    assert _key_figures() == _summed(AllocationStore().active_rows())
    Allocation.objects.filter(job=jobs[0]).update(active=False, released_at=timezone.now())
    assert _key_figures() == _summed(AllocationStore().active_rows())
    # one GPU given back (its row narrowed, a released row written), then taken by another job
    first = AllocatedGPU.objects.filter(job=jobs[1], active=True).order_by("gpu_id").first()
    allocations.release(timezone.now(), job=jobs[1], gpu_ids=[first.gpu_id])
    assert _key_figures() == _summed(AllocationStore().active_rows())
    swapped = NewAllocations()
    swapped.add(jobs[2].pk, np.asarray([first.gpu_id]))
    allocations.insert(swapped, timezone.now(), {jobs[2].pk: 500})
    assert _key_figures() == _summed(AllocationStore().active_rows())
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Allocation._meta.db_table} WHERE job_id = %s", [jobs[1].pk])
    assert _key_figures() == _summed(AllocationStore().active_rows())
    monkeypatch.setattr(store, "FOLD_ROWS", 2)
    store.AllocationStore.fold()
    assert AllocationTotals.objects.count() == 1
    assert _key_figures() == _summed(AllocationStore().active_rows())
