"""The overview: every GPU in exactly one state bucket, the same numbers on the page and the API."""

import numpy as np
import pytest
from django.test import Client

from cluster.models import Node
from engine.frames import FRAME_METRICS, encode_frame
from monitoring.telemetry.livestore import FRAME_KEY, live_store, reset_store


@pytest.fixture
def busy_cluster(
    settings, tmp_path, queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    settings.DATA_DIR = tmp_path
    reset_store()
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post(
            "/api/v1/jobs/",
            {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "rack"},
            format="json",
        )
    free_node = Node.objects.filter(gpus__allocations__isnull=True, chip_type__name="A100-80G").first()
    Node.objects.filter(pk=free_node.pk).update(state="cordoned")
    yield
    live_store().delete(FRAME_KEY)
    reset_store()


def test_every_gpu_is_counted_once_and_idle_comes_from_telemetry(busy_cluster, viewer_client, viewer):
    data = viewer_client.get("/api/v1/overview/").json()
    assert data["gpus"] == 76 and sum(data["counts"].values()) == 76
    assert data["counts"]["allocated"] == 16 and data["counts"]["cordoned"] == 4
    assert data["running_jobs"] == 1 and data["counts"]["allocated_idle"] == 0
    # a telemetry frame in which every GPU is idle: the held ones become "allocated but idle"
    zeros = {m: np.zeros(76, dtype=np.uint8) for m in FRAME_METRICS}
    live_store().put(FRAME_KEY, encode_frame(3, 0.0, zeros))
    data = viewer_client.get("/api/v1/overview/").json()
    assert data["counts"]["allocated_idle"] == 16 and data["counts"]["allocated"] == 0
    assert data["telemetry_frame"] == 3
    client = Client()
    client.force_login(viewer)
    page = client.get("/overview/").content.decode()
    assert (
        "<td>allocated but idle</td><td>16</td>" in page and "<td>cordoned or draining</td><td>4</td>" in page
    )
