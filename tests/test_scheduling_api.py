"""Submitting, following and controlling jobs through the API, with cycles run by Celery tasks."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster.models import GPU
from scheduling.cycle import run_cycle
from scheduling.models import AllocatedGPU, Allocation, Job, JobEvent


def submit(client, capture, **body):
    with capture(execute=True):
        response = client.post(
            "/api/v1/jobs/", {"queue": "vision", "chip_types": ["H100-SXM"], **body}, format="json"
        )
    return response


def test_a_submitted_job_is_scheduled_by_the_triggered_cycle(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    response = submit(operator_client, django_capture_on_commit_callbacks, name="pretrain", gpus=16)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == "running" and job.chip.name == "H100-SXM" and job.placement.startswith("rack ")
    assert AllocatedGPU.objects.filter(job=job, active=True).count() == 16
    detail = operator_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert [e["kind"] for e in detail["events"]] == ["submitted", "admitted", "placed"]
    assert len(detail["gpu_ids"]) == 16 and detail["pending_reason"] == ""


def test_a_job_that_cannot_run_yet_says_why(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    submit(operator_client, django_capture_on_commit_callbacks, gpus=32)
    response = submit(operator_client, django_capture_on_commit_callbacks, gpus=48, topology="any")
    job = operator_client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["state"] == "pending"
    assert job["pending_reason"].startswith(
        "quota of queue vision exhausted for H100-SXM (32 of nominal 32 in use, needs 48) "
        "and cohort research has 32 to lend"
    )


def test_viewers_follow_jobs_but_cannot_submit_or_cancel(queues, viewer_client, operator_client):
    assert (
        viewer_client.post("/api/v1/jobs/", {"queue": "vision", "gpus": 8}, format="json").status_code == 403
    )
    job = Job.objects.create(queue=queues["vision"], gpus=8, submitted_at=timezone.now())
    assert viewer_client.get("/api/v1/jobs/").json()["count"] == 1
    assert viewer_client.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert (
        viewer_client.patch(
            f"/api/v1/queues/{queues['vision'].pk}/", {"priority": 5}, format="json"
        ).status_code
        == 403
    )
    assert operator_client.get("/api/v1/jobs/", {"state": "pending", "queue": "vision"}).json()["count"] == 1


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"gpus": 8, "chip_types": ["H900"]}, "chip_types", "unknown chip type H900"),
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        (
            {"gpus": 10_000},
            "gpus",
            "the cluster has only 48 GPUs of H100-SXM (spares kept aside); 10000 requested",
        ),
        (
            {"gpus": 24, "topology": "rack"},
            "topology",
            "no rack can ever hold 24 GPUs of H100-SXM: the largest has 16",
        ),
        ({"gpus": 8, "queue": "nobody"}, "queue", "does not exist"),
        ({"gpus": 8, "topology": "galaxy"}, "topology", "not a valid choice"),
        ({"gpus": 8, "estimated_duration_s": -5}, "estimated_duration_s", "greater than or equal to 1"),
    ],
)
def test_bad_submissions_are_refused_with_the_field_named(queues, operator_client, body, field, message):
    response = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "chip_types": ["H100-SXM"], **body}, format="json"
    )
    assert response.status_code == 400
    assert message in str(response.json()[field])
    assert not Job.objects.exists()


def test_cancel_suspend_and_resume(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    job_id = submit(operator_client, django_capture_on_commit_callbacks, gpus=8).json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        suspended = operator_client.post(f"/api/v1/jobs/{job_id}/suspend/", {"reason": "maintenance"})
    assert suspended.json()["state"] == "suspended"
    assert not Allocation.objects.filter(job_id=job_id, active=True).exists()
    with django_capture_on_commit_callbacks(execute=True):
        resumed = operator_client.post(f"/api/v1/jobs/{job_id}/resume/")
    assert resumed.json()["state"] in ("pending", "running")
    assert Job.objects.get(pk=job_id).state == "running"  # the cycle ran after the resume committed
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = operator_client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert cancelled.json()["state"] == "cancelled"
    refused = operator_client.post(f"/api/v1/jobs/{job_id}/resume/")
    assert (
        refused.status_code == 409 and "cannot resume a job that is cancelled" in refused.json()["state"][0]
    )
    kinds = list(JobEvent.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds == [
        "submitted",
        "admitted",
        "placed",
        "suspended",
        "resumed",
        "admitted",
        "placed",
        "cancelled",
    ]


def test_queue_crud_with_quotas_and_live_usage(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    created = operator_client.post(
        "/api/v1/queues/",
        {"name": "speech", "cohort": "research", "quotas": [{"chip_type": "H100-SXM", "nominal": 0}]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    submit(operator_client, django_capture_on_commit_callbacks, gpus=48, topology="any")  # vision borrows 16
    queues_by_name = {q["name"]: q for q in operator_client.get("/api/v1/queues/").json()["results"]}
    vision = {u["chip_type"]: u for u in queues_by_name["vision"]["usage"]}["H100-SXM"]
    assert (vision["nominal"], vision["used"], vision["borrowed"], vision["lent"]) == (32, 48, 16, 0)
    nlp = {u["chip_type"]: u for u in queues_by_name["nlp"]["usage"]}["H100-SXM"]
    assert nlp["lent"] == 16
    bad = operator_client.patch(
        f"/api/v1/queues/{queues['nlp'].pk}/",
        {"quotas": [{"chip_type": "H100-SXM", "nominal": 8, "lending_limit": 9}]},
        format="json",
    )
    assert bad.status_code == 400 and "lending_limit" in str(bad.json())
    assert (
        operator_client.patch(f"/api/v1/queues/{queues['nlp'].pk}/", {"weight": 0}, format="json").status_code
        == 400
    )


def test_a_stopped_queue_admits_nothing(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert operator_client.post(f"/api/v1/queues/{queues['vision'].pk}/stop/").json()["stopped"] is True
    job = submit(operator_client, django_capture_on_commit_callbacks, gpus=8).json()
    assert (
        operator_client.get(f"/api/v1/jobs/{job['id']}/").json()["pending_reason"]
        == "queue vision is stopped"
    )
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post(f"/api/v1/queues/{queues['vision'].pk}/resume/")
    assert Job.objects.get(pk=job["id"]).state == "running"


def test_reclaim_preempts_the_borrower_and_requeues_it(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    # every H100 GPU but the two spare nodes (kept for recovery): 16 of them borrowed from nlp
    borrower = submit(operator_client, django_capture_on_commit_callbacks, gpus=48, topology="any").json()
    assert Job.objects.get(pk=borrower["id"]).state == "running"
    owner = submit(operator_client, django_capture_on_commit_callbacks, queue="nlp", gpus=16).json()
    victim = Job.objects.get(pk=borrower["id"])
    assert Job.objects.get(pk=owner["id"]).state == "running"
    assert victim.state == "pending" and victim.preemptions == 1
    assert (
        victim.pending_reason.startswith("quota of queue vision exhausted")
        or "preempt" in victim.pending_reason
    )
    kinds = list(victim.events.values_list("kind", "reason"))
    assert (
        "preempted",
        f"preempted by job {owner['id']}: queue nlp reclaims H100-SXM quota lent to queue vision "
        "(borrowed quota goes back first)",
    ) in kinds
    assert kinds[-1][0] == "requeued"
    assert not Allocation.objects.filter(job=victim, active=True).exists()


def test_the_database_refuses_a_gpu_in_two_active_allocations(queues):
    now = timezone.now()
    a = Job.objects.create(queue=queues["vision"], gpus=1, submitted_at=now, state="running")
    b = Job.objects.create(queue=queues["vision"], gpus=1, submitted_at=now, state="running")
    gpu = GPU.objects.first()
    Allocation.objects.hold(a, [gpu], created_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.hold(b, [gpu], created_at=now)
    Allocation.objects.filter(job=a).update(active=False, released_at=now)
    Allocation.objects.hold(b, [gpu], created_at=now)  # released GPUs can be allocated again


def test_a_cycle_over_an_empty_queue_changes_nothing(queues):
    summary = run_cycle()
    assert summary.ran and summary.admitted == 0 and summary.considered == 0


def test_the_openapi_schema_covers_scheduling(db, tmp_path):
    import yaml
    from django.core.management import call_command

    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    paths = yaml.safe_load(out.read_text())["paths"]
    for path in (
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/queues/{id}/stop/",
        "/api/v1/cohorts/",
    ):
        assert path in paths


def test_the_partial_unique_index_exists_after_every_migration(db):
    """Schema changes on the allocation table must never lose the guard against double allocation."""
    from django.db import connection

    table = Allocation._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT c.relname, i.indisunique, array(SELECT a.attname FROM pg_attribute a "
                "WHERE a.attrelid = c.oid ORDER BY a.attnum) FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
                [table],
            )
            indexes = {name: (unique, list(columns)) for name, unique, columns in cursor.fetchall()}
        else:
            cursor.execute(f"PRAGMA index_list({table})")
            indexes = {}
            for _, name, unique, *_ in cursor.fetchall():
                cursor.execute(f"PRAGMA index_info({name})")
                indexes[name] = (bool(unique), [row[2] for row in cursor.fetchall()])
    for k in range(8):  # one per bit of a row's GPU slots
        assert indexes.get(f"gpu_slot{k}_in_one_active_allocation") == (True, ["node_id", "bank"])


def test_a_submitted_job_row_is_the_one_the_orm_would_write(queues, operator_client):
    """The submit path writes its two rows from prepared statements; every column must equal what
    Job.objects.create and JobEvent.objects.create write for the same values."""
    from django.forms.models import model_to_dict

    from scheduling.models import Job, JobEvent

    body = {
        "queue": "vision",
        "gpus": 16,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "estimated_duration_s": 3600,
        "name": "row check",
        "model": {"preset": "llama3-8b"},
    }
    response = operator_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    fast = Job.objects.get(pk=response.json()["id"])
    orm = Job.objects.create(
        **{f.attname: getattr(fast, f.attname) for f in Job._meta.concrete_fields if f.attname != "id"}
    )
    orm.refresh_from_db()
    assert {k: v for k, v in model_to_dict(fast).items() if k != "id"} == {
        k: v for k, v in model_to_dict(orm).items() if k != "id"
    }
    event = JobEvent.objects.get(job=fast, kind="submitted")
    assert event.at == fast.submitted_at and event.reason == "submitted to queue vision"
    assert event.data["gpus"] == 16 and event.data["topology"] == "pod"
    assert fast.submitted_at is not None and fast.state == "pending"
    # JSON columns hold JSON values, not JSON text
    assert fast.chip_types == ["H100-SXM"] and isinstance(fast.model, dict) and fast.model
    assert Job.objects.filter(pk=fast.pk, chip_types__0="H100-SXM").exists()
    assert JobEvent.objects.filter(pk=event.pk, data__gpus=16).exists()


def test_a_submit_answers_without_looking_for_a_forecast(queues, operator_client):
    """A job just written has no expected start yet; the answer says so without a query for one
    (a submit is a handful of statements, and pipelines send thousands)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling.forecast_models import JobForecast

    with CaptureQueriesContext(connection) as queries:
        response = operator_client.post(
            "/api/v1/jobs/", {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]}, format="json"
        )
    assert response.status_code == 201, response.content
    assert response.json()["expected_start"] is None
    table = JobForecast._meta.db_table
    assert not [q["sql"] for q in queries.captured_queries if table in q["sql"]]
