"""Elastic jobs and modelled plans end to end: submitted by API, scheduled by the Celery cycle,
shrunk when quota is reclaimed or a node fails, each resize recorded with its plans."""

import pytest

from cluster.models import GPU
from scheduling.models import AllocatedGPU, Allocation, Job

MODEL = {"preset": "llama3-8b"}


def _post(client, capture, body):
    with capture(execute=True):
        return client.post("/api/v1/jobs/", body, format="json")


def _active(job):
    return AllocatedGPU.objects.filter(job=job, active=True).count()


@pytest.fixture
def elastic_job(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    body = {
        "queue": "vision",
        "gpus": 64,
        "min_gpus": 16,
        "size_step": 8,
        "chip_types": ["H100-SXM"],
        "topology": "any",
        "model": MODEL,
    }
    response = _post(operator_client, django_capture_on_commit_callbacks, body)
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def test_an_elastic_job_starts_at_the_largest_size_it_can_get_with_a_plan(elastic_job, operator_client):
    job = elastic_job
    assert job.state == "running"
    # vision has 32 H100 of its own and borrows nlp's idle 32, minus what the spares keep back
    assert job.allocated_gpus == _active(job) > 32
    assert job.allocated_gpus % 8 == 0
    detail = operator_client.get(f"/api/v1/jobs/{job.pk}/").json()
    plan = detail["plan"]
    assert plan["gpus"] == job.allocated_gpus and plan["tp"] * plan["pp"] * plan["dp"] <= plan["gpus"]
    assert plan["tokens_per_s"] > 0 and plan["step_s"] > 0
    assert "planned" in [e["kind"] for e in detail["events"]]


def test_reclaimed_quota_shrinks_the_elastic_job_instead_of_evicting_it(
    elastic_job, operator_client, django_capture_on_commit_callbacks
):
    before = elastic_job.allocated_gpus
    response = _post(
        operator_client,
        django_capture_on_commit_callbacks,
        {"queue": "nlp", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    claimer = Job.objects.get(pk=response.json()["id"])
    assert claimer.state == "running"
    job = Job.objects.get(pk=elastic_job.pk)
    assert job.state == "running" and job.preemptions == 0
    assert job.allocated_gpus == _active(job) == before - 16
    resize = job.events.get(kind="resized")
    assert resize.data["old_gpus"] == before and resize.data["new_gpus"] == before - 16
    assert resize.data["by_job"] == claimer.pk
    assert resize.data["old_plan"]["gpus"] == before and resize.data["new_plan"]["gpus"] == before - 16
    assert 0 < resize.data["throughput_ratio"] < 1
    assert "reclaims" in resize.reason and "re-planned TP" in resize.reason


def test_a_finished_job_lets_the_elastic_job_grow_back(
    elastic_job, operator_client, django_capture_on_commit_callbacks
):
    before = elastic_job.allocated_gpus
    claimer_id = _post(
        operator_client,
        django_capture_on_commit_callbacks,
        {"queue": "nlp", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "any"},
    ).json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        assert operator_client.post(f"/api/v1/jobs/{claimer_id}/cancel/").status_code == 200
    job = Job.objects.get(pk=elastic_job.pk)
    assert job.allocated_gpus == _active(job) == before
    kinds = [
        (e.data["old_gpus"], e.data["new_gpus"]) for e in job.events.filter(kind="resized").order_by("id")
    ]
    assert kinds == [(before, before - 16), (before - 16, before)]


def test_a_node_failure_with_nowhere_to_go_shrinks_the_elastic_job(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    body = {
        "queue": "legacy",
        "gpus": 12,
        "min_gpus": 4,
        "size_step": 4,
        "chip_types": ["A100-80G"],
        "topology": "rack",
        "model": MODEL,
    }
    job = Job.objects.get(pk=_post(operator_client, django_capture_on_commit_callbacks, body).json()["id"])
    assert job.state == "running" and job.allocated_gpus == 12  # the whole A100 pod, no spares
    gpu = GPU.objects.get(node__hostname="dc2-a100-r01-n02", index=0)
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post("/api/v1/faults/", {"gpu": gpu.pk, "source": "xid", "xid": 79}, format="json")
    job.refresh_from_db()
    assert job.state == "running" and job.allocated_gpus == _active(job) == 8
    assert not Allocation.objects.filter(job=job, active=True, node=gpu.node).exists()
    resized = job.events.get(kind="resized")
    assert resized.data["new_gpus"] == 8 and "after a fault" in resized.reason
    recovered = job.events.get(kind="recovered")
    assert recovered.data["outcome"] == "shrink"


def test_the_platform_ranks_allowed_chips_by_cost_performance(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    body = {"queue": "vision", "gpus": 8, "chip_types": ["A100-80G", "H100-SXM"], "model": MODEL}
    response = _post(operator_client, django_capture_on_commit_callbacks, body)
    data = operator_client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    ranking = data["chip_ranking"]
    assert [r["chip"] for r in ranking] == data["chip_types"]
    assert ranking[0]["tokens_per_dollar"] >= ranking[1]["tokens_per_dollar"]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"gpus": 8, "min_gpus": 16}, "min_gpus", "must be at most gpus (8)"),
        ({"gpus": 20, "min_gpus": 8, "size_step": 8}, "size_step", "must be multiples of size_step (8)"),
        ({"gpus": 16, "size_step": 8}, "size_step", "only an elastic job"),
        (
            {"gpus": 8, "model": {"params": -3, "layers": 2, "hidden": 64, "seq_len": 8, "batch_tokens": 64}},
            "model",
            "params must be a positive number",
        ),
        ({"gpus": 8, "model": {"params": 1e9}}, "model", "layers is required"),
        ({"gpus": 8, "model": {"preset": "gpt-9"}}, "model", "preset 'gpt-9' is unknown"),
    ],
)
def test_bad_elastic_or_model_fields_are_refused_by_name(queues, operator_client, body, field, message):
    response = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "chip_types": ["H100-SXM"], **body}, format="json"
    )
    assert response.status_code == 400
    assert message in " ".join(response.json()[field])
    assert not Job.objects.exists()


