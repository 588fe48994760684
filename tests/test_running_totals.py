"""PostgreSQL keeps what the running jobs add up to (RunningTotals, by trigger), and a cycle that
knows what it changed itself reads no running job's id and revision in the next cycle, unless
someone else changed a running job meanwhile."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling import running as running_module
from scheduling.bulk import update_rows
from scheduling.models import Job, RunningTotals
from scheduling.running import RunningStore, _figures, _read_running, _totals, load_running
from scheduling.services import change_state, submit_job

pytestmark = pytest.mark.postgres


def _reads_of_every_running_job(queries) -> int:
    return sum("string_agg(id::text" in q["sql"] for q in queries)


def test_the_totals_follow_every_writer_of_jobs(queues, monkeypatch):
    """Starts, revisions raised by the ORM, bulk statements and raw SQL, a finish, a delete, and
    the fold into one row: the totals are always what the running rows add up to."""
    vision = queues["vision"]
    jobs = [submit_job(queue=vision, gpus=8, chip_types=["H100-SXM"], name=f"t{i}") for i in range(3)]
    assert _totals() == _figures(_read_running()) == (0, 0, 0, 0)
    now = timezone.now()
    update_rows(Job, ["state", "started_at"], [(j.pk, "running", now) for j in jobs])
    assert _totals() == _figures(_read_running()) and _totals()[0] == 3
    Job.objects.filter(pk=jobs[0].pk).update(priority=4)  # a running job's revision rises
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Job._meta.db_table} SET gpus = 16 WHERE id = %s", [jobs[1].pk])
    Job.objects.filter(pk=jobs[2].pk).update(pending_reason="not watched")  # no revision: no change
    assert _totals() == _figures(_read_running())
    change_state(jobs[0].pk, "finish", actor="test")
    Job.objects.filter(pk=jobs[1].pk).delete()
    assert _totals() == _figures(_read_running()) and _totals()[0] == 1
    monkeypatch.setattr("scheduling.store.FOLD_ROWS", 2)
    running_module.fold_totals(RunningTotals)
    assert RunningTotals.objects.count() == 1 and _totals() == _figures(_read_running())


def test_a_cycle_after_a_cycle_reads_no_running_job_unless_someone_else_changed_one(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    body = {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}

    def post():
        with capture(execute=True):
            response = operator_client.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        return Job.objects.get(pk=response.json()["id"])

    first = post()
    with CaptureQueriesContext(connection) as queries:
        second = post()  # its cycle's read follows the first cycle's carried rows
    assert second.state == "running" and _reads_of_every_running_job(queries.captured_queries) == 0
    with CaptureQueriesContext(connection) as queries:
        jobs = {j.id: j for j in load_running()}
    assert _reads_of_every_running_job(queries.captured_queries) == 0 and set(jobs) == {first.pk, second.pk}
    # someone else raises a running job's priority: the next read reads every running job
    Job.objects.filter(pk=first.pk).update(priority=9)
    with CaptureQueriesContext(connection) as queries:
        post()
    assert _reads_of_every_running_job(queries.captured_queries) == 1
    fresh = {j.id: j.priority for j in RunningStore().load()}
    assert {j.id: j.priority for j in load_running()} == fresh and fresh[first.pk] == 9
