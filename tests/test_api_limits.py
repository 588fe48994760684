"""Hostile bodies get a 4xx that says why and change nothing: JSON nested past the limit, a
body past the size limit, a 100k-element list or map, NUL bytes in a name; unicode names are kept."""

import json

import pytest

from scheduling.models import Job


def _post(client, body: str):
    return client.generic("POST", "/api/v1/jobs/", body, content_type="application/json")


def test_deeply_nested_json_is_refused_with_a_reason(operator_client, queues):
    for depth in (40, 100_000):  # past the limit; past the interpreter's recursion
        response = _post(operator_client, "[" * depth + "]" * depth)
        assert response.status_code == 400
        assert "nested deeper than 32 levels" in response.json()["detail"]
    assert not Job.objects.exists()
    ordinary = {"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"]}
    assert _post(operator_client, json.dumps(ordinary)).status_code == 201


def test_a_body_past_the_size_limit_gets_413_with_the_limit(operator_client, queues, settings):
    body = json.dumps({"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"], "name": "x" * 3_000_000})
    response = _post(operator_client, body)
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"request body larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes"
    }
    assert not Job.objects.exists()


@pytest.mark.parametrize("name", ["a\u0000b", "x" * 10_000])
def test_bad_names_are_refused_by_field(operator_client, queues, name):
    response = _post(
        operator_client, json.dumps({"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"], "name": name})
    )
    assert response.status_code == 400 and "name" in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"chip_types": ["H100-SXM"] * 100_000}, "chip_types"),
        ({"env": {f"K{i}": "v" for i in range(100_000)}}, "env"),
        ({"env": {"A\u0000": "b"}}, "env"),
        ({"queue": "vis\u0000ion"}, "queue"),
        ({"gpus": 10**30}, "gpus"),
    ],
)
def test_huge_lists_and_odd_values_are_refused_by_field(operator_client, queues, extra, field):
    body = {"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"], **extra}
    response = _post(operator_client, json.dumps(body))
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not Job.objects.exists()


def test_unicode_names_are_kept_as_written(operator_client, queues):
    name = "llama-训练-🚀"
    response = _post(
        operator_client, json.dumps({"queue": "vision", "gpus": 1, "chip_types": ["H100-SXM"], "name": name})
    )
    assert response.status_code == 201
    assert operator_client.get(f"/api/v1/jobs/{response.json()['id']}/").json()["name"] == name


def test_inventory_names_refuse_nul_bytes_and_overlong_text(operator_client, small_cluster):
    from cluster.models import Region

    before = Region.objects.count()
    for name in ("we\u0000st", "x" * 1000):
        r = operator_client.post("/api/v1/regions/", {"name": name}, format="json")
        assert r.status_code == 400 and "name" in r.json(), (name, r.json())
    assert Region.objects.count() == before


def test_found_by_fuzzing_a_partial_quota_and_ids_that_are_not_ids(operator_client, queues):
    queue = queues["vision"]
    r = operator_client.patch(f"/api/v1/queues/{queue.pk}/", {"quotas": [{"nominal": 0}]}, format="json")
    assert r.status_code == 400 and "chip_type is required" in r.json()["quotas"][0]  # was a 500
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)  # a session's write to no endpoint: 404, not a CSRF 403
    for path in ("/api/v1/jobs/0.5/cancel/", "/api/v1/nodes/-2.2e-311/", "/api/v1/nothing-here/"):
        r = operator_client.post(path, {}, format="json")
        assert r.status_code == 404 and r["Content-Type"] == "application/json", path
        assert browser.post(path, {}).status_code == 404
    assert "did you mean /api/v1/jobs/" in operator_client.get("/api/v1/jobs").json()["detail"]


def test_the_api_description_lists_the_shared_refusals(anonymous_client):
    schema = anonymous_client.get("/api/schema/?format=json").json()
    create = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]
    assert {"201", "400", "401", "403", "409", "413", "429"} <= set(create)
    assert create["429"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_a_nul_byte_in_a_search_term_is_a_400_naming_the_parameter(operator_client, queues):
    response = operator_client.get("/api/v1/jobs/", {"search": "a\x00b"})
    assert response.status_code == 400
    assert "search" in response.json()
