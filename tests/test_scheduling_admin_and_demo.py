"""Scheduling in the admin, and the demo's example queues."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from scheduling.models import Job, Queue


@pytest.fixture
def admin_client_logged_in(db):
    client = Client()
    client.force_login(User.objects.create_superuser("ada", "ada@example.com", "pw"))
    return client


@pytest.mark.parametrize("model", ["cohort", "queue", "job"])
def test_scheduling_changelists_open(queues, admin_client_logged_in, model):
    Job.objects.create(
        queue=queues["vision"], gpus=8, submitted_at=timezone.now(), pending_reason="queue full"
    )
    assert admin_client_logged_in.get(reverse(f"admin:scheduling_{model}_changelist")).status_code == 200


def test_admin_cancels_jobs_in_bulk_and_reports_refusals(queues, admin_client_logged_in):
    now = timezone.now()
    pending = Job.objects.create(queue=queues["vision"], gpus=8, submitted_at=now)
    done = Job.objects.create(queue=queues["vision"], gpus=8, submitted_at=now, state="finished")
    response = admin_client_logged_in.post(
        reverse("admin:scheduling_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [pending.pk, done.pk]},
        follow=True,
    )
    assert Job.objects.get(pk=pending.pk).state == "cancelled"
    assert "cannot cancel a job that is finished" in response.content.decode()


def test_job_page_shows_the_pending_reason_and_timeline(
    queues, admin_client_logged_in, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post(
            "/api/v1/jobs/", {"queue": "legacy", "gpus": 12, "chip_types": ["A100-80G"]}, format="json"
        ).json()["id"]
        other = operator_client.post(
            "/api/v1/jobs/", {"queue": "legacy", "gpus": 4, "chip_types": ["A100-80G"]}, format="json"
        ).json()["id"]
    page = admin_client_logged_in.get(reverse("admin:scheduling_job_change", args=[other])).content.decode()
    assert "quota of queue legacy exhausted for A100-80G: 12 of 12 in use, needs 4" in page
    page = admin_client_logged_in.get(reverse("admin:scheduling_job_change", args=[job_id])).content.decode()
    assert "placed in" in page


def test_seed_queues_splits_the_cluster_once(small_cluster):
    call_command("seed_queues")
    quotas = {q.name: {x.chip_type.name: x.nominal for x in q.quotas.all()} for q in Queue.objects.all()}
    assert quotas["pretrain"] == {"H100-SXM": 32, "A100-80G": 6}
    assert quotas["finetune"] == {"H100-SXM": 16, "A100-80G": 3}
    assert quotas["inference"] == {}
    call_command("seed_queues")
    assert Queue.objects.count() == 4


def test_seed_queues_lends_inference_gpus_to_training_in_the_demo(db):
    from cluster.builder import build_cluster, known_chip_names
    from engine.presets import preset_document
    from engine.topology_spec import parse_topology
    from scheduling.models import InferenceService

    build_cluster(parse_topology(preset_document("demo"), known_chip_names()))
    call_command("seed_queues")
    inference = Queue.objects.get(name="inference")
    assert inference.cohort.name == "shared" and inference.reclaim_within_cohort == "any"
    (quota,) = inference.quotas.all()
    assert quota.nominal > 0 and quota.nominal % 8 == 0
    service = InferenceService.objects.get(name="chat")
    assert service.queue == inference and service.max_replicas * 8 == quota.nominal
    assert service.load_profile["peak_hour"] == 14
