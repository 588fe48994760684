"""The cycle carries its cached view of the active allocations over its own changes (admissions,
preemptions, shrinks) instead of reading every row again, and never trusts it once anyone else
changed an allocation."""

import numpy as np

from scheduling import cycle
from scheduling.models import Allocation, Job
from scheduling.store import AllocationStore, allocations


def _fresh() -> np.ndarray:
    return AllocationStore().active_pairs()  # a store with nothing cached reads every row


def _carried_matches_the_database() -> bool:
    carried = allocations.cached
    return allocations.is_current() and np.array_equal(carried, _fresh())


def _post(client, capture, body):
    with capture(execute=True):
        response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def test_admissions_shrinks_and_preemptions_are_carried_exactly(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    small = _post(operator_client, capture, {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert small.state == "running"  # the first cycle had nothing running: nothing cached yet
    elastic = _post(
        operator_client,
        capture,
        {
            "queue": "vision",
            "gpus": 40,
            "min_gpus": 8,
            "size_step": 8,
            "chip_types": ["H100-SXM"],
            "topology": "any",
        },
    )
    assert _carried_matches_the_database()
    # nlp reclaims its lent quota: the elastic job shrinks (a resize released by the cycle itself)
    claimer = _post(
        operator_client,
        capture,
        {"queue": "nlp", "gpus": 24, "chip_types": ["H100-SXM"], "topology": "any", "priority": 5},
    )
    elastic.refresh_from_db()
    assert claimer.state == "running" and elastic.events.filter(kind="resized").exists()
    assert _carried_matches_the_database()


def test_a_release_by_anyone_else_makes_the_next_cycle_read_everything(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _post(operator_client, capture, {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"]})
    other = _post(operator_client, capture, {"queue": "nlp", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert _carried_matches_the_database()
    # released outside any cycle (as a node agent's report or an operator would)
    Allocation.objects.filter(job=other, active=True).update(active=False)
    stale = allocations.cached
    assert len(stale) == 24 and len(allocations.active_pairs()) == 16  # the key no longer matches
    assert set(allocations.active_pairs()[:, 0].tolist()) == {job.pk}


def test_a_preemption_is_carried_exactly(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    _post(
        operator_client,
        capture,
        {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    borrower = _post(
        operator_client,
        capture,
        {"queue": "vision", "gpus": 32, "chip_types": ["H100-SXM"], "topology": "any"},
    )
    assert borrower.state == "running" and _carried_matches_the_database()
    claimer = _post(
        operator_client, capture, {"queue": "nlp", "gpus": 16, "chip_types": ["H100-SXM"], "topology": "any"}
    )  # 8 free GPUs and vision's borrowed 8 go back (its 32 within nominal stay)
    assert claimer.state == "running" and Job.objects.filter(preemptions=1).exists()
    assert _carried_matches_the_database()


def test_a_release_during_a_cycle_is_not_hidden_by_the_carried_view(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks, monkeypatch
):
    """Another writer releases allocations after the cycle read them and before it commits: the
    carried view is kept under the key it implies, and the next read sees the database's."""
    capture = django_capture_on_commit_callbacks
    first = _post(operator_client, capture, {"queue": "vision", "gpus": 8, "chip_types": ["H100-SXM"]})
    assert _carried_matches_the_database()
    original = cycle.apply_decisions

    def apply_then_someone_releases(*args, **kwargs):
        gpus = original(*args, **kwargs)
        Allocation.objects.filter(job=first, active=True).update(active=False)  # mid-cycle
        return gpus

    monkeypatch.setattr(cycle, "apply_decisions", apply_then_someone_releases)
    second = _post(operator_client, capture, {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"]})
    assert second.state == "running"
    monkeypatch.undo()
    assert not _carried_matches_the_database()  # the carried pairs still hold the first job
    read = allocations.active_pairs()
    assert set(read[:, 0].tolist()) == {second.pk} and len(read) == 16
    assert _carried_matches_the_database()  # the read replaced them
