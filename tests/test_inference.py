"""Inference services: load profiles, the autoscaler, and training/inference co-location: at the
peak, replicas take back GPUs that training borrowed (the elastic training job shrinks); in the
valley the replicas retire and training grows back into the GPUs."""

from datetime import UTC, datetime, timedelta

import pytest

from engine.inference import LoadProfile, decide
from scheduling.inference import autoscale
from scheduling.models import Job

DAY = datetime(2026, 11, 30, tzinfo=UTC)


def at(hour, minute=0):
    return DAY + timedelta(hours=hour, minutes=minute)


def test_a_diurnal_profile_peaks_at_its_hour_and_bottoms_twelve_hours_later():
    p = LoadProfile.from_dict({"kind": "diurnal", "trough_rps": 50, "peak_rps": 350, "peak_hour": 14})
    assert p.rate(at(14).timestamp()) == pytest.approx(350)
    assert p.rate(at(2).timestamp()) == pytest.approx(50)
    assert 50 < p.rate(at(8).timestamp()) < 350


def test_a_points_profile_interpolates_and_wraps_at_midnight():
    p = LoadProfile.from_dict({"kind": "points", "points": [[6, 100], [18, 300]]})
    assert p.rate(at(12).timestamp()) == pytest.approx(200)
    assert p.rate(at(0).timestamp()) == pytest.approx(200)  # halfway from 18:00 back to 06:00


def test_a_burst_pattern_keeps_the_hourly_mean():
    flat = {"kind": "diurnal", "trough_rps": 100, "peak_rps": 100}
    bursty = LoadProfile.from_dict({**flat, "burst": "azure-conv"})
    rates = [bursty.rate(at(10, m).timestamp()) for m in range(60)]
    assert max(rates) > 2 * min(rates)  # real minute-scale bursts
    assert sum(rates) / 60 == pytest.approx(100, rel=0.01)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "diurnal"}, "load_profile.peak_rps is required"),
        ({"kind": "diurnal", "peak_rps": 10, "trough_rps": 20}, "peak_rps must be at least trough_rps"),
        ({"kind": "points", "points": [[25, 1]]}, r"load_profile.points\[0\]"),
        ({"kind": "square"}, "load_profile.kind 'square' is unknown"),
        ({"kind": "diurnal", "peak_rps": 1, "burst": "tiktok"}, "load_profile.burst 'tiktok'"),
    ],
)
def test_bad_profiles_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        LoadProfile.from_dict(data)


def test_scale_up_at_once_and_down_only_after_the_delay():
    kw = {
        "capacity_rps": 100,
        "headroom": 0.2,
        "min_replicas": 1,
        "max_replicas": 10,
        "scale_down_delay_s": 300,
    }
    up = decide(450, replicas=2, low_since=None, now=0, **kw)
    assert (up.desired, up.target) == (6, 6)  # 450 * 1.2 / 100 -> 6
    wait = decide(100, replicas=6, low_since=0, now=100, **kw)
    assert (wait.desired, wait.target) == (2, 6)
    down = decide(100, replicas=6, low_since=0, now=300, **kw)
    assert down.target == 2
    assert decide(5000, replicas=2, low_since=None, now=0, **kw).target == 10  # capped


def _replicas(service, state="running"):
    return Job.objects.filter(service=service, state=state).count()


