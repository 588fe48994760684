"""The jobs and services pages: what an operator reads about plans, size history, chip ranking,
load and replicas; server-side filters and pages; plotly.js served from this server."""

from django.test import Client

from scheduling.inference import autoscale
from scheduling.models import InferenceService, Job
from tests.test_inference import at


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_job_pages_show_plan_size_history_and_reasons(
    queues, viewer, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    body = {
        "queue": "vision",
        "gpus": 64,
        "min_gpus": 16,
        "size_step": 8,
        "chip_types": ["H100-SXM"],
        "topology": "any",
        "model": {"preset": "llama3-8b"},
        "name": "pretrain-8b",
    }
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):  # nlp reclaims: the elastic job shrinks
        operator_client.post(
            "/api/v1/jobs/",
            {"queue": "nlp", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "any"},
            format="json",
        )
    client = _client(viewer)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    job = Job.objects.get(pk=job_id)
    assert f"<td>{job.plan['tp']}</td><td>{job.plan['pp']}</td><td>{job.plan['dp']}</td>" in page
    assert "shrunk from" in page and "re-planned" in page  # size history and events
    listing = client.get("/jobs/", {"state": "running", "queue": "vision"}).content.decode()
    assert "pretrain-8b" in listing and "1 jobs" in listing
    assert "pretrain-8b" not in client.get("/jobs/", {"state": "pending"}).content.decode()
    assert "pretrain-8b" not in client.get("/jobs/", {"state": "all", "kind": "inference"}).content.decode()
    assert "pretrain-8b" in client.get("/jobs/", {"state": "all", "kind": "training"}).content.decode()


def test_pages_need_a_login_and_a_role(queues, outsider):
    assert Client().get("/jobs/").status_code == 302
    assert _client(outsider).get("/services/").status_code == 403


def test_service_page_charts_the_day_with_local_plotly(
    colocation, viewer, eager_celery, django_capture_on_commit_callbacks
):
    service = colocation
    with django_capture_on_commit_callbacks(execute=True):
        autoscale(service.pk, at(14))
    client = _client(viewer)
    page = client.get(f"/services/{service.pk}/").content.decode()
    assert 'src="/static/vendor/plotly/plotly-cartesian.min.js"' in page
    assert "http" not in page.split("<script")[1][:80]
    assert "0 &rarr; 4" in page  # the scaling history
    listing = client.get("/services/").content.decode()
    assert service.name in listing and "<td>4</td>" in listing
    assert client.get("/static/vendor/plotly/plotly-cartesian.min.js").status_code == 200
    assert InferenceService.objects.get(pk=service.pk).desired_replicas == 4
