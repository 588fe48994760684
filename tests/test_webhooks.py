"""Job notifications as a tenant receives them, from a real receiver process on loopback: a
queue's (or a job's own) webhook URL gets the job's state changes, signed with the queue's secret,
retried with backoff when the receiver fails, never from inside the scheduling cycle; a receiver
that stalls costs one timeout; URLs that are not http(s), or that point inside the control plane's
network without the operator's allow-list, get a 400 naming the field and change nothing."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.models import AuditRecord
from scheduling import webhooks
from scheduling.cycle import run_cycle
from scheduling.models import Job, WebhookDelivery
from scheduling.services import change_state
from tests.browser_stack import ROOT, free_port, stop_group


@pytest.fixture
def receiver(tmp_path):
    started = []

    def start(*extra: str) -> tuple[str, object]:
        port = free_port()
        out = tmp_path / f"received-{port}.jsonl"
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.webhook_receiver", str(port), str(out), *extra],
            cwd=ROOT,
            start_new_session=True,
        )
        started.append(process)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the receiver did not start"
                time.sleep(0.05)
        return f"http://127.0.0.1:{port}", out

    yield start
    for process in started:
        stop_group(process)


@pytest.fixture
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("127.0.0.1/32")]
    settings.WEBHOOK_BACKOFF_S = 30.0
    settings.WEBHOOK_MAX_ATTEMPTS = 8


def _received(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _verifies(post: dict, secret: str) -> bool:
    fields = dict(part.split("=", 1) for part in post["headers"]["X-Myriad-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.{post['body']}".encode(), hashlib.sha256)
    return hmac.compare_digest(expected.hexdigest(), fields["sha256"])


def _submit(client, queue: str, **extra) -> int:
    body = {"queue": queue, "gpus": 8, "chip_types": ["H100-SXM"], **extra}
    answer = client.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def _started_with_webhook(client, queues, url: str):
    """A job of queue vision, whose URL is ``url``, started and its delivery queued: (job, now)."""
    client.patch(f"/api/v1/queues/{queues['vision'].pk}/", {"webhook_url": url}, format="json")
    job = _submit(client, "vision")
    run_cycle()
    assert webhooks.enqueue() == 1
    return job, timezone.now()


def test_a_queues_jobs_reach_its_webhook_signed_and_retried_until_delivered(
    queues, operator_client, loopback_allowed, receiver
):
    url, out = receiver("--fail", "2")  # the receiver answers 500 twice, then 204
    vision = queues["vision"]
    answer = operator_client.patch(
        f"/api/v1/queues/{vision.pk}/", {"webhook_url": f"{url}/hooks/vision"}, format="json"
    )
    assert answer.status_code == 200 and answer.json()["webhook_url"] == f"{url}/hooks/vision"
    assert "webhook_secret" not in answer.json()
    secret = operator_client.post(f"/api/v1/queues/{vision.pk}/webhook-secret/").json()["webhook_secret"]
    assert len(secret) == 64
    rotation = AuditRecord.objects.get(action="rotate webhook secret")
    assert rotation.object_name == "vision" and secret not in json.dumps(rotation.changes)

    job = _submit(operator_client, "vision", name="resnet")
    run_cycle()  # the cycle posts nothing: the job starts, its webhook waits for the task
    assert Job.objects.get(pk=job).state == "running" and _received(out) == []

    t0 = timezone.now()
    assert webhooks.enqueue(t0) == 1
    assert webhooks.enqueue(t0) == 0  # once per event
    assert webhooks.deliver_due(t0) == {"delivered": 0, "retrying": 1, "failed": 0}
    delivery = WebhookDelivery.objects.get(job_id=job)
    assert (delivery.attempts, delivery.last_status, delivery.kind) == (1, 500, "started")
    assert delivery.next_attempt_at == t0 + timedelta(seconds=30)
    assert webhooks.deliver_due(t0 + timedelta(seconds=10)) == {"delivered": 0, "retrying": 0, "failed": 0}
    assert webhooks.deliver_due(t0 + timedelta(seconds=31))["retrying"] == 1  # 500 again: 60 s more
    delivery.refresh_from_db()
    assert delivery.next_attempt_at == t0 + timedelta(seconds=31 + 60)
    assert webhooks.deliver_due(t0 + timedelta(seconds=92))["delivered"] == 1
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 3 and delivery.last_status == 204

    posts = _received(out)
    assert len(posts) == 3 and {p["path"] for p in posts} == {"/hooks/vision"}
    body = json.loads(posts[-1]["body"])
    assert body["event"] == "started" and body["job"] == {
        "id": job,
        "name": "resnet",
        "queue": "vision",
        "gpus": 8,
    }
    assert posts[-1]["headers"]["X-Myriad-Event"] == "started"
    assert all(_verifies(p, secret) for p in posts)
    assert not _verifies(posts[-1], "another secret")

    # it finishes: "finished" follows; the job page's API lists both deliveries
    change_state(job, "finish", actor="test")
    webhooks.enqueue()
    assert webhooks.deliver_due()["delivered"] == 1
    assert [json.loads(p["body"])["event"] for p in _received(out)][-1] == "finished"
    listed = operator_client.get(f"/api/v1/jobs/{job}/").json()["webhooks"]
    assert [(w["kind"], w["state"]) for w in listed] == [("finished", "delivered"), ("started", "delivered")]


def test_a_jobs_own_url_wins_over_its_queues(queues, operator_client, loopback_allowed, receiver):
    queue_url, queue_out = receiver()
    job_url, job_out = receiver()
    vision = queues["vision"]
    operator_client.patch(f"/api/v1/queues/{vision.pk}/", {"webhook_url": queue_url}, format="json")
    mine = _submit(operator_client, "vision", webhook_url=f"{job_url}/mine")
    theirs = _submit(operator_client, "vision")
    _submit(operator_client, "nlp")  # a queue without a URL: nothing
    run_cycle()
    assert webhooks.enqueue() == 2
    assert webhooks.deliver_due()["delivered"] == 2
    assert [json.loads(p["body"])["job"]["id"] for p in _received(job_out)] == [mine]
    assert [json.loads(p["body"])["job"]["id"] for p in _received(queue_out)] == [theirs]
    vision.refresh_from_db()
    assert all(_verifies(p, vision.webhook_secret) for p in _received(job_out))  # the queue's secret


def test_a_receiver_that_stalls_costs_one_timeout_and_is_tried_again(
    queues, operator_client, loopback_allowed, receiver, settings
):
    settings.WEBHOOK_TIMEOUT_S = 0.5
    url, out = receiver("--hang", "20")
    job, now = _started_with_webhook(operator_client, queues, url)
    assert webhooks.deliver_due(now) == {"delivered": 0, "retrying": 1, "failed": 0}
    delivery = WebhookDelivery.objects.get(job_id=job)
    assert delivery.last_status is None and "timed out" in delivery.last_error
    assert delivery.next_attempt_at == now + timedelta(seconds=30) and len(_received(out)) == 1


def test_a_delivery_gives_up_after_its_attempts(
    queues, operator_client, loopback_allowed, receiver, settings
):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    url, _ = receiver("--fail", "100")
    job, now = _started_with_webhook(operator_client, queues, url)
    webhooks.deliver_due(now)
    assert webhooks.deliver_due(now + timedelta(hours=1)) == {"delivered": 0, "retrying": 0, "failed": 1}
    assert WebhookDelivery.objects.get(job_id=job).state == "failed"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://93.184.216.34/hook",
        "not a url",
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.20/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[::ffff:10.0.0.5]/hook",
        "http://user:secret@93.184.216.34/hook",
    ],
)
def test_a_bad_webhook_url_gets_a_400_naming_the_field_and_writes_nothing(url, queues, operator_client):
    jobs = Job.objects.count()
    answer = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "gpus": 8, "webhook_url": url}, format="json"
    )
    assert answer.status_code == 400 and "webhook_url" in answer.json(), answer.content
    assert Job.objects.count() == jobs
    vision = queues["vision"]
    answer = operator_client.patch(f"/api/v1/queues/{vision.pk}/", {"webhook_url": url}, format="json")
    assert answer.status_code == 400 and "webhook_url" in answer.json(), answer.content
    vision.refresh_from_db()
    assert vision.webhook_url == ""


def test_a_public_address_passes_and_the_allow_list_opens_a_private_one(queues, operator_client, settings):
    _submit(operator_client, "vision", webhook_url="https://93.184.216.34/hooks/ci")
    settings.WEBHOOK_ALLOW = [ipaddress.ip_network("10.0.0.0/8")]
    _submit(operator_client, "vision", webhook_url="http://10.0.0.5:8080/hooks")


def test_only_operators_rotate_a_queues_secret(queues, viewer_client):
    answer = viewer_client.post(f"/api/v1/queues/{queues['vision'].pk}/webhook-secret/")
    assert answer.status_code == 403


@pytest.fixture
def slow_resolver(monkeypatch, settings):
    """A resolver that answers after ``delay`` seconds and counts the names asked of it."""
    asked: list[str] = []
    state = {"delay": 0.5, "address": "93.184.216.34"}

    def getaddrinfo(host, port, *args, **kwargs):
        asked.append(host)
        time.sleep(state["delay"])
        if state["address"] is None:
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (state["address"], port))]

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", getaddrinfo)
    webhooks.RESOLVER.forget()
    settings.WEBHOOK_RESOLVE_S = 0.05
    yield asked, state
    webhooks.RESOLVER.forget()


def test_a_name_the_resolver_is_slow_to_answer_costs_a_submit_a_bounded_wait(
    queues, operator_client, slow_resolver
):
    asked, state = slow_resolver
    jobs = Job.objects.count()
    url = "https://hooks.example.org/ci"
    answer = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "gpus": 8, "webhook_url": url}, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert "did not resolve within 0.05 s" in answer.json()["webhook_url"][0]
    assert Job.objects.count() == jobs
    # the lookup ran on: once it answered, the same URL passes without asking again
    deadline = time.monotonic() + 10
    while webhooks.RESOLVER.answers.get(("hooks.example.org", 443)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(3):
        _submit(operator_client, "vision", webhook_url=url)
    assert asked == ["hooks.example.org"]


def test_a_name_that_does_not_resolve_is_refused_and_the_post_time_check_asks_afresh(
    queues, operator_client, slow_resolver, settings
):
    asked, state = slow_resolver
    state["delay"], state["address"] = 0.0, None
    settings.WEBHOOK_RESOLVE_S = 5.0
    url = "https://gone.example.org/ci"
    for _ in range(2):
        answer = operator_client.post(
            "/api/v1/jobs/", {"queue": "vision", "gpus": 8, "webhook_url": url}, format="json"
        )
        assert "does not resolve" in answer.json()["webhook_url"][0]
    assert asked == ["gone.example.org"]  # the answer is kept
    # before a post the name is resolved again, whatever was kept: it may point elsewhere now
    state["address"] = "10.0.0.5"
    status, error = webhooks._post(url, b"{}", {})
    assert status is None and "10.0.0.5" in error and asked == ["gone.example.org"] * 2


def test_a_process_forked_after_a_lookup_resolves_with_threads_of_its_own(slow_resolver, settings):
    """A pre-forking worker forks after its parent may have looked a name up: the child's checks
    must not wait on the parent's lookup threads, which a fork does not copy."""
    import multiprocessing

    asked, state = slow_resolver
    state["delay"] = 0.0
    settings.WEBHOOK_RESOLVE_S = 5.0
    webhooks.check_url("https://parent.example.org/ci")  # the parent's pool is running now
    webhooks.RESOLVER.forget()

    def child(conn):
        try:
            webhooks.check_url("https://parent.example.org/ci")
            conn.send("passed")
        except Exception as exc:  # noqa: BLE001 - the child reports whatever went wrong
            conn.send(repr(exc))

    parent_end, child_end = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(target=child, args=(child_end,))
    process.start()
    assert parent_end.poll(20), "the forked child's check never answered"
    assert parent_end.recv() == "passed"
    process.join(10)
