"""The cycle keeps the pending jobs it read between cycles and reads again only the ones whose row
changed (the database raises their revision), and what it hands the engine is always what a
fresh read of the database sees: every writer alike, the reasons current, an array's limit and a
queue's name followed."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.arrays import submit_array
from scheduling.bulk import update_rows
from scheduling.cycle import reset_caches, run_cycle
from scheduling.models import Job, JobArray, Queue
from scheduling.pending import PendingStore, load_pending, pending_jobs
from scheduling.services import submit_job
from scheduling.tasks import warm_up


def _fresh(now=None, window=None):
    return PendingStore().load(now, window)  # a store with nothing cached reads every row


def _matches_a_fresh_read(now=None, window=None) -> bool:
    jobs, reasons, ranked = load_pending(now, window)
    again, reasons_again, ranked_again = _fresh(now, window)
    by_id = lambda js: {j.id: j for j in js}  # noqa: E731
    return by_id(jobs) == by_id(again) and reasons == reasons_again and ranked == ranked_again


def _submit(queues, name, **fields):
    fields = {"gpus": 8, "chip_types": ["H100-SXM"], **fields}
    return submit_job(queue=queues["vision"], name=name, **fields)


def test_pending_jobs_kept_between_cycles_are_what_a_fresh_read_sees(queues):
    jobs = [_submit(queues, f"p{i}") for i in range(10)]
    first, _, _ = load_pending()
    assert {j.id for j in first} == {j.pk for j in jobs} and _matches_a_fresh_read()
    kept = {j.id: j for j in load_pending()[0]}
    assert all(kept[j.id] is j for j in first)  # nothing changed: every job reused, none rebuilt

    # the ORM, a bulk statement and raw SQL change three jobs; another is new (fewer than half
    # changed: the changed ones are read by id, the rest kept)
    Job.objects.filter(pk=jobs[0].pk).update(priority=7)
    update_rows(Job, ["chip_types"], [(jobs[1].pk, ["A100-80G", "H100-SXM"])])
    earlier = (
        "submitted_at - INTERVAL '1 hour'"
        if connection.vendor == "postgresql"
        else "datetime(submitted_at, '-1 hour')"
    )
    with connection.cursor() as cursor:
        table = Job._meta.db_table
        cursor.execute(f"UPDATE {table} SET submitted_at = {earlier} WHERE id = %s", [jobs[2].pk])
    late = _submit(queues, "p4")
    now = {j.id: j for j in load_pending()[0]}
    assert now[jobs[0].pk].priority == 7
    assert now[jobs[1].pk].chip_types == ("A100-80G", "H100-SXM")
    assert now[jobs[2].pk].submitted_at == pytest.approx(kept[jobs[2].pk].submitted_at - 3600, abs=1)
    assert late.pk in now and now[jobs[3].pk] is kept[jobs[3].pk]
    assert _matches_a_fresh_read()

    # a reason written by someone else is what the cycle compares against (never a kept one)
    Job.objects.filter(pk=jobs[3].pk).update(pending_reason="held by an operator note")
    assert load_pending()[1][jobs[3].pk] == "held by an operator note"

    # a job requeued with a backoff is not due until its time; one that started is gone
    Job.objects.filter(pk=jobs[0].pk).update(requeue_at=timezone.now() + timedelta(minutes=5))
    Job.objects.filter(pk=jobs[1].pk).update(state="running", started_at=timezone.now())
    ids = {j.id for j in load_pending()[0]}
    assert jobs[0].pk not in ids and jobs[1].pk not in ids
    assert jobs[0].pk in {j.id for j in load_pending(timezone.now() + timedelta(minutes=6))[0]}
    assert _matches_a_fresh_read()

    # a renamed queue reads everything again
    Queue.objects.filter(name="vision").update(name="vision-renamed")
    assert {j.queue for j in load_pending()[0]} == {"vision-renamed"}
    assert _matches_a_fresh_read()


def test_an_arrays_limit_and_window_follow_the_array(queues):
    array = submit_array("0-9%2", queue=queues["vision"], gpus=1, chip_types=["H100-SXM"], name="sweep")
    jobs, _, _ = load_pending(array_window=4)
    assert len(jobs) == 4 and {j.array_limit for j in jobs} == {2}
    JobArray.objects.filter(pk=array.pk).update(max_running=5)  # on the array, not its jobs
    jobs, _, _ = load_pending(array_window=4)
    assert {j.array_limit for j in jobs} == {5}
    assert _matches_a_fresh_read(window=4) and _matches_a_fresh_read()
    # the first four start: the window moves on to the next four
    first = sorted(j.id for j in jobs)
    Job.objects.filter(pk__in=first).update(state="running", started_at=timezone.now())
    jobs, _, _ = load_pending(array_window=4)
    assert len(jobs) == 4 and min(j.id for j in jobs) > max(first)
    assert _matches_a_fresh_read(window=4)


def test_the_database_raises_a_pending_jobs_revision_for_what_the_cycle_reads(queues):
    """Every column a pending job is built from is watched by the revision trigger (the model and
    the ranking included); the reason, read afresh every cycle, is not."""
    job = _submit(queues, "r", topology="any")
    revision = lambda: Job.objects.values_list("revision", flat=True).get(pk=job.pk)  # noqa: E731
    start = revision()
    Job.objects.filter(pk=job.pk).update(pending_reason="waiting", pending_kind="other")
    assert revision() == start
    Job.objects.filter(pk=job.pk).update(chip_ranking=[{"chip": "H100-SXM"}])
    Job.objects.filter(pk=job.pk).update(model={"name": "llama3-70b"})
    Job.objects.filter(pk=job.pk).update(requeue_at=timezone.now())
    assert revision() == start + 3
    pending_jobs.reset()
    assert _matches_a_fresh_read()


def test_a_job_that_changed_and_left_between_the_two_reads_is_not_served_from_the_cache(queues, monkeypatch):
    jobs = [_submit(queues, f"q{i}") for i in range(6)]
    load_pending()
    Job.objects.filter(pk=jobs[0].pk).update(priority=5)  # its revision moves: it is read again ...
    build = PendingStore._build

    def started_meanwhile(self, *args, **kwargs):  # ... and starts between the two reads
        Job.objects.filter(pk=jobs[0].pk).update(state="running", started_at=timezone.now())
        return build(self, *args, **kwargs)

    monkeypatch.setattr(PendingStore, "_build", started_meanwhile)
    assert jobs[0].pk not in {j.id for j in load_pending()[0]}


def _worker(*queue_names):
    """What Celery's worker_ready signal sends: the consumer, its app consuming ``queue_names``."""
    queues = SimpleNamespace(consume_from={name: None for name in queue_names})
    return SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=queues)))


def _reads_whole_jobs() -> bool:
    """Whether reading the pending jobs now builds any job from its whole row."""
    with CaptureQueriesContext(connection) as queries:
        load_pending()
    return any("chip_types" in q["sql"] for q in queries.captured_queries)


def test_a_worker_that_takes_cycles_reads_the_pending_jobs_before_it_says_it_is_ready(queues):
    """A restarted worker builds the pending jobs as it starts, so its first cycle reads only their
    revisions and the jobs that changed since; a worker that takes no cycles does not keep them."""
    jobs = [_submit(queues, f"w{i}") for i in range(5)]
    reset_caches()
    warm_up(sender=_worker("default"))
    assert _reads_whole_jobs()  # nothing kept: the first read builds every job

    reset_caches()
    warm_up(sender=_worker("cycle", "default"))
    assert not _reads_whole_jobs()  # kept by the warm-up: only revisions and reasons read
    Job.objects.filter(pk=jobs[0].pk).update(priority=3)  # changed after the warm-up: read again
    assert _reads_whole_jobs() and _matches_a_fresh_read()
    summary = run_cycle()
    assert summary.admitted == 5 and Job.objects.filter(state="running").count() == 5
