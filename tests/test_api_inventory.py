"""What an automation client sees: filters, pagination, ordering, node actions and clear errors."""

import pytest
import yaml
from django.core.management import call_command
from django.urls import reverse

from cluster.models import GPU, ChipType, Node, Pod


def test_gpu_list_is_paginated_and_counts_everything(small_cluster, viewer_client):
    body = viewer_client.get("/api/v1/gpus/", {"page_size": 10}).json()
    assert body["count"] == 76 and len(body["results"]) == 10 and body["next"]
    first = body["results"][0]
    assert {"uuid", "serial", "hostname", "chip_type", "state", "state_colour", "health"} <= first.keys()


def test_gpus_filter_by_chip_datacenter_and_health(small_cluster, viewer_client):
    GPU.objects.filter(node__hostname="dc1-p01-r01-n01", index__lt=2).update(health="critical")
    a100 = viewer_client.get("/api/v1/gpus/", {"chip_type": "A100-80G"}).json()
    assert a100["count"] == 12 and {g["chip_type"] for g in a100["results"]} == {"A100-80G"}
    dc2 = Pod.objects.get(name="a100").datacenter_id
    assert viewer_client.get("/api/v1/gpus/", {"datacenter": dc2}).json()["count"] == 12
    critical = viewer_client.get("/api/v1/gpus/", {"health": "critical"}).json()
    assert [g["index"] for g in critical["results"]] == [0, 1]
    both = viewer_client.get("/api/v1/gpus/?health=critical&health=ok").json()
    assert both["count"] == 76


def test_nodes_filter_order_and_search(small_cluster, viewer_client):
    spares = viewer_client.get("/api/v1/nodes/", {"is_spare": "true"}).json()
    assert spares["count"] == 2
    ordered = viewer_client.get("/api/v1/nodes/", {"ordering": "-hostname", "page_size": 1}).json()
    assert ordered["results"][0]["hostname"] == "dc2-a100-r01-n03"
    found = viewer_client.get("/api/v1/nodes/", {"search": "p02-r02"}).json()
    assert found["count"] == 2


def test_counts_per_pod_rack_and_datacenter(small_cluster, viewer_client):
    pods = {p["name"]: p for p in viewer_client.get("/api/v1/pods/").json()["results"]}
    assert (pods["p01"]["rack_count"], pods["p01"]["node_count"], pods["p01"]["gpu_count"]) == (2, 4, 32)
    dcs = {d["name"]: d["gpu_count"] for d in viewer_client.get("/api/v1/datacenters/").json()["results"]}
    assert dcs == {"dc1": 64, "dc2": 12}
    racks = viewer_client.get("/api/v1/racks/", {"pod": pods["a100"]["id"]}).json()["results"]
    assert [(r["node_count"], r["gpu_count"]) for r in racks] == [(3, 12)]


def test_a_bad_filter_value_is_a_400_naming_the_field(small_cluster, viewer_client):
    response = viewer_client.get("/api/v1/nodes/", {"state": "on-fire"})
    assert response.status_code == 400
    assert "state" in response.json()
    assert viewer_client.get("/api/v1/gpus/", {"datacenter": "north"}).status_code == 400


def test_cordon_drain_uncordon_round_trip(small_cluster, operator_client):
    node = Node.objects.get(hostname="dc1-p01-r01-n01")
    r = operator_client.post(reverse("node-cordon", args=[node.pk]), {"reason": "XID 79 seen"}, format="json")
    assert r.status_code == 200
    assert (
        r.json()["state"] == "cordoned" and r.json()["state_reason"] == "cordon by otto-operator: XID 79 seen"
    )
    assert operator_client.post(reverse("node-drain", args=[node.pk])).json()["state"] == "draining"
    r = operator_client.post(reverse("node-uncordon", args=[node.pk]))
    assert r.json()["state"] == "ready" and r.json()["state_reason"] == ""


def test_an_impossible_action_is_refused_and_changes_nothing(small_cluster, operator_client):
    node = Node.objects.get(hostname="dc1-p01-r01-n01")
    response = operator_client.post(reverse("node-uncordon", args=[node.pk]))
    assert response.status_code == 409
    assert "cannot uncordon a node that is ready" in response.json()["state"][0]
    Node.objects.filter(pk=node.pk).update(state="down")
    assert operator_client.post(reverse("node-cordon", args=[node.pk])).status_code == 409
    node.refresh_from_db()
    assert node.state == "down"


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (
            "/api/v1/nodes/",
            {"rack": 1, "hostname": "n", "chip_type": "H900", "gpus_per_node": 8},
            "chip_type",
        ),
        (
            "/api/v1/nodes/",
            {"rack": 1, "hostname": "n", "chip_type": "H100-SXM", "gpus_per_node": 0},
            "gpus_per_node",
        ),
        ("/api/v1/nodes/", {"rack": 1, "hostname": "dc1-p01-r01-n01", "chip_type": "H100-SXM"}, "hostname"),
        (
            "/api/v1/chip-types/",
            {
                "name": "Z",
                "vendor": "Z",
                "model": "Z",
                "generation": "1",
                "bf16_tflops": -5,
                "memory_gib": 1,
                "memory_bandwidth_tbps": 1,
                "link_bandwidth_gbps": 1,
                "tdp_watts": 1,
                "price_per_gpu_hour": 1,
            },
            "bf16_tflops",
        ),
        ("/api/v1/datacenters/", {"region": 1, "name": "dc1"}, "non_field_errors"),
        ("/api/v1/datacenters/", {"region": 1, "name": "dc7", "power_budget_kw": -1}, "power_budget_kw"),
        ("/api/v1/regions/", {"name": ""}, "name"),
        ("/api/v1/nodes/{node}/cordon/", {"reason": "x" * 500}, "reason"),
    ],
)
def test_bad_input_gets_a_400_naming_the_field_and_changes_nothing(
    small_cluster, operator_client, url, body, field
):
    from cluster.models import Region

    body = {k: (Region.objects.first().pk if k == "region" else v) for k, v in body.items()}
    if "rack" in body:
        body["rack"] = Node.objects.first().rack_id
    nodes, gpus, chips = Node.objects.count(), GPU.objects.count(), ChipType.objects.count()
    response = operator_client.post(url.format(node=Node.objects.first().pk), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert (Node.objects.count(), GPU.objects.count(), ChipType.objects.count()) == (nodes, gpus, chips)


def test_deleting_a_populated_pod_is_refused(small_cluster, operator_client):
    pod = Pod.objects.first()
    response = operator_client.delete(f"/api/v1/pods/{pod.pk}/")
    assert response.status_code == 409 and "still holds 2 racks" in response.json()["detail"]
    assert GPU.objects.count() == 76


def test_deleting_a_chip_type_in_use_is_refused(small_cluster, operator_client):
    chip = ChipType.objects.get(name="H100-SXM")
    assert operator_client.delete(f"/api/v1/chip-types/{chip.pk}/").status_code == 409


def test_the_openapi_schema_is_valid_and_complete(db, tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    paths = schema["paths"]
    for name in (
        "chip-types",
        "regions",
        "datacenters",
        "links",
        "pods",
        "racks",
        "nodes",
        "gpus",
    ):
        assert f"/api/v1/{name}/" in paths
    for action in ("cordon", "drain", "uncordon"):
        assert "post" in paths[f"/api/v1/nodes/{{id}}/{action}/"]
