"""The machine clients' short path (config.machine_api): an API call with a token or a node
credential gets the answer Django's full request cycle gives (status, body, the headers that
matter), and it really was served on the short path; everything else goes the full way."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from cluster.agents import create_enrolment_token, enrol
from cluster.models import Node
from config.machine_api import MachineApi, machine_request
from scheduling.trigger import _bump_version

SAME_HEADERS = (
    "content-type",
    "allow",
    "www-authenticate",
    "retry-after",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
)


async def _acall(app, method: str, path: str, headers: dict, body: bytes = b""):
    """(status, headers, body) of one request sent to an ASGI ``app`` as a server would."""
    headers = {**headers, "Content-Length": str(len(body))} if body else headers
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path.split("?")[0],
        "raw_path": path.encode(),
        "query_string": path.partition("?")[2].encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    answer = {"body": b""}
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        else:
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return answer["status"], answer["headers"], answer["body"]


def _call(app, method: str, path: str, headers: dict, body: bytes = b""):
    return asyncio.run(_acall(app, method, path, headers, body))


@pytest.fixture
def apps(settings):
    from config.asgi import django_asgi_app

    settings.API_THREADS = 1  # one thread: its connection is closed at the end
    short = MachineApi(django_asgi_app)
    served = []
    serve = short.handler.serve

    def counted(scope, body_file):
        served.append(scope["path"])
        return serve(scope, body_file)

    short.handler.serve = counted
    yield django_asgi_app, short, served
    short.pool.submit(lambda: connection.close()).result()
    short.pool.shutdown()


def _without_ids(payload):
    volatile = {"id", "submitted_at", "name", "created", "updated_at"}
    if isinstance(payload, dict):
        return {k: _without_ids(v) for k, v in payload.items() if k not in volatile}
    if isinstance(payload, list):
        return [_without_ids(v) for v in payload]
    return payload


@pytest.mark.django_db(transaction=True)
def test_machine_calls_get_the_answers_of_the_full_request_cycle(apps, queues, operator, viewer):
    full, short, served = apps
    op = {"Authorization": f"Token {Token.objects.create(user=operator).key}"}
    view = {"Authorization": f"Token {Token.objects.create(user=viewer).key}"}
    js = {"Content-Type": "application/json"}
    good = json.dumps({"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"}).encode()
    cases = [
        ("POST", "/api/v1/jobs/", {**op, **js}, good),  # created
        ("POST", "/api/v1/jobs/", {**op, **js}, json.dumps({"queue": "vision", "gpus": -1}).encode()),
        ("POST", "/api/v1/jobs/", {**op, **js}, json.dumps({"queue": "nope", "gpus": 8}).encode()),
        ("POST", "/api/v1/jobs/", {**op, **js}, b'{"queue": '),  # broken JSON
        ("POST", "/api/v1/jobs/", {**view, **js}, good),  # a viewer never writes
        ("POST", "/api/v1/jobs/", {"Authorization": "Token not-a-token", **js}, good),
        ("POST", "/api/v1/jobs/", {"Authorization": "Node myr-node-unknown", **js}, good),
        ("GET", "/api/v1/jobs/?state=pending", op, b""),
        ("GET", "/api/v1/queues/", view, b""),
        ("DELETE", "/api/v1/jobs/", op, b""),  # not allowed
        ("GET", "/api/v1/no-such-thing/", op, b""),  # the API's JSON 404
    ]
    for method, path, headers, body in cases:
        before = len(served)
        want = _call(full, method, path, headers, body)
        got = _call(short, method, path, headers, body)
        assert len(served) == before + 1, (method, path)  # served on the short path
        assert got[0] == want[0], (method, path, got, want)
        for name in SAME_HEADERS:
            assert got[1].get(name) == want[1].get(name), (method, path, name)
        if want[1].get("content-type", "").startswith("application/json"):
            assert _without_ids(json.loads(got[2])) == _without_ids(json.loads(want[2])), (method, path)
        else:
            assert got[2] == want[2]
    statuses = [_call(short, m, p, h, b)[0] for m, p, h, b in cases]
    assert statuses == [201, 400, 400, 400, 403, 401, 401, 200, 200, 405, 404]


@pytest.mark.django_db(transaction=True)
@pytest.mark.django_db(transaction=True)
def test_remembered_paths_answer_for_their_own_object_and_the_memory_stays_bounded(
    apps, queues, operator, monkeypatch
):
    """The short path remembers where each path resolves: each job's page answers with that job
    however often and in whatever order it is asked, and past the limit the memory starts again."""
    _, short, _ = apps
    monkeypatch.setattr("config.machine_api.RESOLVED_PATHS", 3)
    op = {"Authorization": f"Token {Token.objects.create(user=operator).key}"}
    js = {"Content-Type": "application/json"}
    ids = []
    for gpus in (1, 2, 4, 8):
        body = json.dumps({"queue": "vision", "gpus": gpus, "chip_types": ["H100-SXM"], "topology": "any"})
        status, _, answer = _call(short, "POST", "/api/v1/jobs/", {**op, **js}, body.encode())
        assert status == 201, answer
        ids.append(json.loads(answer)["id"])
    for job_id in [*ids, *reversed(ids), *ids]:
        status, _, answer = _call(short, "GET", f"/api/v1/jobs/{job_id}/", op)
        assert status == 200 and json.loads(answer)["id"] == job_id
        assert len(short.handler.resolved) <= 3
    assert _call(short, "GET", "/api/v1/jobs/999999/", op)[0] == 404


def test_browsers_and_anonymous_calls_go_the_full_way(apps, queues, operator):
    full, short, served = apps
    assert _call(short, "GET", "/api/v1/jobs/", {})[0] == 401  # anonymous
    assert _call(short, "GET", "/api/v1/jobs/", {"Authorization": "Basic b3A6cHc="})[0] == 401
    assert _call(short, "GET", "/accounts/login/", {"Authorization": "Token x"})[0] == 200  # not the API
    assert served == []
    assert machine_request(
        {"type": "http", "path": "/api/v1/jobs/", "headers": [(b"authorization", b"token k")]}
    )
    assert not machine_request({"type": "websocket", "path": "/api/v1/jobs/", "headers": []})


def test_the_production_entry_point_uses_the_short_path():
    from config.asgi import application

    http = application.application_mapping["http"]
    assert isinstance(http.app, MachineApi)  # the agents' reports first, then machine clients


@pytest.mark.django_db(transaction=True)
def test_an_agents_long_poll_holds_no_thread_and_wakes_on_a_change(apps, queues, operator):
    """With one API thread, a machine call made while an agent's poll waits is answered before
    the poll; a change of the assignments' version ends the poll at once."""
    _, short, _ = apps
    node = Node.objects.filter(is_spare=False).first()
    _, secret = create_enrolment_token(actor="test", node=node)
    _, key = enrol(secret, hostname=node.hostname)
    token = Token.objects.get_or_create(user=operator)[0].key
    agent, operator_call = {"Authorization": f"Node {key}"}, {"Authorization": f"Token {token}"}

    async def scenario():
        status, _, body = await _acall(short, "GET", "/api/v1/agent/assignments/", agent)
        assert status == 200
        seen = json.loads(body)["version"]
        poll = asyncio.create_task(
            _acall(short, "GET", f"/api/v1/agent/assignments/?version={seen}&wait=20", agent)
        )
        await asyncio.sleep(0.5)
        status, _, _ = await _acall(short, "GET", "/api/v1/queues/", operator_call)
        assert status == 200 and not poll.done()  # answered while the poll still waits
        await asyncio.get_running_loop().run_in_executor(None, _bump_version)  # assignments changed
        status, _, body = await asyncio.wait_for(poll, 10)  # woken well before its 20 s
        assert status == 200 and json.loads(body)["version"] != seen

    asyncio.run(scenario())


