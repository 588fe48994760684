"""Checkpoint policies, checkpoint reports and effective training time from the event log."""

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.checkpoint import daly_interval
from scheduling.ettr import job_ettr
from scheduling.models import Checkpoint, CheckpointPolicy, Job, JobEvent


def test_operators_manage_checkpoint_policies_with_validation(db, operator_client, viewer_client):
    created = operator_client.post(
        "/api/v1/checkpoint-policies/",
        {"name": "async-30m", "kind": "async", "interval_s": 1800},
        format="json",
    )
    assert created.status_code == 201
    auto = operator_client.post(
        "/api/v1/checkpoint-policies/", {"name": "auto", "kind": "triggered"}, format="json"
    )
    assert (
        auto.status_code == 201
        and auto.json()["interval_s"] is None
        and auto.json()["triggered_success"] == 0.95
        and auto.json()["ettr_goal"] == 0.9
    )
    bad = operator_client.post(
        "/api/v1/checkpoint-policies/",
        {"name": "bad", "kind": "async", "interval_s": -5, "triggered_success": 2, "ettr_goal": 1.2},
        format="json",
    )
    assert bad.status_code == 400
    assert {"interval_s", "triggered_success", "ettr_goal"} <= bad.json().keys()
    assert not CheckpointPolicy.objects.filter(name="bad").exists()
    goal = operator_client.patch(
        f"/api/v1/checkpoint-policies/{created.json()['id']}/", {"ettr_goal": 0.97}, format="json"
    )
    assert goal.status_code == 200 and goal.json()["ettr_goal"] == 0.97
    assert (
        viewer_client.post(
            "/api/v1/checkpoint-policies/", {"name": "v", "kind": "async"}, format="json"
        ).status_code
        == 403
    )


def test_a_job_shows_the_recommended_interval_next_to_its_policy(queues, operator_client):
    policy = CheckpointPolicy.objects.create(name="hourly", kind="periodic", interval_s=3600)
    body = {
        "queue": "vision",
        "gpus": 32,
        "chip_types": ["H100-SXM"],
        "parameters": 70e9,
        "checkpoint_policy": "hourly",
        "topology": "datacenter",
    }
    job_id = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    rec = operator_client.get(f"/api/v1/jobs/{job_id}/").json()["checkpoint_recommendation"]
    assert rec["policy"] == policy.name and rec["mtbf_source"] == "default physics"
    assert rec["chosen_interval_s"] == 3600
    # a small job rarely faults: the Daly interval is longer than an hour, and beats it
    expected = daly_interval(rec["stall_s"], rec["mtbf_s"])
    assert rec["recommended_interval_s"] == pytest.approx(expected, rel=1e-3)
    assert rec["recommended_expected_ettr"] >= rec["chosen_expected_ettr"]


def test_running_jobs_report_checkpoints(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post(
            "/api/v1/jobs/", {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]}, format="json"
        ).json()["id"]
    url = f"/api/v1/jobs/{job_id}/checkpoints/"
    response = operator_client.post(
        url, {"step": 100, "progress_s": 600, "kind": "async", "stall_s": 0.4}, format="json"
    )
    assert response.status_code == 201
    job = Job.objects.get(pk=job_id)
    assert job.progress_s == 600 and job.last_checkpoint_at is not None
    assert (
        operator_client.post(url, {"step": 1, "progress_s": -1, "kind": "async"}, format="json").status_code
        == 400
    )
    # the same report again (an agent's retry) records nothing new
    again = operator_client.post(
        url, {"step": 100, "progress_s": 600, "kind": "async", "stall_s": 0.4}, format="json"
    )
    assert again.status_code == 200 and again.json()["id"] == response.json()["id"]
    assert Checkpoint.objects.filter(job_id=job_id).count() == 1
    assert JobEvent.objects.filter(job_id=job_id, kind="checkpointed").count() == 1
    newer = operator_client.post(url, {"step": 200, "progress_s": 1200, "kind": "async"}, format="json")
    older = operator_client.post(url, {"step": 150, "progress_s": 900, "kind": "async"}, format="json")
    assert newer.status_code == older.status_code == 201
    assert Job.objects.get(pk=job_id).progress_s == 1200  # a late report never moves progress back
    Job.objects.filter(pk=job_id).update(state="finished")
    late = operator_client.post(url, {"step": 101, "progress_s": 700, "kind": "async"}, format="json")
    assert late.status_code == 409


def _timeline(job, start):
    JobEvent.objects.create(job=job, kind="admitted", at=start)
    Checkpoint.objects.create(
        job=job, at=start + timedelta(minutes=30), progress_s=1800, kind="periodic", stall_s=20
    )
    JobEvent.objects.create(
        job=job, kind="faulted", at=start + timedelta(minutes=50), data={"detection_s": 30, "lost_s": 1200}
    )
    JobEvent.objects.create(
        job=job, kind="recovered", at=start + timedelta(minutes=52), data={"restart_s": 90}
    )
    JobEvent.objects.create(job=job, kind="requeued", at=start + timedelta(minutes=60))
    JobEvent.objects.create(job=job, kind="admitted", at=start + timedelta(minutes=70))


def test_ettr_and_its_loss_buckets_come_from_the_event_log(queues):
    start = timezone.now() - timedelta(hours=2)
    job = Job.objects.create(
        queue=queues["vision"],
        gpus=16,
        submitted_at=start,
        state="finished",
        finished_at=start + timedelta(hours=2),
    )
    _timeline(job, start)
    e = job_ettr([job])[job.pk]
    assert e["wall_s"] == 7200
    assert (e["checkpoint_stall_s"], e["detection_s"], e["lost_work_s"], e["restart_s"], e["waiting_s"]) == (
        20,
        30,
        1200,
        90,
        600,
    )
    assert e["productive_s"] == 7200 - 1940
    assert e["ettr"] == pytest.approx((7200 - 1940) / 7200, abs=1e-5)


def test_the_cluster_ettr_endpoint_weighs_jobs_by_gpus(queues, viewer_client):
    start = timezone.now() - timedelta(hours=2)
    bad = Job.objects.create(
        queue=queues["vision"],
        gpus=16,
        submitted_at=start,
        state="finished",
        finished_at=start + timedelta(hours=2),
    )
    _timeline(bad, start)
    good = Job.objects.create(
        queue=queues["nlp"],
        gpus=48,
        submitted_at=start,
        state="finished",
        finished_at=start + timedelta(hours=2),
    )
    JobEvent.objects.create(job=good, kind="admitted", at=start)
    body = viewer_client.get(
        "/api/v1/ettr/", {"since": start.isoformat(), "until": (start + timedelta(hours=2)).isoformat()}
    ).json()
    assert body["jobs"] == 2
    expected = (16 * (7200 - 1940) + 48 * 7200) / (64 * 7200)
    assert body["ettr"] == pytest.approx(expected, abs=1e-4)
    assert body["loss_share"]["lost_work"] == pytest.approx(16 * 1200 / (64 * 7200), abs=1e-4)
    only_nlp = viewer_client.get("/api/v1/ettr/", {"since": start.isoformat(), "queue": "nlp"}).json()
    assert only_nlp["ettr"] == 1.0
    assert viewer_client.get("/api/v1/ettr/", {"since": "yesterday"}).status_code == 400
    reversed_window = viewer_client.get(
        "/api/v1/ettr/", {"since": timezone.now().isoformat(), "until": start.isoformat()}
    )
    assert reversed_window.status_code == 400 and "since" in reversed_window.json()
