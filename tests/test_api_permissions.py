"""The permission matrix for every API endpoint: anonymous 401, viewer reads, operator writes."""

import pytest
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cluster.models import GPU, Datacenter, Node, Pod, Rack, Region

# endpoint -> (a valid body for create, or None when the endpoint does not create)
ENDPOINTS = {
    "chip-types": lambda: {
        "name": "TPU-X",
        "vendor": "X",
        "model": "X1",
        "generation": "1",
        "bf16_tflops": 100,
        "memory_gib": 32,
        "memory_bandwidth_tbps": 1,
        "link_bandwidth_gbps": 100,
        "tdp_watts": 300,
        "price_per_gpu_hour": 1.5,
        "failure_rate_factor": 1,
    },
    "regions": lambda: {"name": "west"},
    "datacenters": lambda: {"region": Region.objects.first().pk, "name": "dc9", "power_budget_kw": 10},
    "links": lambda: {
        "a": Datacenter.objects.first().pk,
        "b": Datacenter.objects.create(region=Region.objects.first(), name="dc3").pk,
        "distance_km": 40,
        "lanes": 2,
    },
    "pods": lambda: {"datacenter": Datacenter.objects.first().pk, "name": "p99"},
    "racks": lambda: {"pod": Pod.objects.first().pk, "name": "r99"},
    "nodes": lambda: {
        "rack": Rack.objects.first().pk,
        "hostname": "new-node-1",
        "chip_type": "H100-SXM",
        "gpus_per_node": 8,
    },
    "gpus": None,
}


def list_url(name: str) -> str:
    basenames = {
        "chip-types": "chiptype",
        "regions": "region",
        "datacenters": "datacenter",
        "links": "datacenterlink",
        "pods": "pod",
        "racks": "rack",
        "nodes": "node",
        "gpus": "gpu",
    }
    return reverse(f"{basenames[name]}-list")


@pytest.mark.parametrize("name", ENDPOINTS)
def test_anonymous_gets_401_everywhere(small_cluster, anonymous_client, name):
    assert anonymous_client.get(list_url(name)).status_code == 401
    assert anonymous_client.post(list_url(name), {}, format="json").status_code == 401


@pytest.mark.parametrize("name", ENDPOINTS)
def test_a_user_without_a_role_is_refused(small_cluster, outsider, name):
    client = APIClient()
    client.force_authenticate(outsider)
    assert client.get(list_url(name)).status_code == 403


@pytest.mark.parametrize("name", ENDPOINTS)
def test_viewer_reads_but_cannot_write(small_cluster, viewer_client, name):
    response = viewer_client.get(list_url(name))
    assert response.status_code == 200
    assert response.json()["count"] >= 1
    first = response.json()["results"][0]["id"]
    detail = f"{list_url(name)}{first}/"
    assert viewer_client.get(detail).status_code == 200
    body = ENDPOINTS[name]() if ENDPOINTS[name] else {}
    assert viewer_client.post(list_url(name), body, format="json").status_code in (403, 405)
    assert viewer_client.patch(detail, {}, format="json").status_code == 403
    assert viewer_client.delete(detail).status_code in (403, 405)


@pytest.mark.parametrize("name", [n for n, body in ENDPOINTS.items() if body])
def test_operator_creates_updates_and_deletes(small_cluster, operator_client, name):
    response = operator_client.post(list_url(name), ENDPOINTS[name](), format="json")
    assert response.status_code == 201, response.json()
    detail = f"{list_url(name)}{response.json()['id']}/"
    assert operator_client.get(detail).status_code == 200
    if name == "chip-types":
        assert operator_client.patch(detail, {"price_per_gpu_hour": 2.0}, format="json").status_code == 200
    if name == "nodes":
        assert GPU.objects.filter(node__hostname="new-node-1").count() == 8  # a new node brings its GPUs
        assert operator_client.patch(detail, {"is_spare": True}, format="json").json()["is_spare"] is True
    assert operator_client.delete(detail).status_code == 204


def test_operator_updates_gpu_state_and_health_but_not_identity(small_cluster, operator_client):
    gpu = GPU.objects.first()
    url = f"{list_url('gpus')}{gpu.pk}/"
    response = operator_client.patch(url, {"health": "warning", "uuid": "GPU-forged"}, format="json")
    assert response.status_code == 200
    gpu.refresh_from_db()
    assert gpu.health == "warning" and gpu.uuid != "GPU-forged"
    assert operator_client.post(list_url("gpus"), {}, format="json").status_code == 405
    assert operator_client.delete(url).status_code == 405


