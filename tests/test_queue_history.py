"""A queue's history as its owner reads it: how long its jobs waited (from submission, or from the
requeue that sent them back), how often it was preempted, which chip types are contended, whose
quota was borrowed most, and which queues are starving now; the page and the API agree; bad
windows and names get a 400 naming the field."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.chargeback import record_usage
from scheduling.cycle import run_cycle
from scheduling.models import Job, JobEvent
from scheduling.services import change_state


def _submit(client, queue: str, gpus: int, chip: str = "H100-SXM") -> int:
    body = {"queue": queue, "gpus": gpus, "chip_types": [chip], "topology": "any"}
    answer = client.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def test_waits_preemptions_contention_borrowing_and_starving_queues(queues, operator_client, viewer_client):
    borrower = _submit(operator_client, "vision", 48)  # 16 over its quota: borrowed from nlp
    _submit(operator_client, "legacy", 8, "A100-80G")
    blocked = _submit(operator_client, "legacy", 8, "A100-80G")  # past legacy's 12: waits on quota
    Job.objects.update(submitted_at=timezone.now() - timedelta(hours=3))
    run_cycle()
    admitted = JobEvent.objects.get(job_id=borrower, kind="admitted")
    assert admitted.data["wait_s"] == pytest.approx(3 * 3600, abs=120)
    record_usage(timezone.now(), 3600)  # an hour of the borrowing in the usage rollup

    # nlp takes its quota back: the borrower is preempted; when nlp's job goes, it runs again and
    # its second wait counts from the requeue, not from its submission
    reclaimer = _submit(operator_client, "nlp", 16)
    run_cycle()
    assert Job.objects.get(pk=borrower).state == "pending"
    change_state(reclaimer, "cancel", actor="test")
    run_cycle()
    second = JobEvent.objects.filter(job_id=borrower, kind="admitted").order_by("-id").first()
    assert second.pk != admitted.pk and second.data["wait_s"] < 300

    # legacy's last admission was three hours ago and a job still waits: it is starving
    JobEvent.objects.filter(job__queue__name="legacy", kind="admitted").update(
        at=timezone.now() - timedelta(hours=3)
    )
    data = viewer_client.get("/api/v1/queue-history/").json()
    rows = {r["queue"]: r for r in data["queues"]}
    assert rows["vision"]["admissions"] == 2 and rows["vision"]["preemptions"] == 1
    assert rows["vision"]["p90_wait_s"] > 3600 and rows["vision"]["mean_wait_s"] < 3 * 3600
    window_days = (
        timezone.datetime.fromisoformat(data["until"]) - timezone.datetime.fromisoformat(data["since"])
    ).total_seconds() / 86400
    assert rows["vision"]["preemptions_per_day"] == pytest.approx(1 / window_days, rel=1e-2)
    assert rows["nlp"]["admissions"] == 1 and rows["legacy"]["admissions"] == 1
    h100 = next(r for r in data["contention"] if r["chip_type"] == "H100-SXM")
    assert h100["contended"] and h100["preemptions"] == 1
    assert data["most_borrowed"][0] == {
        "queue": "vision",
        "chip_type": "H100-SXM",
        "borrowed_gpu_hours": 16.0,
    }
    assert [s["queue"] for s in data["starving"]] == ["legacy"] and data["starving"][0]["pending"] == 1
    assert Job.objects.get(pk=blocked).pending_kind == "quota"
    # a longer patience, and legacy is not starving yet
    patient = viewer_client.get("/api/v1/queue-history/", {"starving_after_s": 4 * 3600}).json()
    assert patient["starving"] == []
    only = viewer_client.get("/api/v1/queue-history/", {"queue": "nlp"}).json()
    assert [r["queue"] for r in only["queues"]] == ["nlp"]

    page = Client()
    page.force_login(Job.objects.get(pk=borrower).owner)
    html = page.get("/queues/history/").content.decode()
    assert 'id="starving"' in html and "/queues/#queue-legacy" in html and 'id="contention"' in html


@pytest.mark.parametrize(
    "params, field",
    [
        ({"since": "last tuesday"}, "since"),
        ({"since": "NOW", "until": "AN_HOUR_AGO"}, "until"),
        ({"until": "TOMORROW"}, "until"),
        ({"since": "LONG_AGO"}, "since"),
        ({"queue": "nope"}, "queue"),
        ({"starving_after_s": "soon"}, "starving_after_s"),
        ({"starving_after_s": "5"}, "starving_after_s"),
    ],
)
def test_a_bad_history_query_gets_a_400_naming_the_field(
    params, field, queues, operator_client, viewer_client
):
    _submit(operator_client, "vision", 8)  # the history starts now
    now = timezone.now()
    words = {
        "NOW": now,
        "AN_HOUR_AGO": now - timedelta(hours=1),
        "TOMORROW": now + timedelta(days=1),
        "LONG_AGO": now - timedelta(days=30),
    }
    query = {k: words[v].isoformat() if v in words else v for k, v in params.items()}
    answer = viewer_client.get("/api/v1/queue-history/", query)
    assert answer.status_code == 400 and field in answer.json(), (query, answer.content)
