"""A job crossing a datacenter link when the link changes: lanes lost past the threshold move it
wholly into a datacenter that holds it now, or shrink it into one if it is elastic, when that
finishes sooner than staying; a job joining the link re-plans the jobs already on it, and the
slowdown shows in their plan events and their ETTR."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.builder import build_cluster, known_chip_names
from cluster.models import ChipType, DatacenterLink
from engine.topology_spec import parse_topology
from scheduling.cycle import run_cycle
from scheduling.ettr import job_ettr
from scheduling.models import Queue, QueueQuota
from scheduling.services import change_state, submit_job

SITES = {
    "regions": [
        {
            "name": "north",
            "datacenters": [
                {
                    "name": "bj1",
                    "pods": [{"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 4, "gpus_per_node": 8}],
                },
                {
                    "name": "bj2",
                    "pods": [{"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8}],
                },
            ],
        }
    ],
    # a thin link (8 x 10 Gb/s): losing lanes slows a job crossing it past the threshold
    "links": [{"between": ["bj1", "bj2"], "distance_km": 40, "lanes": 8, "lane_gbps": 10}],
}
MODEL = {"preset": "llama3-8b"}
MONTH = 30 * 86400.0


@pytest.fixture
def sites(db):
    build_cluster(parse_topology(SITES, known_chip_names()))
    queue = Queue.objects.create(name="train")
    QueueQuota.objects.create(queue=queue, chip_type=ChipType.objects.get(name="H100-SXM"), nominal=96)
    return DatacenterLink.objects.get()


def _submit(gpus, **kw):
    return submit_job(queue=Queue.objects.get(name="train"), gpus=gpus, model=MODEL, **kw)


def _lose_lanes(client, link, lanes, reason="wavelengths dark"):
    response = client.post(
        f"/api/v1/links/{link.pk}/lanes-lost/", {"lanes_lost": lanes, "reason": reason}, format="json"
    )
    assert response.status_code == 200, response.json()


def _spanning(**kw):
    """A 48-GPU job while a 40-GPU job holds bj1: no datacenter holds it, it spans."""
    blocker = _submit(40)
    run_cycle()
    job = _submit(48, topology="region", estimated_duration_s=MONTH, **kw)
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads, job.pending_reason
    return blocker, job


def test_lanes_lost_past_the_threshold_move_the_job_into_a_datacenter_that_now_holds_it(
    sites, operator_client
):
    blocker, job = _spanning()
    assert job.plan["slowdown"] < 0.2
    change_state(blocker.pk, "finish")  # bj1 has room for it now
    _lose_lanes(operator_client, sites, 7)
    job.refresh_from_db()
    assert job.state == "pending" and job.link_loads is None and job.allocated_gpus == 0
    moved = job.events.filter(kind="requeued").latest("id")
    assert "moved off link bj1 <-> bj2" in moved.reason and "slower across the link" in moved.reason
    assert "moves into bj1 (the move costs" in moved.reason
    assert job.events.filter(kind="planned").latest("id").data["plan"]["slowdown"] > 0.2

    run_cycle()
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads is None
    assert "bj1" in job.placement and "sites" not in job.plan


def test_a_job_no_datacenter_holds_stays_across_the_slower_link_and_says_why(sites, operator_client):
    _, job = _spanning()
    _lose_lanes(operator_client, sites, 7)
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads
    replanned = job.events.filter(kind="planned").latest("id")
    assert replanned.data["plan"]["slowdown"] > 0.2
    assert "stays, no datacenter holds it now and it cannot shrink into one" in replanned.reason


def test_an_elastic_job_shrinks_into_one_datacenter_when_the_link_slows_it(sites, operator_client):
    DatacenterLink.objects.update(lane_gbps=5)  # thinner still: one lane left costs more than shrinking
    _, job = _spanning(min_gpus=16)
    gpus = job.allocated_gpus
    _lose_lanes(operator_client, sites, 7)
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads is None
    assert 16 <= job.allocated_gpus < gpus and "sites" not in job.plan
    resized = job.events.filter(kind="resized").latest("id")
    assert "shrunk into one datacenter" in resized.reason and "shrinks to its 32 GPUs" in resized.reason
    assert job.gpus_held.filter(active=True).count() == job.allocated_gpus


def test_within_the_threshold_a_job_stays_and_is_only_re_planned(sites, operator_client):
    blocker, job = _spanning()
    change_state(blocker.pk, "finish")
    _lose_lanes(operator_client, sites, 4)  # half the lanes: slower, under 20%
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads
    assert 0 < job.events.filter(kind="planned").latest("id").data["plan"]["slowdown"] <= 0.2


def test_an_elastic_job_spans_when_that_runs_faster_than_the_size_one_datacenter_holds(sites):
    _submit(40)
    run_cycle()
    job = _submit(48, min_gpus=16, topology="region", estimated_duration_s=MONTH)
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running" and job.allocated_gpus == 48 and job.link_loads
    placed = job.events.get(kind="placed").reason
    assert "spans bj1+bj2" in placed and "x the throughput of the 32 GPUs one datacenter holds now" in placed


def test_a_job_joining_the_link_re_plans_the_one_already_on_it_and_its_ettr_shows_the_slowdown(sites):
    big, _ = _submit(40), _submit(16)  # bj1 keeps 24 free, bj2 16
    run_cycle()
    first = _submit(32, topology="region", estimated_duration_s=MONTH)
    run_cycle()
    first.refresh_from_db()
    assert first.state == "running" and first.link_loads, first.pending_reason
    room = first.plan["link_room_gbps"]
    change_state(big.pk, "finish")  # bj1 frees 40: the next 48 GPUs cross the link too
    second = _submit(48, topology="region", estimated_duration_s=MONTH)
    run_cycle()
    second.refresh_from_db()
    first.refresh_from_db()
    assert second.state == "running" and second.link_loads, second.placement
    joined = first.events.filter(kind="planned").latest("id")
    assert f"job {second.pk} joined link bj1 <-> bj2" in joined.reason
    assert first.plan["link_room_gbps"] < room and first.plan["step_s"] >= joined.data["old_plan"]["step_s"]
    # ETTR's degraded bucket: the time it ran slower, at each plan's slowdown in turn. The cycles
    # above take milliseconds, too short to read a ratio from; the log is put an hour apart.
    now = timezone.now()
    first.events.filter(id__lt=joined.id).update(at=now - timedelta(hours=2))
    first.events.filter(id__gte=joined.id).update(at=now - timedelta(hours=1))
    row = job_ettr([first])[first.pk]
    lost = sorted(p["slowdown"] / (1 + p["slowdown"]) for p in (joined.data["old_plan"], first.plan))
    assert row["degraded_s"] > 0
    assert lost[0] * 0.999 <= row["degraded_s"] / row["wall_s"] <= lost[1] * 1.001
