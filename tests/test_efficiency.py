"""Wasted GPUs and per-job efficiency as an operator meets them: a job whose GPUs sit idle is
flagged once they have been idle for the configured time (not before), ranks first on the
efficiency page and the API with its owner, shows on /metrics; every job keeps its mean
utilization, memory, power and idle GPU-hours over its life, after it finishes too. Both frame
writers (the agents' compose, the simulated fleet's tick) feed it; bad input gets a 400."""

from __future__ import annotations

import numpy as np
import pytest
from django.test import Client

from cluster.agents import create_enrolment_token, enrol
from cluster.models import Node
from cluster.snapshot import topology_cache
from engine import efficiency as eff
from engine.frames import FRAME_METRICS
from monitoring.models import JobEfficiency
from monitoring.telemetry import efficiency, ingest
from monitoring.telemetry.livestore import FRAME_KEY, STATE_KEY, live_store, reset_store
from scheduling.cycle import run_cycle
from scheduling.models import Job
from scheduling.store import allocations

T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def fresh(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.IDLE_UTIL_PCT = 5
    settings.IDLE_AFTER_S = 1800.0
    settings.SIMULATED_FLEET = False
    settings.METRICS_TOKEN = "efficiency-scrape"
    reset_store()
    for key in (efficiency.TOTALS_KEY, efficiency.IDLE_KEY, FRAME_KEY, STATE_KEY):
        live_store().delete(key)
    ingest.clear_reports()
    yield
    for key in (efficiency.TOTALS_KEY, efficiency.IDLE_KEY, FRAME_KEY, STATE_KEY):
        live_store().delete(key)
    ingest.clear_reports()
    reset_store()


# --- the pure rules ---------------------------------------------------------------------------
def test_a_gpu_is_idle_since_its_first_idle_frame_under_the_same_job():
    pairs = np.array([[7, 100], [7, 101], [9, 102]])
    keys = eff.pair_keys(pairs)
    k, since = eff.idle_since(np.zeros(0, np.int64), np.zeros(0), keys, np.array([True, True, False]), 10.0)
    k, since = eff.idle_since(k, since, keys, np.array([True, False, True]), 20.0)
    assert dict(zip(k.tolist(), since.tolist(), strict=True)) == {keys[0]: 10.0, keys[2]: 20.0}
    # GPU 100 moves to job 8: a new pair, idle from now, not from job 7's idle time
    moved = eff.pair_keys(np.array([[8, 100]]))
    k2, since2 = eff.idle_since(k, since, moved, np.array([True]), 30.0)
    assert since2.tolist() == [30.0]
    assert eff.wasted(k, since, 1815.0, 1800.0).tolist() == [[7, 100]]
    assert eff.wasted(k, since, 1809.0, 1800.0).tolist() == []


def test_a_jobs_rates_sum_its_gpus_and_count_the_idle_ones():
    jobs, rates = eff.job_rates(
        np.array([3, 3, 5]), np.array([90, 2, 0]), np.array([50, 50, 10]), np.array([80, 20, 10]), 5
    )
    assert jobs.tolist() == [3, 5]
    assert rates.tolist() == [[2, 92, 100, 100, 1], [1, 0, 10, 10, 1]]
    merged_jobs, merged = eff.merge_totals(jobs, rates, np.array([5, 6]), np.ones((2, 5)))
    assert merged_jobs.tolist() == [3, 5, 6] and merged[1].tolist() == [2, 1, 11, 11, 2]
    assert eff.summary(np.array([7200.0, 7200.0 * 40, 7200.0 * 30, 7200.0 * 50, 3600.0])) == {
        "gpu_hours": 2.0,
        "util_pct": 40.0,
        "memory_pct": 30.0,
        "power_pct": 50.0,
        "idle_gpu_hours": 1.0,
    }


# --- as an operator sees it ---------------------------------------------------------------------
def _submit(client, queue: str, name: str) -> int:
    body = {"queue": queue, "gpus": 8, "chip_types": ["H100-SXM"], "name": name}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _gpus_of(job_id: int) -> np.ndarray:
    pairs = allocations.active_pairs()
    return topology_cache.gpu_indices(pairs[pairs[:, 0] == job_id][:, 1])


def _frame(busy: np.ndarray, idle: np.ndarray) -> dict:
    n = topology_cache.current().num_gpus
    frame = {m: np.zeros(n, dtype=np.uint8) for m in FRAME_METRICS}
    frame["util"][busy], frame["memory"][busy], frame["power"][busy] = 80, 60, 70
    frame["util"][idle], frame["memory"][idle], frame["power"][idle] = 2, 10, 20
    return frame


def test_idle_gpus_are_flagged_after_the_idle_time_ranked_with_their_owner_and_kept_after_the_end(
    queues, operator_client, viewer_client, monkeypatch
):
    monkeypatch.setattr(efficiency, "FLUSH_S", 0.0)  # write the totals at every frame
    busy_job = _submit(operator_client, "nlp", "pretrain")
    idle_job = _submit(operator_client, "vision", "notebook")
    run_cycle()
    busy, idle = _gpus_of(busy_job), _gpus_of(idle_job)
    assert len(busy) == len(idle) == 8
    frame = _frame(busy, idle)
    for step in range(3):  # 0, 10, 20 min: idle, not yet wasted
        efficiency.observe(frame, T0 + 600 * step)
    assert efficiency.wasted_by_queue() == {}
    for step in range(3, 5):  # 30, 40 min
        efficiency.observe(frame, T0 + 600 * step)
    assert efficiency.wasted_by_queue() == {"vision": 8}

    answer = viewer_client.get("/api/v1/efficiency/")
    assert answer.status_code == 200
    data = answer.json()
    assert data["wasted_by_queue"] == {"vision": 8} and data["idle_util_pct"] == 5
    first, second = data["results"]
    assert (first["job"], first["owner"], first["queue"]) == (idle_job, "otto-operator", "vision")
    assert first["wasted_gpus"] == 8 and first["idle_gpu_hours"] == pytest.approx(8 * 2400 / 3600, abs=1e-3)
    assert first["util_pct"] == 2.0 and first["power_pct"] == 20.0
    assert second["job"] == busy_job and second["idle_gpu_hours"] == 0 and second["wasted_gpus"] == 0
    assert (second["util_pct"], second["memory_pct"], second["power_pct"]) == (80.0, 60.0, 70.0)
    assert second["gpu_hours"] == pytest.approx(8 * 2400 / 3600, abs=1e-3)

    page = Client()
    page.force_login(queues["vision"].jobs.first().owner)
    html = page.get("/efficiency/").content.decode()
    assert html.index(f"/jobs/{idle_job}/") < html.index(f"/jobs/{busy_job}/")
    assert "otto-operator" in html and 'id="wasted-total"><strong>8</strong>' in html

    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer efficiency-scrape").content.decode()
    assert 'myriad_wasted_gpus{queue="vision"} 8.0' in scraped
    assert 'myriad_wasted_gpus{queue="nlp"} 0.0' in scraped

    # one GPU of the idle job wakes up: the other seven stay wasted, the woken one starts afresh
    woken = frame.copy()
    woken["util"] = frame["util"].copy()
    woken["util"][idle[0]] = 50
    efficiency.observe(woken, T0 + 3000)
    efficiency.observe(frame, T0 + 3600)
    assert efficiency.wasted_by_queue() == {"vision": 7}

    detail = viewer_client.get(f"/api/v1/jobs/{busy_job}/").json()["efficiency"]
    assert detail["util_pct"] == 80.0 and detail["idle_gpu_hours"] == 0

    # the idle job is cancelled: it leaves the running ranking, keeps its figures
    assert operator_client.post(f"/api/v1/jobs/{idle_job}/cancel/").status_code in (200, 202)
    run_cycle()
    efficiency.observe(frame, T0 + 4200)
    assert efficiency.wasted_by_queue() == {}
    running = [r["job"] for r in viewer_client.get("/api/v1/efficiency/").json()["results"]]
    assert running == [busy_job]
    every = viewer_client.get("/api/v1/efficiency/", {"state": "all"}).json()["results"]
    kept = next(r for r in every if r["job"] == idle_job)
    assert kept["state"] == "cancelled" and kept["idle_gpu_hours"] > 8 * 3000 / 3600
    row = JobEfficiency.objects.get(job_id=idle_job)
    assert row.idle_gpu_s <= row.gpu_s and row.gpu_s == pytest.approx(8 * 3600, rel=1e-6)


def test_a_long_gap_between_frames_counts_nothing(queues, operator_client, monkeypatch):
    monkeypatch.setattr(efficiency, "FLUSH_S", 0.0)
    job = _submit(operator_client, "vision", "gap")
    run_cycle()
    frame = _frame(_gpus_of(job), np.zeros(0, dtype=np.int64))
    efficiency.observe(frame, T0)
    efficiency.observe(frame, T0 + 60)
    efficiency.observe(frame, T0 + 60 + efficiency.MAX_GAP_S + 1)  # telemetry was away
    assert JobEfficiency.objects.get(job_id=job).gpu_s == pytest.approx(8 * 60)


def test_bad_efficiency_queries_get_a_400_naming_the_field(queues, viewer_client):
    for params, field in (
        ({"state": "sleeping"}, "state"),
        ({"queue": "nope"}, "queue"),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
    ):
        answer = viewer_client.get("/api/v1/efficiency/", params)
        assert answer.status_code == 400 and field in answer.json(), (params, answer.content)


def test_the_agents_frames_flag_a_node_whose_gpus_do_nothing(
    queues, operator_client, settings, django_capture_on_commit_callbacks
):
    from rest_framework.test import APIClient

    settings.IDLE_AFTER_S = 0.0
    job = _submit(operator_client, "vision", "on-real-nodes")
    run_cycle()
    pairs = allocations.active_pairs()
    node = Node.objects.filter(gpus__id=int(pairs[pairs[:, 0] == job][0, 1])).first()
    _, secret = create_enrolment_token(actor="test", node=node)
    _, key = enrol(secret, hostname=node.hostname, address="10.0.0.9")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    gpus = [
        {"index": i, "util": 1, "memory_used_mib": 1000, "memory_total_mib": 81559, "temperature_c": 40}
        for i in range(8)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.post("/api/v1/agent/report/", {"seq": 1, "gpus": gpus}, format="json").status_code == 200
    assert ingest.compose_frame() == 8
    assert ingest.compose_frame() == 8
    assert efficiency.wasted_by_job() == {job: 8}


def test_the_simulated_fleets_ticks_keep_the_running_jobs_figures(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks, settings
):
    from monitoring.whatif.fleet_driver import tick

    settings.SIMULATED_FLEET = True
    settings.FLEET_ACCELERATE = 60
    body = {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "pod"}
    with django_capture_on_commit_callbacks(execute=True):
        job = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    assert Job.objects.get(pk=job).state == "running"
    tick()
    tick()
    figures = efficiency.efficiency_of([job])[job]
    assert figures["gpu_hours"] > 0 and figures["util_pct"] > 50  # the fleet runs it busy
    assert figures["idle_gpu_hours"] == 0 and figures["wasted_gpus"] == 0
