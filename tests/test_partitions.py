"""A datacenter the control plane cannot reach is one partition event, not a fault per node:
nothing new goes there, its work keeps running, nobody is requeued, and it closes when an agent
reports again. (With real agent processes: tests/test_real_nodes.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.models import Datacenter, Node, NodeCredential
from monitoring.models import FaultEvent, SitePartition
from monitoring.telemetry import ingest
from scheduling.cycle import run_cycle
from scheduling.models import AllocatedGPU, Job, Queue
from scheduling.services import submit_job
from tests.test_agent_api import _agent, _report
from tests.test_links import two_sites  # noqa: F401 - the fixture: two campuses of 32 H100s


@pytest.fixture
def agents(two_sites, monkeypatch):  # noqa: F811
    """An agent on every node of both campuses, each reported once; the control plane up an hour."""
    monkeypatch.setattr(ingest, "_UP_SINCE", timezone.now() - timedelta(hours=1))
    out = {}
    for node in Node.objects.select_related("rack__pod__datacenter").order_by("id"):
        client, credential = _agent(node)
        out[node.pk] = (node, client, credential)
    return out


def _silence(nodes, at):
    NodeCredential.objects.filter(node__in=nodes).update(last_used_at=at)


def test_a_whole_campus_silent_is_one_partition_and_no_node_faults(
    agents, settings, django_capture_on_commit_callbacks
):
    bj1, bj2 = Datacenter.objects.order_by("pk")
    queue = Queue.objects.get(name="train")
    inside = submit_job(queue=queue, gpus=16, topology="datacenter", chip_types=["H100-SXM"])
    run_cycle()
    inside.refresh_from_db()
    where = AllocatedGPU.objects.filter(job=inside, active=True).values_list(
        "gpu__node__rack__pod__datacenter", flat=True
    )
    site = Datacenter.objects.get(pk=set(where).pop())
    other = bj2 if site == bj1 else bj1
    now = timezone.now()
    timeout = timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S)
    # the site's agents fall silent within a few seconds of each other; the other site reports on
    cut = [n for n, _, _ in agents.values() if n.rack.pod.datacenter_id == site.pk]
    alive = [n for n, _, _ in agents.values() if n.rack.pod.datacenter_id == other.pk]
    for i, node in enumerate(cut):
        _silence([node], now - timedelta(seconds=i % 4))
    _silence(alive, now + timeout + timedelta(seconds=9))
    # part-way: the first silent nodes are past the timeout, the site heard nobody for half of it
    with django_capture_on_commit_callbacks(execute=True):
        early = ingest.watch(now + timeout - timedelta(seconds=1.5))
    assert early["heartbeat_lost"] == [] and early["partitions_opened"] == []
    with django_capture_on_commit_callbacks(execute=True):
        seen = ingest.watch(now + timeout + timedelta(seconds=10))
        again = ingest.watch(now + timeout + timedelta(seconds=20))
    assert seen["heartbeat_lost"] == [] and len(seen["partitions_opened"]) == 1
    assert again["partitions_opened"] == [] and again["heartbeat_lost"] == []
    partition = SitePartition.objects.get()
    assert (
        partition.datacenter == site and partition.nodes == len(cut) and partition.source == "agents_silent"
    )
    assert FaultEvent.objects.count() == 0
    inside.refresh_from_db()
    assert inside.state == "running"  # its agents keep it running: no requeue storm
    # nothing new goes to the partitioned site
    fresh = submit_job(queue=queue, gpus=16, topology="datacenter", chip_types=["H100-SXM"])
    run_cycle()
    fresh.refresh_from_db()
    sites = set(
        AllocatedGPU.objects.filter(job=fresh, active=True).values_list(
            "gpu__node__rack__pod__datacenter", flat=True
        )
    )
    assert fresh.state == "running" and sites == {other.pk}
    # one agent of the site reports again: the partition closes, the job is still held once
    _, client, _ = agents[cut[0].pk]
    _report(client, 1, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        back = ingest.watch(timezone.now() + timedelta(seconds=1))
    assert back["partitions_closed"] == [partition.pk]
    partition.refresh_from_db()
    assert partition.ended_at is not None
    assert AllocatedGPU.objects.filter(job=inside, active=True).count() == 16
    assert Job.objects.filter(state="running").count() == 2


def test_one_silent_node_among_reporting_ones_is_an_ordinary_heartbeat_loss(
    agents, settings, django_capture_on_commit_callbacks
):
    now = timezone.now()
    timeout = timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S)
    nodes = [n for n, _, _ in agents.values()]
    _silence(nodes[1:], now + timeout + timedelta(seconds=8))
    _silence(nodes[:1], now)
    with django_capture_on_commit_callbacks(execute=True):
        seen = ingest.watch(now + timeout + timedelta(seconds=10))
    assert seen["heartbeat_lost"] == [nodes[0].hostname] and seen["partitions_opened"] == []
    assert SitePartition.objects.count() == 0


def test_an_operator_declares_and_ends_a_partition_once(agents, operator_client, viewer_client):
    bj1 = Datacenter.objects.order_by("pk").first()
    first = operator_client.post(
        "/api/v1/partitions/", {"datacenter": bj1.pk, "reason": "WAN to bj1 down"}, format="json"
    )
    again = operator_client.post(
        "/api/v1/partitions/", {"datacenter": bj1.pk, "reason": "WAN to bj1 down"}, format="json"
    )
    assert first.status_code == again.status_code == 201 and first.json()["id"] == again.json()["id"]
    assert first.json()["source"] == "operator" and first.json()["nodes"] == 4
    job = submit_job(
        queue=Queue.objects.get(name="train"), gpus=32, topology="datacenter", chip_types=["H100-SXM"]
    )
    run_cycle()
    sites = set(
        AllocatedGPU.objects.filter(job=job, active=True).values_list(
            "gpu__node__rack__pod__datacenter", flat=True
        )
    )
    assert sites and bj1.pk not in sites
    assert (
        viewer_client.post(f"/api/v1/partitions/{first.json()['id']}/end/", {}, format="json").status_code
        == 403
    )
    ended = operator_client.post(
        f"/api/v1/partitions/{first.json()['id']}/end/", {"reason": "spliced"}, format="json"
    )
    assert ended.status_code == 200 and ended.json()["ended_at"] and ended.json()["ended_reason"] == "spliced"
    bad = operator_client.post("/api/v1/partitions/", {"datacenter": 999_999}, format="json")
    assert bad.status_code == 400 and "datacenter" in bad.json()
    assert SitePartition.objects.count() == 1
