"""Brute force and floods (cluster.api.throttling): failed logins and credentials lock an address
out for a while, enrolment and submits are rate-limited; each refusal is a 429 with Retry-After
and changes nothing."""

from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from cluster.api.throttling import EnrolThrottle, SubmitThrottle
from scheduling.models import Job


def test_failed_logins_lock_the_address_out_even_for_the_right_password(operator, settings):
    settings.FAILURE_LIMITS = {**settings.FAILURE_LIMITS, "login": (3, 120)}
    browser = Client()
    for _ in range(2):
        assert (
            browser.post("/accounts/login/", {"username": operator.username, "password": "no"}).status_code
            == 200
        )
    locked = browser.post("/accounts/login/", {"username": operator.username, "password": "no"})
    assert locked.status_code == 429 and 0 < int(locked["Retry-After"]) <= 120
    right = browser.post("/accounts/login/", {"username": operator.username, "password": "pw"})
    assert right.status_code == 429 and "_auth_user_id" not in browser.session  # not logged in
    other = Client(REMOTE_ADDR="10.9.9.9")  # another address is not locked out
    assert (
        other.post("/accounts/login/", {"username": operator.username, "password": "pw"}).status_code == 302
    )
    assert Client().get("/admin/login/?next=/admin/")["Location"] == "/accounts/login/?next=/admin/"


