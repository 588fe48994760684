"""Faults injected through the API: classification, the node health path, lemon quarantine, and
recovery of the jobs they hit, recorded step by step."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cluster.models import GPU, Node
from monitoring.models import FaultEvent
from scheduling.models import AllocatedGPU, Allocation, CheckpointPolicy, Job


def _inject(client, capture, **body):
    with capture(execute=True):
        return client.post("/api/v1/faults/", body, format="json")


def _job_node(job):
    return Node.objects.get(gpus__allocations__job=job, gpus__allocations__active=True, gpus__index=0)


def test_a_gpu_off_the_bus_takes_the_node_down_and_the_job_moves_to_a_spare(
    running_job, operator_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    gpu = node.gpus.get(index=3)
    response = _inject(operator_client, django_capture_on_commit_callbacks, gpu=gpu.pk, source="xid", xid=79)
    assert response.status_code == 201, response.json()
    fault = FaultEvent.objects.get(pk=response.json()["id"])
    assert fault.action == "reboot_node" and fault.job_id == running_job.pk
    node.refresh_from_db()
    assert node.state == "down" and "XID 79" in node.state_reason
    running_job.refresh_from_db()
    assert running_job.state == "running"
    hosts = set(
        AllocatedGPU.objects.filter(job=running_job, active=True).values_list(
            "gpu__node__hostname", flat=True
        )
    )
    assert hosts and node.hostname not in hosts
    assert Node.objects.filter(hostname__in=hosts, is_spare=True).exists()  # a spare of the same pod
    kinds = list(running_job.events.values_list("kind", flat=True))
    assert kinds[-2:] == ["faulted", "recovered"]
    recovered = running_job.events.get(kind="recovered")
    assert recovered.data["outcome"] == "spare"
    assert set(recovered.data["steps"]) == {"detect", "reschedule", "restart", "load"}
    assert 0 < fault.recovery_s < 120  # minutes, not hours: under two with a spare
    detail = operator_client.get(f"/api/v1/jobs/{running_job.pk}/").json()
    assert detail["ettr"]["detection_s"] == 30.0 and detail["ettr"]["restart_s"] > 0


def test_an_application_fault_restarts_the_job_in_place(
    running_job, operator_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    before = set(AllocatedGPU.objects.filter(job=running_job, active=True).values_list("gpu_id", flat=True))
    _inject(
        operator_client, django_capture_on_commit_callbacks, gpu=node.gpus.first().pk, source="xid", xid=13
    )
    node.refresh_from_db()
    assert node.state == "ready"
    after = set(AllocatedGPU.objects.filter(job=running_job, active=True).values_list("gpu_id", flat=True))
    assert before == after
    assert running_job.events.get(kind="recovered").data["outcome"] == "restart_in_place"


def test_a_triggered_policy_saves_the_work_on_a_readable_fault(
    running_job, operator_client, django_capture_on_commit_callbacks
):
    policy = CheckpointPolicy.objects.create(
        name="triggered", kind="triggered", interval_s=1800, triggered_success=1.0
    )
    Job.objects.filter(pk=running_job.pk).update(checkpoint_policy=policy)
    node = _job_node(running_job)
    _inject(
        operator_client, django_capture_on_commit_callbacks, gpu=node.gpus.first().pk, source="xid", xid=94
    )
    saved = running_job.checkpoints.get(kind="triggered")
    assert saved.durable
    assert running_job.events.get(kind="faulted").data["lost_s"] == 0.0
    assert running_job.events.get(kind="checkpointed").data == {"triggered": True, "succeeded": True}


def test_a_gpu_reset_fault_takes_only_that_gpu_out(
    running_job, operator_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    gpu = node.gpus.get(index=5)
    _inject(operator_client, django_capture_on_commit_callbacks, gpu=gpu.pk, source="xid", xid=95)
    gpu.refresh_from_db()
    node.refresh_from_db()
    assert (gpu.state, gpu.health, node.state) == ("down", "critical", "ready")
    held = set(AllocatedGPU.objects.filter(job=running_job, active=True).values_list("gpu_id", flat=True))
    assert gpu.pk not in held and len(held) == 8


def test_with_no_room_left_the_job_is_requeued_with_its_progress(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    from scheduling.models import QueueQuota

    QueueQuota.objects.filter(queue=queues["legacy"]).update(nominal=12)
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post(
            "/api/v1/jobs/",
            {"queue": "legacy", "gpus": 12, "chip_types": ["A100-80G"], "topology": "rack"},
            format="json",
        ).json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.state == "running"  # all 12 A100s; the A100 pod has no spares
    gpu = GPU.objects.get(node__hostname="dc2-a100-r01-n02", index=0)
    _inject(operator_client, django_capture_on_commit_callbacks, gpu=gpu.pk, source="xid", xid=79)
    job.refresh_from_db()
    assert job.state == "pending"
    assert (
        job.pending_reason.startswith("quota of queue legacy") or "no rack with 12 free" in job.pending_reason
    )
    assert job.events.filter(kind="requeued").exists()
    assert not Allocation.objects.filter(job=job, active=True).exists()


def test_a_node_that_keeps_faulting_is_quarantined_as_a_lemon(
    small_cluster, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    node = Node.objects.get(hostname="dc1-p02-r01-n01")
    for _ in range(3):
        _inject(
            operator_client,
            django_capture_on_commit_callbacks,
            gpu=node.gpus.first().pk,
            source="xid",
            xid=13,
        )
    node.refresh_from_db()
    assert node.is_lemon and node.state == "down" and node.state_reason.startswith("quarantined as a lemon")


def test_the_node_health_path_down_repair_return(
    small_cluster, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    node = Node.objects.get(hostname="dc1-p01-r01-n02")
    _inject(operator_client, django_capture_on_commit_callbacks, node=node.pk, source="heartbeat_loss")
    node.refresh_from_db()
    assert node.state == "down"
    assert operator_client.post(f"/api/v1/nodes/{node.pk}/uncordon/").status_code == 409
    assert operator_client.post(f"/api/v1/nodes/{node.pk}/repair/").json()["state"] == "repairing"
    assert operator_client.post(f"/api/v1/nodes/{node.pk}/return/").json()["state"] == "ready"
    assert not FaultEvent.objects.filter(node=node, cleared_at__isnull=True).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "xid", "xid": 79}, "node"),
        ({"source": "xid", "node": "NODE"}, "xid"),
        ({"source": "heartbeat_loss", "xid": 79, "node": "NODE"}, "xid"),
        ({"source": "gremlins", "node": "NODE"}, "source"),
        ({"source": "xid", "xid": 79, "node": "NODE", "gpu": "GPU"}, "gpu"),
    ],
)
def test_bad_fault_reports_are_refused_and_change_nothing(small_cluster, operator_client, body, field):
    node = Node.objects.first()
    body = {k: node.pk if v == "NODE" else node.gpus.first().pk if v == "GPU" else v for k, v in body.items()}
    response = operator_client.post("/api/v1/faults/", body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not FaultEvent.objects.exists()


def test_viewers_see_faults_but_cannot_inject(small_cluster, viewer_client):
    node = Node.objects.first()
    assert (
        viewer_client.post(
            "/api/v1/faults/", {"node": node.pk, "source": "heartbeat_loss"}, format="json"
        ).status_code
        == 403
    )
    assert viewer_client.get("/api/v1/faults/", {"open": "true"}).status_code == 200


def test_faults_filter_by_time_and_source(small_cluster, operator_client):
    node = Node.objects.first()
    now = timezone.now()
    FaultEvent.objects.create(node=node, source="heartbeat_loss", at=now - timedelta(days=2))
    FaultEvent.objects.create(node=node, source="xid", xid=13, at=now)
    recent = operator_client.get("/api/v1/faults/", {"since": (now - timedelta(hours=1)).isoformat()}).json()
    assert [f["xid"] for f in recent["results"]] == [13]
    assert operator_client.get("/api/v1/faults/", {"source": "heartbeat_loss"}).json()["count"] == 1


def test_an_operator_injects_a_fault_in_the_admin_and_recovery_happens(
    running_job, admin_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    gpu = GPU.objects.get(node=node, index=0)
    form = {
        "node": "",
        "gpu": gpu.pk,
        "pod": "",
        "link": "",
        "at": "",
        "source": "xid",
        "xid": 79,
        "severity": "critical",
        "description": "injected from the admin",
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post("/admin/monitoring/faultevent/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    fault = FaultEvent.objects.get()
    assert fault.data["reported_by"] == "admin" and fault.action
    node.refresh_from_db()
    assert node.state == "down"
    running_job.refresh_from_db()
    assert running_job.events.filter(kind="recovered").exists()
    bad = admin_client.post("/admin/monitoring/faultevent/add/", {**form, "xid": ""})
    assert bad.status_code == 200 and "an XID fault needs its code" in bad.content.decode()
    assert FaultEvent.objects.count() == 1


def test_a_fault_reported_twice_is_handled_once(
    running_job, operator_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    at = timezone.now().isoformat()
    body = {"gpu": node.gpus.first().pk, "source": "xid", "xid": 13, "at": at}
    first = _inject(operator_client, django_capture_on_commit_callbacks, **body)
    again = _inject(operator_client, django_capture_on_commit_callbacks, **body)  # a retry, a replay
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert FaultEvent.objects.count() == 1
    assert running_job.events.filter(kind="faulted").count() == 1
    later = _inject(
        operator_client, django_capture_on_commit_callbacks, **{**body, "at": timezone.now().isoformat()}
    )
    assert later.status_code == 201 and FaultEvent.objects.count() == 2  # another time: another fault


def test_the_job_page_says_why_each_fault_hit_it(
    running_job, operator, operator_client, django_capture_on_commit_callbacks
):
    node = _job_node(running_job)
    body = {
        "node": node.pk,
        "source": "job_hang",
        "description": "job stalled; network: port mlx5_0/1 is down",
    }
    assert _inject(operator_client, django_capture_on_commit_callbacks, **body).status_code == 201
    page = Client()
    page.force_login(operator)
    html = page.get(f"/jobs/{running_job.pk}/").content.decode()
    faults = html[html.index('id="job-faults"') :]
    assert "network: port mlx5_0/1 is down" in faults[: faults.index("</table>")]