def _slowed(short, seconds: float) -> None:
    """Every request the short path serves takes ``seconds`` longer (a server past capacity)."""
    serve = short.handler.serve

    def slow(scope, body_file):
        import time

        time.sleep(seconds)
        return serve(scope, body_file)

    short.handler.serve = slow


@pytest.mark.django_db(transaction=True)
def test_past_capacity_submits_are_shed_at_once_with_retry_after_and_change_nothing(
    apps, queues, operator, settings
):
    """Two submits may wait or run at once: of eight sent together two are served and six get a
    503 with Retry-After before the first is done; only the served ones are jobs."""
    from scheduling.models import Job

    _, short, served = apps
    settings.API_MAX_IN_FLIGHT = 2
    _slowed(short, 0.4)
    token = Token.objects.get_or_create(user=operator)[0].key
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    body = json.dumps({"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"]}).encode()

    async def scenario():
        loop = asyncio.get_running_loop()
        sent = loop.time()
        calls = [asyncio.create_task(_acall(short, "POST", "/api/v1/jobs/", headers, body)) for _ in range(8)]
        shed_after = None
        for done in asyncio.as_completed(calls):
            status, answer_headers, answer = await done
            if status == 503 and shed_after is None:
                shed_after = loop.time() - sent
                assert answer_headers["retry-after"] == "1" and "busy" in json.loads(answer)["detail"]
        return [c.result()[0] for c in calls], shed_after

    statuses, shed_after = asyncio.run(scenario())
    assert sorted(statuses) == [201, 201] + [503] * 6
    assert shed_after < 0.3  # refused at once, not after the served ones
    assert len(served) == 2 and Job.objects.count() == 2
    assert short.shed["in_flight"] == 6


@pytest.mark.django_db(transaction=True)
def test_a_request_that_waited_too_long_for_a_thread_is_shed_but_agents_never_are(
    apps, queues, operator, settings
):
    """With one thread busy for 0.5 s, a tenant's call queued behind it past the 0.2 s queue
    timeout is answered 503 without being served; a node agent's call waits its turn and is served."""
    _, short, served = apps
    settings.API_QUEUE_TIMEOUT_S = 0.2
    _slowed(short, 0.5)
    node = Node.objects.filter(is_spare=False).first()
    _, secret = create_enrolment_token(actor="test", node=node)
    _, key = enrol(secret, hostname=node.hostname)
    token = Token.objects.get_or_create(user=operator)[0].key
    tenant, agent = {"Authorization": f"Token {token}"}, {"Authorization": f"Node {key}"}

    async def scenario():
        first = asyncio.create_task(_acall(short, "GET", "/api/v1/queues/", tenant))
        await asyncio.sleep(0.05)
        late = asyncio.create_task(_acall(short, "GET", "/api/v1/queues/", tenant))
        node_call = asyncio.create_task(_acall(short, "GET", "/api/v1/agent/assignments/", agent))
        return [(await t)[0] for t in (first, late, node_call)]

    assert asyncio.run(scenario()) == [200, 503, 200]
    assert served == ["/api/v1/queues/", "/api/v1/agent/assignments/"]
    assert short.shed["queue_timeout"] == 1
