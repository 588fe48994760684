"""Who used what, as a finance or team lead reads it: a queue that borrows shows the GPU-hours it
held, used (by utilization), borrowed, and what a preemption threw away, its cohort-mate what it
lent; the cost is at the chargeback price an operator set (audited); the page, the API and CSV
give the same figures for any window; the cluster sampler keeps the rollup; bad windows, unknown
names and negative prices get a 400 naming the field."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import numpy as np
import pytest
from django.test import Client
from django.utils import timezone

from cluster.models import AuditRecord, ChipType
from cluster.snapshot import topology_cache
from engine.frames import FRAME_METRICS, encode_frame
from monitoring.telemetry.livestore import FRAME_KEY, live_store, reset_store
from monitoring.telemetry.overview import take_sample
from scheduling.chargeback import record_usage
from scheduling.cycle import run_cycle
from scheduling.models import JobEvent, UsageDay
from scheduling.store import allocations


@pytest.fixture(autouse=True)
def fresh_store(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    reset_store()
    live_store().delete(FRAME_KEY)
    yield
    live_store().delete(FRAME_KEY)
    reset_store()


def _submit(client, queue: str, gpus: int, **extra) -> int:
    body = {"queue": queue, "gpus": gpus, "chip_types": ["H100-SXM"], "topology": "any", **extra}
    answer = client.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def _util(busy_pct: int) -> np.ndarray:
    """Every held GPU at ``busy_pct`` utilization, the rest idle."""
    util = np.zeros(topology_cache.current().num_gpus, dtype=np.uint8)
    pairs = allocations.active_pairs()
    util[topology_cache.gpu_indices(pairs[:, 1])] = busy_pct
    return util


def test_a_borrowing_queue_is_charged_for_what_it_held_and_its_cohort_mate_for_what_it_lent(
    queues, operator_client, viewer_client
):
    h100 = ChipType.objects.get(name="H100-SXM")
    answer = operator_client.patch(
        f"/api/v1/chip-types/{h100.pk}/", {"charge_per_gpu_hour": 2.5}, format="json"
    )
    assert answer.status_code == 200 and answer.json()["charge_per_gpu_hour"] == 2.5
    audit = AuditRecord.objects.get(object_type="chip type", object_name=h100.name)
    assert audit.changes["charge_per_gpu_hour"] == [None, 2.5] and audit.actor == "otto-operator"

    now = timezone.now()
    yesterday = now - timedelta(days=1)
    job = _submit(operator_client, "vision", 48)  # 16 over its 32: borrowed from nlp
    run_cycle(now=yesterday)
    record_usage(yesterday, 3600, _util(50))  # an hour yesterday at half utilization
    record_usage(now, 1800, _util(100))  # half an hour today, busy

    # nlp reclaims its 16: the borrower is preempted an hour after it started
    _submit(operator_client, "nlp", 16)
    run_cycle(now=yesterday + timedelta(hours=1))
    preempted = JobEvent.objects.get(job_id=job, kind="preempted")
    lost_gpu_h = preempted.data["lost_s"] * 48 / 3600
    assert preempted.data["gpus"] == 48 and lost_gpu_h > 0
    JobEvent.objects.filter(pk=preempted.pk).update(at=yesterday + timedelta(hours=1))

    since, until = yesterday.date().isoformat(), now.date().isoformat()
    data = viewer_client.get("/api/v1/usage/", {"since": since, "until": until}).json()
    vision = data["queues"]["vision"]
    assert vision["allocated_gpu_hours"] == pytest.approx(48 + 24)
    assert vision["used_gpu_hours"] == pytest.approx(24 + 24)
    assert vision["borrowed_gpu_hours"] == pytest.approx(16 + 8)
    assert vision["preempted_gpu_hours"] == pytest.approx(lost_gpu_h, abs=1e-3)
    assert vision["cost"] == pytest.approx(72 * 2.5)
    assert data["queues"]["nlp"]["lent_gpu_hours"] == pytest.approx(16 + 8)
    assert data["cohorts"]["research"]["allocated_gpu_hours"] == pytest.approx(72)
    days = {(r["day"], r["queue"]) for r in data["rows"]}
    assert (since, "vision") in days and (until, "vision") in days

    only_today = viewer_client.get("/api/v1/usage/", {"since": until, "until": until}).json()
    assert only_today["queues"]["vision"]["allocated_gpu_hours"] == pytest.approx(24)
    nlp_only = viewer_client.get("/api/v1/usage/", {"since": since, "queue": "nlp"}).json()
    assert set(nlp_only["queues"]) == {"nlp"}

    exported = viewer_client.get("/api/v1/usage/csv/", {"since": since, "until": until})
    assert exported.status_code == 200 and exported["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert sum(float(r["allocated_gpu_hours"]) for r in rows if r["queue"] == "vision") == pytest.approx(72)
    assert sum(float(r["cost"]) for r in rows) == pytest.approx(72 * 2.5)

    page = Client()
    page.force_login(queues["vision"].jobs.first().owner)
    html = page.get("/usage/", {"since": since, "until": until}).content.decode()
    assert 'id="usage-chart"' in html and "/api/v1/usage/csv/?" in html
    assert "<td>vision</td><td>72.0</td>" in html and "180.00" in html


def test_the_cluster_sampler_keeps_each_queues_day(queues, operator_client):
    _submit(operator_client, "vision", 8)
    run_cycle()
    n = topology_cache.current().num_gpus
    frame = {m: np.zeros(n, dtype=np.uint8) for m in FRAME_METRICS}
    frame["util"] = _util(80)
    live_store().put(FRAME_KEY, encode_frame(1, timezone.now().timestamp(), frame))
    now = timezone.now().replace(microsecond=0)
    take_sample(now)  # the first sample counts one interval (60 s)
    take_sample(now + timedelta(seconds=60))
    take_sample(now + timedelta(hours=5))  # after a gap: two intervals at most
    day = UsageDay.objects.get(queue__name="vision", day=(now + timedelta(hours=5)).date())
    total = sum(UsageDay.objects.filter(queue__name="vision").values_list("allocated_gpu_s", flat=True))
    assert total == pytest.approx(8 * (60 + 60 + 120))
    assert day.used_gpu_s <= day.allocated_gpu_s
    used = sum(UsageDay.objects.filter(queue__name="vision").values_list("used_gpu_s", flat=True))
    assert used == pytest.approx(0.8 * total)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"since": "2026-13-01"}, "since"),
        ({"until": "yesterday"}, "until"),
        ({"since": "TODAY", "until": "YESTERDAY"}, "until"),
        ({"until": "TOMORROW"}, "until"),
        ({"since": "LONG_AGO"}, "since"),
        ({"queue": "nope"}, "queue"),
        ({"cohort": "nope"}, "cohort"),
        ({"chip_type": "TPU-v9"}, "chip_type"),
    ],
)
def test_a_bad_usage_query_gets_a_400_naming_the_field(params, field, queues, viewer_client):
    today = timezone.now().date()
    words = {
        "TODAY": today,
        "YESTERDAY": today - timedelta(days=1),
        "TOMORROW": today + timedelta(days=1),
        "LONG_AGO": today - timedelta(days=3),  # before the history, which starts today
    }
    record_usage(timezone.now(), 60)
    query = {k: str(words.get(v, v)) for k, v in params.items()}
    answer = viewer_client.get("/api/v1/usage/", query)
    assert answer.status_code == 400 and field in answer.json(), (query, answer.content)


def test_a_negative_price_gets_a_400_and_changes_nothing(queues, operator_client):
    h100 = ChipType.objects.get(name="H100-SXM")
    before = h100.charge_per_gpu_hour
    for field in ("charge_per_gpu_hour", "price_per_gpu_hour"):
        answer = operator_client.patch(f"/api/v1/chip-types/{h100.pk}/", {field: -1}, format="json")
        assert answer.status_code == 400 and field in answer.json()
    h100.refresh_from_db()
    assert h100.charge_per_gpu_hour == before
    assert not AuditRecord.objects.filter(object_type="chip type").exists()