def test_guessing_tokens_locks_the_address_out_and_forwarded_addresses_are_not_believed(operator, settings):
    from rest_framework.authtoken.models import Token

    settings.FAILURE_LIMITS = {**settings.FAILURE_LIMITS, "token": (3, 60)}
    good = Token.objects.create(user=operator)
    guesser = APIClient()
    for i in range(3):
        guesser.credentials(HTTP_AUTHORIZATION=f"Token guess{i}", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
        assert guesser.get("/api/v1/jobs/").status_code == 401
    guesser.credentials(HTTP_AUTHORIZATION=f"Token {good.key}", HTTP_X_FORWARDED_FOR="192.0.2.77")
    r = guesser.get("/api/v1/jobs/")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0 and "failed credentials" in r.json()["detail"]
    node_guess = APIClient(REMOTE_ADDR="10.1.1.1")
    for _ in range(3):
        node_guess.credentials(HTTP_AUTHORIZATION="Node myr-node-guess")
        assert node_guess.get("/api/v1/agent/assignments/").status_code == 401
    assert node_guess.get("/api/v1/agent/assignments/").status_code == 429


def test_a_lockout_another_web_process_set_is_honoured_within_a_second(operator, settings, monkeypatch):
    """A clear lockout is remembered for CLEAR_MEMO_S (each token request saves a round trip to the
    cache); one that another process set (written to the shared cache here) refuses this process's
    requests once that time has passed, and a failure here is never answered from memory."""
    from django.core.cache import cache
    from rest_framework.authtoken.models import Token

    from cluster.api import memo, throttling

    clock = [1000.0]
    monkeypatch.setattr(memo.time, "monotonic", lambda: clock[0])
    good = Token.objects.create(user=operator)
    client = APIClient(REMOTE_ADDR="10.7.7.7")
    client.credentials(HTTP_AUTHORIZATION=f"Token {good.key}")
    assert client.get("/api/v1/jobs/").status_code == 200
    cache.set(throttling._key("token", "10.7.7.7") + ":until", throttling.time.time() + 60, 60)
    clock[0] += throttling.CLEAR_MEMO_S / 2
    assert client.get("/api/v1/jobs/").status_code == 200  # still the clear answer it read
    clock[0] += throttling.CLEAR_MEMO_S
    refused = client.get("/api/v1/jobs/")
    assert refused.status_code == 429 and "failed credentials" in refused.json()["detail"]
    cache.delete(throttling._key("token", "10.7.7.7") + ":until")
    settings.FAILURE_LIMITS = {**settings.FAILURE_LIMITS, "token": (2, 60)}
    assert client.get("/api/v1/jobs/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert client.get("/api/v1/jobs/").status_code == 401
    assert client.get("/api/v1/jobs/").status_code == 401  # the second failure locks it out
    client.credentials(HTTP_AUTHORIZATION=f"Token {good.key}")
    assert client.get("/api/v1/jobs/").status_code == 429  # at once: no time passed


def test_submits_are_limited_per_user_and_a_refused_one_writes_nothing(queues, operator_client, monkeypatch):
    monkeypatch.setattr(SubmitThrottle, "rate", "2/min", raising=False)
    body = {"queue": "vision", "chip_types": ["H100-SXM"], "gpus": 8}
    assert [operator_client.post("/api/v1/jobs/", body, format="json").status_code for _ in range(2)] == [
        201,
        201,
    ]
    r = operator_client.post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0
    assert Job.objects.count() == 2
    assert operator_client.get("/api/v1/jobs/").status_code == 200  # reading is not limited


def test_enrolment_attempts_are_limited_per_address(small_cluster, monkeypatch):
    monkeypatch.setattr(EnrolThrottle, "rate", "2/min", raising=False)
    agent = APIClient()
    body = {"token": "myr-enrol-guess", "hostname": "nobody", "gpus": 8}
    assert [agent.post("/api/v1/agent/enrol/", body, format="json").status_code for _ in range(2)] == [
        403,
        403,
    ]
    r = agent.post("/api/v1/agent/enrol/", body, format="json")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0


def test_the_agents_fast_report_path_counts_failed_credentials_too(small_cluster, settings):
    import asyncio
    import json

    from monitoring.telemetry.agent_asgi import AgentReports

    settings.FAILURE_LIMITS = {**settings.FAILURE_LIMITS, "token": (2, 60)}

    async def inner(scope, receive, send):  # every other request: not reached here
        raise AssertionError("the report path answers itself")

    app = AgentReports(inner)

    async def post():
        body = json.dumps({"seq": 1}).encode()
        sent = []
        scope = {
            "type": "http",
            "path": "/api/v1/agent/report/",
            "method": "POST",
            "client": ("10.7.7.7", 5000),
            "headers": [
                (b"authorization", b"Node myr-node-wrong"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        messages = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def receive():
            return next(messages)

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"], dict(sent[0]["headers"])

    statuses = [asyncio.run(post()) for _ in range(3)]
    assert [s for s, _ in statuses] == [401, 429, 429]
    assert int(statuses[-1][1][b"retry-after"]) > 0


def test_the_sliding_window_holds_the_rate_at_a_constant_cost_and_says_when_to_come_back(
    operator, monkeypatch
):
    """60/min from a client that asks 5 times a second for 10 minutes: about 60 a minute get
    through, never more than 60 in one minute's fixed window, and each refusal's Retry-After is
    when the next one gets through. The state per user is two counters, whatever the rate."""
    from types import SimpleNamespace

    from django.core.cache import cache

    clock = [1_800_000_000.0]
    monkeypatch.setattr(SubmitThrottle, "rate", "60/min", raising=False)
    monkeypatch.setattr(SubmitThrottle, "timer", lambda self: clock[0])
    request = SimpleNamespace(user=operator, META={"REMOTE_ADDR": "10.0.0.1"})
    allowed, refused_waits = [], []
    while clock[0] < 1_800_000_600:
        throttle = SubmitThrottle()
        if throttle.allow_request(request, None):
            allowed.append(clock[0])
        else:
            refused_waits.append((clock[0], throttle.wait()))
        clock[0] += 0.2
    per_minute = {}
    for t in allowed:
        per_minute[int(t // 60)] = per_minute.get(int(t // 60), 0) + 1
    assert max(per_minute.values()) <= 60
    assert 560 <= len(allowed) <= 610  # ten minutes at 60/min (the first minute's burst included)
    # a refusal names the moment the next request goes through (within one request's spacing)
    for at, wait in refused_waits[:200]:
        nxt = next(t for t in allowed if t > at)
        assert nxt - 0.2 - 1e-6 <= at + wait <= nxt + 1e-6, (at, wait, nxt)
    key = SubmitThrottle().get_cache_key(request, None)
    assert cache.get(f"{key}:{int((clock[0] - 0.2) // 60)}") > 0  # counters, not a list of times
