"""Who may do what, for every route the server has: each API route x method x persona
(anonymous, no role, viewer, operator, a node's credential), each page, the websocket.

The rules are data (``API`` and ``PAGES``); a route the server answers that has no row here fails
the test, so a new endpoint cannot ship without its permissions decided. Object ids that do not
exist are used on purpose: permissions are checked before the object is looked up, so a refusal
is a 401/403 and an allowed call is anything else (a 404, a 400 for an empty body, a 405)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from cluster.agents import create_enrolment_token, enrol
from cluster.models import Node

# API route name -> who may call it:
#   "role": viewers read (GET), operators write; "operator": operators only, reads included;
#   "public": anyone; "agent": a node's credential only; "agent+operator": a node's credential
#   (for a job on its node) or an operator
API = {
    "api-root": "role",
    "api-not-found": "public",  # a JSON 404 for anything under /api/v1/ that names no endpoint
    "schema": "public",
    "api-docs": "public",
    "api-redoc": "public",
    "ettr": "role",
    "overview": "role",
    "overview-history": "role",
    "telemetry-layout": "role",
    "telemetry-network": "role",
    "telemetry-fabric": "role",
    "telemetry-frame": "role",
    "telemetry-levels": "role",
    "telemetry-levels-find": "role",
    "drain-preview": "role",
    "efficiency": "role",
    "usage": "role",
    "usage-csv": "role",
    "queue-history": "role",
    "node-ports": "role",
    "node-ports-record": "role",
    "node-ports-trace": "role",
    "agent-enrol": "public",
    "agent-report": "agent",
    "agent-assignments": "agent",
    "agent-trace": "agent",
    "chiptype-list": "role",
    "chiptype-detail": "role",
    "region-list": "role",
    "region-detail": "role",
    "datacenter-list": "role",
    "datacenter-detail": "role",
    "datacenterlink-list": "role",
    "datacenterlink-detail": "role",
    "datacenterlink-lanes-lost": "role",
    "datacenterlink-mark-down": "role",
    "datacenterlink-mark-up": "role",
    "pod-list": "role",
    "pod-detail": "role",
    "rack-list": "role",
    "rack-detail": "role",
    "node-list": "role",
    "node-detail": "role",
    "node-cordon": "role",
    "node-drain": "role",
    "node-mark-down": "role",
    "node-repair": "role",
    "node-return-to-service": "role",
    "node-uncordon": "role",
    "gpu-list": "role",
    "gpu-detail": "role",
    "enrolmenttoken-list": "role",  # viewers see who made which token and when, never a secret
    "enrolmenttoken-detail": "role",
    "nodecredential-list": "role",
    "nodecredential-detail": "role",
    "nodecredential-revoke": "role",
    "checkpointpolicy-list": "role",
    "checkpointpolicy-detail": "role",
    "cohort-list": "role",
    "cohort-detail": "role",
    "queue-list": "role",
    "queue-detail": "role",
    "queue-resume": "role",
    "queue-stop": "role",
    "queue-webhook-secret": "role",
    "job-list": "role",
    "job-detail": "role",
    "job-cancel": "role",
    "job-report-checkpoint": "agent+operator",
    "job-request-checkpoint": "role",
    "job-resume": "role",
    "job-suspend": "role",
    "jobarray-list": "role",
    "jobarray-detail": "role",
    "jobarray-cancel": "role",
    "jobarray-hold": "role",
    "jobarray-release": "role",
    "inferenceservice-list": "role",
    "inferenceservice-detail": "role",
    "inferenceservice-autoscale": "role",
    "faultevent-list": "role",
    "faultevent-detail": "role",
    "congestionrecord-list": "role",
    "congestionrecord-detail": "role",
    "sitepartition-list": "role",
    "sitepartition-detail": "role",
    "sitepartition-end": "role",
    "simulation-list": "role",
    "simulation-detail": "role",
    "simulation-report": "role",
}
# page route name -> "viewer" (viewers read it), "operator" (viewers read it, operators post to
# it), "operator-only" (operators only), "public" (anyone), "staff" (the admin)
PAGES = {
    "inventory": "viewer",
    "jobs": "viewer",
    "job-page": "operator",
    "services": "viewer",
    "service-page": "viewer",
    "queues": "viewer",
    "queue-edit": "operator-only",
    "policies": "viewer",
    "policy-new": "operator-only",
    "policy-edit": "operator-only",
    "metrics": "public",
    "metrics-gpus": "public",
    "live": "viewer",
    "live-levels": "viewer",
    "overview": "viewer",
    "topology": "viewer",
    "topology-level": "viewer",
    "node-page": "operator",
    "gpu-page": "viewer",
    "faults": "viewer",
    "efficiency": "viewer",
    "usage": "viewer",
    "queue-history": "viewer",
    "simulations": "operator",
    "simulation-page": "viewer",
    "login": "public",
    "admin-login": "public",
    "logout": "public",
    "index": "staff",
}
SAFE = ("get",)
MISSING = "999999"


def _routes():
    """(name, a URL for it, the view's methods) of every route, API and pages."""

    def walk(resolver, prefix=""):
        for p in resolver.url_patterns:
            if isinstance(p, URLResolver):
                if str(p.pattern).startswith("admin/") and prefix == "":
                    yield "admin/", "index", None
                    continue
                yield from walk(p, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern), p.name, p.callback

    seen = {}
    for pattern, name, callback in walk(get_resolver()):
        key = ("api" if pattern.startswith("api/") else "page", name)
        if "format" in pattern or key in seen:
            continue  # the .json suffix variants answer as their route does
        url = re.sub(r"\(\?P<pk>[^)]*\)", MISSING, pattern)
        url = re.sub(r"<int:pk>|<str:hostname>", MISSING, url).replace("<str:level>", "rack")
        url = "/" + url.replace("^", "").replace("$", "")
        seen[key] = (url, _methods(callback))
    return seen


def _methods(callback) -> tuple[str, ...]:
    if callback is None:
        return SAFE
    actions = getattr(callback, "actions", None)
    if actions:
        # DRF adds "head" to a route's actions on its first GET: it answers as GET does
        return tuple(sorted(m for m in actions if m not in ("options", "head")))
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if cls is not None:
        return tuple(m for m in ("get", "post", "put", "patch", "delete") if hasattr(cls, m))
    return SAFE


ROUTES = None


def routes():
    global ROUTES
    if ROUTES is None:
        ROUTES = _routes()
    return ROUTES


def test_every_route_has_a_row():
    rows = {("api", n) for n in API} | {("page", n) for n in PAGES}
    assert set(routes()) - rows == set(), "routes with no permission row"
    assert rows - set(routes()) == set(), "rows for routes that are gone"


@pytest.fixture
def personas(small_cluster, viewer, operator, outsider):
    node = Node.objects.order_by("id").first()
    _, secret = create_enrolment_token(actor="test", node=node)
    _, key = enrol(secret, hostname=node.hostname, address="10.0.0.9")
    out = {}
    for name, user in (("outsider", outsider), ("viewer", viewer), ("operator", operator)):
        c = APIClient()
        c.force_authenticate(user)
        out[name] = c
    out["anonymous"] = APIClient()
    out["node"] = APIClient()
    out["node"].credentials(HTTP_AUTHORIZATION=f"Node {key}")
    return out


def _expect(rule: str, persona: str, method: str) -> str:
    """ "refused" (401 for anonymous, 403 otherwise) or "allowed" (anything but 401/403)."""
    if rule == "public":
        return "allowed"
    if rule == "agent":
        return "allowed" if persona == "node" else "refused"
    if rule == "agent+operator":
        return "allowed" if persona in ("node", "operator") else "refused"
    if persona == "operator":
        return "allowed"
    if rule == "role" and persona == "viewer" and method in SAFE:
        return "allowed"
    return "refused"


def _call(client, method: str, url: str):
    return getattr(client, method)(url, {}, format="json") if method != "get" else client.get(url)


def test_every_api_route_answers_each_persona_by_its_rule(personas):
    wrong = []
    for name, rule in sorted(API.items()):
        wrong += _check_api(personas, name, rule)
    assert wrong == []


def _check_api(personas, name: str, rule: str) -> list[str]:
    url, methods = routes()[("api", name)]
    wrong = []
    for persona, client in personas.items():
        for method in methods:
            r = _call(client, method, url)
            want = _expect(rule, persona, method)
            got = "refused" if r.status_code in (401, 403) else "allowed"
            if want != got or r.status_code >= 500:
                wrong.append(f"{persona} {method.upper()} {url}: {r.status_code}, expected {want}")
            if want == "refused" and persona == "anonymous" and r.status_code != 401:
                wrong.append(f"anonymous {method.upper()} {url}: {r.status_code}, expected 401")
    return wrong


def test_every_page_answers_each_persona_by_its_rule(small_cluster, viewer, operator, outsider):
    for name in sorted(PAGES):
        _check_page(name, viewer, operator, outsider)


def _check_page(name: str, viewer, operator, outsider) -> None:
    url, _ = routes()[("page", name)]
    rule = PAGES[name]
    anonymous = Client().get(url)
    if rule == "public":
        assert anonymous.status_code < 500
        return
    if rule == "staff":
        assert anonymous.status_code == 302 and "login" in anonymous["Location"]
        viewer_client = Client()
        viewer_client.force_login(viewer)
        assert viewer_client.get(url).status_code == 302  # not staff: to the login page
        return
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    clients = {}
    for persona, user in (("outsider", outsider), ("viewer", viewer), ("operator", operator)):
        clients[persona] = Client()
        clients[persona].force_login(user)
    assert clients["outsider"].get(url).status_code == 403
    if rule == "operator-only":
        assert clients["viewer"].get(url).status_code == 403
        assert clients["operator"].get(url).status_code not in (401, 403)
        return
    assert clients["viewer"].get(url).status_code not in (401, 403)
    if rule == "operator":
        assert clients["viewer"].post(url, {}).status_code == 403
        assert clients["operator"].post(url, {}).status_code not in (401, 403)


def test_the_websocket_needs_a_viewer(small_cluster, viewer, outsider):
    import asyncio

    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from config.routing import websocket_urlpatterns
    from monitoring.telemetry.consumers import LevelsConsumer, TelemetryConsumer

    consumers = {"/ws/telemetry/": TelemetryConsumer, "/ws/levels/": LevelsConsumer}
    assert sorted(consumers) == sorted(f"/{p.pattern}" for p in websocket_urlpatterns)  # every websocket

    async def connect(user, path):
        communicator = WebsocketCommunicator(consumers[path].as_asgi(), path)
        communicator.scope["user"] = user or AnonymousUser()
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    for path in consumers:
        for user in (None, outsider):
            connected, code = asyncio.run(connect(user, path))
            assert not connected and code == 4403
