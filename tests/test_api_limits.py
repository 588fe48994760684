"""Hostile bodies get a 4xx that says why and change nothing: JSON nested past the limit, a
body past the size limit, NUL bytes in a name."""

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