@pytest.mark.parametrize("action", ["cordon", "drain", "uncordon"])
def test_node_actions_are_for_operators_only(small_cluster, anonymous_client, viewer_client, action):
    node = Node.objects.first()
    url = reverse(f"node-{action}", args=[node.pk])
    assert anonymous_client.post(url).status_code == 401
    assert viewer_client.post(url).status_code == 403
    node.refresh_from_db()
    assert node.state == "ready"


def test_token_authentication_works(small_cluster, viewer):
    token = Token.objects.create(user=viewer)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get(list_url("nodes")).status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    r = client.get(list_url("nodes"))
    assert r.status_code == 401 and r.json()["detail"] == "Invalid token."


def test_a_token_carries_its_users_role_and_stops_with_the_user(small_cluster, viewer, operator):
    """The one-query token check returns the same user, role and errors as DRF's own."""
    from cluster.api.authentication import TokenAuthentication

    op_token = Token.objects.create(user=operator)
    user, token = TokenAuthentication().authenticate_credentials(op_token.key)
    assert user == operator and user.username == operator.username and token.user == user
    assert user.last_login == operator.last_login and user.date_joined == operator.date_joined
    assert token.created == op_token.created
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {op_token.key}")
    node = Node.objects.first()
    assert client.post(reverse("node-cordon", args=[node.pk]), {"reason": "token test"}).status_code == 200
    viewer_client = APIClient()
    viewer_client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=viewer).key}")
    assert viewer_client.post(reverse("node-uncordon", args=[node.pk])).status_code == 403
    operator.is_active = False
    operator.save()
    r = client.get(list_url("nodes"))
    assert r.status_code == 401 and r.json()["detail"] == "User inactive or deleted."


def test_a_remembered_token_follows_changes_here_at_once_and_elsewhere_within_a_second(
    small_cluster, viewer, operator, monkeypatch
):
    """A web process remembers a token it found for a second; a change made through it (a role
    taken away, the token deleted) applies to the next request, one made elsewhere (here a bulk
    update, which sends no signal) once the second has passed."""
    from django.contrib.auth.models import Group

    from cluster.api import authentication, memo

    clock = [5000.0]
    monkeypatch.setattr(memo.time, "monotonic", lambda: clock[0])
    token = Token.objects.create(user=operator)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    node = Node.objects.first()
    cordon = reverse("node-cordon", args=[node.pk])
    assert client.post(cordon, {"reason": "memo test"}).status_code == 200
    operator.groups.set([Group.objects.get_or_create(name="viewer")[0]])  # through this process: at once
    assert client.post(cordon, {"reason": "memo test"}).status_code == 403
    type(operator).objects.filter(pk=operator.pk).update(is_active=False)  # no signal
    assert client.get(list_url("nodes")).status_code == 200  # remembered for the second
    clock[0] += authentication.TOKEN_MEMO_S
    r = client.get(list_url("nodes"))
    assert r.status_code == 401 and r.json()["detail"] == "User inactive or deleted."
    viewer_token = Token.objects.create(user=viewer)
    client.credentials(HTTP_AUTHORIZATION=f"Token {viewer_token.key}")
    assert client.get(list_url("nodes")).status_code == 200
    viewer_token.delete()
    assert client.get(list_url("nodes")).status_code == 401


def test_session_authentication_works(small_cluster, viewer):
    client = APIClient()
    assert client.login(username=viewer.username, password="pw")
    assert client.get(list_url("gpus")).status_code == 200


def test_the_schema_and_docs_need_no_login_but_the_data_does(small_cluster, anonymous_client):
    assert anonymous_client.get("/api/schema/").status_code == 200
    assert anonymous_client.get("/api/docs/").status_code == 200
    assert anonymous_client.get(list_url("gpus")).status_code == 401


def test_one_api_root_lists_every_endpoint(operator_client):
    from config.api import APPS

    root = operator_client.get("/api/v1/")
    assert root.status_code == 200
    listed = set(root.json())
    # every endpoint but those under one object (a node's ports: /nodes/{id}/ports/), which that
    # object's own URL leads to
    expected = {prefix for app in APPS for prefix, _ in app.routes} | {
        p.name for app in APPS for p in app.urlpatterns if "<" not in str(p.pattern)
    }
    assert expected <= listed
    assert {
        "nodes",
        "jobs",
        "queues",
        "faults",
        "simulations",
        "overview",
        "ettr",
        "telemetry-frame",
    } <= listed
    for name, url in root.json().items():
        assert url.startswith("http://testserver/api/v1/"), name