def test_a_mixed_chip_job_runs_over_two_chip_types_with_a_mixed_plan(
    small_cluster, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    from cluster.models import ChipType
    from scheduling.models import Queue, QueueQuota

    queue = Queue.objects.create(name="mixed")
    for chip, n in (("H100-SXM", 48), ("A100-80G", 12)):
        QueueQuota.objects.create(queue=queue, chip_type=ChipType.objects.get(name=chip), nominal=n)
    body = {
        "queue": "mixed",
        "gpus": 56,
        "chip_types": ["H100-SXM", "A100-80G"],
        "mixed_chips": True,
        "topology": "region",
        "model": MODEL,
    }
    response = _post(operator_client, django_capture_on_commit_callbacks, body)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == "running" and job.allocated_gpus == _active(job) == 56
    chips = set(
        AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu__node__chip_type__name", flat=True)
    )
    assert chips == {"H100-SXM", "A100-80G"}
    plan = job.plan
    assert plan["mixed"] and {p["chip"] for p in plan["parts"]} == chips
    assert 0.5 < plan["efficiency"] <= 1.0
    admitted = job.events.get(kind="admitted")
    parts = admitted.data["parts"]
    assert set(parts) == chips and sum(parts.values()) == 56
    assert " + " in admitted.reason
    # the queue is charged per chip type it holds, on the API and the queues page alike
    queue_id = Queue.objects.get(name="mixed").pk
    usage = {
        u["chip_type"]: u["used"] for u in operator_client.get(f"/api/v1/queues/{queue_id}/").json()["usage"]
    }
    assert usage == {"H100-SXM": parts["H100-SXM"], "A100-80G": parts["A100-80G"]}


def test_a_pending_job_shows_its_chip_ranking_in_the_reason(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    _post(
        operator_client,
        django_capture_on_commit_callbacks,
        {"queue": "vision", "gpus": 48, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    body = {
        "queue": "vision",
        "gpus": 24,
        "chip_types": ["A100-80G", "H100-SXM"],
        "topology": "any",
        "model": MODEL,
    }
    job_id = _post(operator_client, django_capture_on_commit_callbacks, body).json()["id"]
    detail = operator_client.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["state"] == "pending"
    assert "chip ranking by tokens per dollar: " in detail["pending_reason"]
    assert [r["chip"] for r in detail["chip_ranking"]] == detail["chip_types"]
    assert detail["size_history"] == []