def test_training_fills_the_valley_and_gives_way_at_the_peak(
    colocation, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    service = colocation
    capture = django_capture_on_commit_callbacks
    with capture(execute=True):
        autoscale(service.pk, at(2))  # night: one replica
    assert _replicas(service) == 1
    with capture(execute=True):
        body = {
            "queue": "training",
            "gpus": 48,
            "min_gpus": 8,
            "size_step": 8,
            "topology": "any",
            "chip_types": ["H100-SXM"],
            "model": {"preset": "llama3-8b"},
        }
        training = Job.objects.get(pk=operator_client.post("/api/v1/jobs/", body, format="json").json()["id"])
    training.refresh_from_db()
    valley = training.allocated_gpus
    assert valley == 40  # every schedulable H100 but the replica's 8 (spares are kept back)

    with capture(execute=True):
        autoscale(service.pk, at(14))  # the peak: 350 req/s needs 4 replicas
    assert _replicas(service) == 4
    training.refresh_from_db()
    assert training.state == "running" and training.allocated_gpus == 16  # shrunk, not evicted
    shrink = training.events.filter(kind="resized").latest("id")
    assert "serving reclaims" in shrink.reason

    with capture(execute=True):
        autoscale(service.pk, at(2) + timedelta(days=1))  # the load drops: wait before scaling down
    assert _replicas(service) == 4
    with capture(execute=True):
        autoscale(service.pk, at(2, 10) + timedelta(days=1))
    assert _replicas(service) == 1
    training.refresh_from_db()
    assert training.allocated_gpus == valley  # grown back into the valley
    scales = [(s.replicas_before, s.replicas_after) for s in service.scales.order_by("at")]
    assert scales == [(0, 1), (1, 4), (4, 1)]


def test_services_by_api_with_field_errors(colocation, operator_client, viewer_client):
    body = {
        "name": "code",
        "queue": "serving",
        "chip_types": ["H100-SXM"],
        "replica_gpus": 1,
        "replica_share": 250,
        "capacity_rps": 20,
        "min_replicas": 1,
        "max_replicas": 6,
        "load_profile": {"kind": "diurnal", "trough_rps": 10, "peak_rps": 80, "burst": "azure-code"},
    }
    assert viewer_client.post("/api/v1/services/", body, format="json").status_code == 403
    created = operator_client.post("/api/v1/services/", body, format="json")
    assert created.status_code == 201, created.json()
    bad = operator_client.patch(
        f"/api/v1/services/{created.json()['id']}/", {"load_profile": {"kind": "diurnal"}}, format="json"
    )
    assert bad.status_code == 400 and "peak_rps is required" in bad.json()["load_profile"][0]
    bad = operator_client.patch(
        f"/api/v1/services/{created.json()['id']}/", {"min_replicas": 9}, format="json"
    )
    assert bad.status_code == 400 and "max_replicas (6)" in bad.json()["min_replicas"][0]
    shared = operator_client.post(
        "/api/v1/services/", {**body, "name": "x", "replica_gpus": 2}, format="json"
    )
    assert shared.status_code == 400 and "replica_share" in shared.json()
    detail = viewer_client.get(f"/api/v1/services/{created.json()['id']}/").json()
    assert detail["load_profile"]["burst"] == "azure-code" and detail["max_replicas"] == 6


@pytest.mark.parametrize("policy", ["async", None])
def test_rigid_training_is_preempted_at_the_peak_after_a_checkpoint_if_its_policy_can(
    colocation, operator_client, eager_celery, django_capture_on_commit_callbacks, policy
):
    from scheduling.models import CheckpointPolicy

    service = colocation
    with django_capture_on_commit_callbacks(execute=True):
        autoscale(service.pk, at(2))
    body = {"queue": "training", "gpus": 40, "topology": "any", "chip_types": ["H100-SXM"]}
    if policy:
        CheckpointPolicy.objects.create(name="async-30", kind=policy, interval_s=1800)
        body["checkpoint_policy"] = "async-30"
    with django_capture_on_commit_callbacks(execute=True):
        training = Job.objects.get(pk=operator_client.post("/api/v1/jobs/", body, format="json").json()["id"])
    assert Job.objects.get(pk=training.pk).state == "running"
    with django_capture_on_commit_callbacks(execute=True):
        autoscale(service.pk, at(14))
    training.refresh_from_db()
    assert training.state == "pending" and training.preemptions == 1
    preempted = training.events.get(kind="preempted")
    if policy:
        assert training.events.filter(kind="checkpointed", reason="saved before preemption").exists()
        assert preempted.data["lost_s"] == 0 and training.checkpoints.filter(durable=True).count() == 1
    else:
        assert preempted.data["lost_s"] > 0 and not training.checkpoints.exists()
