"""Drain moves work off a node (checkpoint, then requeue; a deadline lets it finish first) and the
node shows drained when empty; spare nodes stay idle for fault recovery."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
from django.utils import timezone

from cluster.models import AuditRecord, Node
from engine.placement import Layout
from engine.states import NODE_STATE_CODE
from engine.workload import PendingJob, QueueSpec
from scheduling.cycle import run_cycle
from scheduling.models import AllocatedGPU, Allocation, CheckpointPolicy, Job
from tests.engine_helpers import cycle, layout_for, running

QUEUE = [QueueSpec("train", nominal={"H100-SXM": 64})]


def _draining(layout: Layout, node: int, deadline: float | None = None) -> Layout:
    topo = layout.topo
    state = topo.node_state.copy()
    state[node] = NODE_STATE_CODE["draining"]
    deadlines = None
    if deadline is not None:
        deadlines = np.full(topo.num_nodes, np.nan)
        deadlines[node] = deadline
    return Layout(replace(topo, node_state=state, node_drain_deadline=deadlines))


def test_engine_moves_work_off_a_draining_node_and_reports_it_drained():
    lay = _draining(layout_for(pods_per_dc=1, datacenters=1), node=0)
    on_it = running(lay, 1, "train", nodes=[0, 1], started_at=0.0, end=10_000.0)
    elsewhere = running(lay, 2, "train", nodes=[2], started_at=0.0)
    result, after = cycle(lay, QUEUE, [on_it, elsewhere], [], now=100.0)
    assert [(p.job_id, p.by_job) for p in result.preemptions] == [(1, None)]
    assert result.preemptions[0].reason == f"node {lay.topo.node_hostname[0]} is draining"
    assert result.drained == [0]
    assert {j.id for j in after} == {2}


def test_a_drain_deadline_lets_work_finish_first_then_moves_it():
    lay = _draining(layout_for(pods_per_dc=1, datacenters=1), node=0, deadline=1_000.0)
    job = running(lay, 1, "train", nodes=[0], started_at=0.0, end=5_000.0)
    before, _ = cycle(lay, QUEUE, [job], [], now=500.0)
    assert not before.preemptions and before.drained == []  # still inside its grace period
    late, _ = cycle(lay, QUEUE, [job], [], now=1_000.0)
    assert [p.job_id for p in late.preemptions] == [1]
    assert "deadline has passed" in late.preemptions[0].reason and late.drained == [0]


def test_the_quota_a_drained_job_held_is_free_in_the_same_cycle():
    lay = _draining(layout_for(pods_per_dc=1, datacenters=1), node=0)
    queue = [QueueSpec("train", nominal={"H100-SXM": 8})]
    job = running(lay, 1, "train", nodes=[0], started_at=0.0)
    waiting = PendingJob(2, "train", 8, chip_types=("H100-SXM",))
    result, _ = cycle(lay, queue, [job], [waiting], now=10.0)
    assert [a.job_id for a in result.admissions] == [2]
    assert 0 not in set(lay.gpu_node[result.admissions[0].held].tolist())  # not on the draining node


def test_new_work_never_lands_on_spare_nodes():
    doc_layout = layout_for(pods_per_dc=1, datacenters=1)
    spare = np.zeros(doc_layout.topo.num_nodes, dtype=bool)
    spare[[1, 3]] = True
    lay = Layout(replace(doc_layout.topo, node_spare=spare))
    pending = [PendingJob(i, "train", 8, chip_types=("H100-SXM",)) for i in range(1, 5)]
    result, _ = cycle(lay, QUEUE, [], pending, now=0.0)
    used = {int(n) for a in result.admissions for n in lay.gpu_node[a.held]}
    assert len(result.admissions) == 2 and used == {0, 2}
    assert all("free" in result.pending[j] or "GPUs" in result.pending[j] for j in (3, 4))


def _submit(client, capture, **body):
    with capture(execute=True):
        response = client.post(
            "/api/v1/jobs/", {"queue": "vision", "chip_types": ["H100-SXM"], **body}, format="json"
        )
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def _drain(client, capture, node: Node, **body):
    with capture(execute=True):
        response = client.post(
            f"/api/v1/nodes/{node.pk}/drain/", {"reason": "swap NIC", **body}, format="json"
        )
    assert response.status_code == 200, response.content
    return response.json()


def test_draining_a_node_checkpoints_and_requeues_its_job_and_the_node_is_drained(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    policy = CheckpointPolicy.objects.create(name="async", kind="async")
    queues["vision"].default_checkpoint_policy = policy
    queues["vision"].save()
    job = _submit(operator_client, capture, gpus=8, topology="node")
    assert job.state == "running"
    node = AllocatedGPU.objects.filter(job=job, active=True).first().gpu.node
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=10))

    body = _drain(operator_client, capture, node)
    assert body["state"] == "draining"  # the cycle the drain asked for runs after this answer
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.state == "drained" and node.drain_deadline is None
    assert not Allocation.objects.filter(node=node, active=True).exists()
    kinds = list(job.events.values_list("kind", "reason"))
    assert ("checkpointed", "saved before preemption") in kinds
    assert ("preempted", f"node {node.hostname} is draining") in kinds
    assert job.checkpoints.filter(kind="async", durable=True).exists() and job.progress_s >= 590
    # what the requeue wrote: the save's time read back as it was written, nothing of the old run
    assert job.state == "pending" and job.preemptions == 1 and job.started_at is None
    assert abs(job.last_checkpoint_at - timezone.now()) < timedelta(minutes=1)
    assert job.placement == "" and job.allocated_gpus == 0
    drained = AuditRecord.objects.get(object_type="node", object_id=node.pk, action="drained")
    assert drained.actor == "controller" and drained.changes["state"] == ["draining", "drained"]

    run_cycle()  # the requeued job starts again, elsewhere
    job.refresh_from_db()
    assert job.state == "running"
    assert not Allocation.objects.filter(job=job, active=True, node=node).exists()
    # a drained node is ready for repair
    with capture(execute=True):
        assert operator_client.post(f"/api/v1/nodes/{node.pk}/repair/", {}, format="json").status_code == 200


def test_a_drain_with_grace_lets_the_job_run_until_the_deadline(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    job = _submit(operator_client, capture, gpus=8, topology="node")
    node = AllocatedGPU.objects.filter(job=job, active=True).first().gpu.node
    body = _drain(operator_client, capture, node, grace_s=3600)
    assert body["drain_deadline"] is not None
    job.refresh_from_db()
    node.refresh_from_db()
    assert job.state == "running" and node.state == "draining"
    assert "preempted" not in set(job.events.values_list("kind", flat=True))
    run_cycle(now=timezone.now() + timedelta(hours=1, seconds=1))
    job.refresh_from_db()
    node.refresh_from_db()
    assert node.state == "drained" and job.preemptions == 1


def test_a_bad_drain_grace_is_refused_and_changes_nothing(queues, operator_client):
    node = Node.objects.first()
    response = operator_client.post(f"/api/v1/nodes/{node.pk}/drain/", {"grace_s": -5}, format="json")
    assert response.status_code == 400 and "grace_s" in response.json()
    node.refresh_from_db()
    assert node.state == "ready"


def test_spares_stay_idle_while_the_queue_has_work(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    jobs = [_submit(operator_client, capture, gpus=8, topology="node") for _ in range(8)]
    spare_nodes = set(
        Node.objects.filter(is_spare=True, chip_type__name="H100-SXM").values_list("pk", flat=True)
    )
    assert spare_nodes
    held = set(AllocatedGPU.objects.filter(active=True).values_list("gpu__node_id", flat=True))
    assert not held & spare_nodes
    waiting = [j for j in jobs if Job.objects.get(pk=j.pk).state == "pending"]
    assert len(waiting) == 2  # 64 H100 GPUs, 16 of them on spare nodes: six 8-GPU jobs run


def test_an_operator_drains_a_node_from_its_page_with_a_grace_period(queues, operator):
    from django.test import Client

    client = Client()
    client.force_login(operator)
    node = Node.objects.filter(is_spare=False).first()
    page = client.get(f"/nodes/{node.hostname}/").content.decode()
    assert 'name="grace_s"' in page and "may finish within 4 h" in page
    response = client.post(
        f"/nodes/{node.hostname}/", {"action": "drain", "reason": "swap PSU", "grace_s": "14400"}, follow=True
    )
    node.refresh_from_db()
    assert node.state == "draining" and node.drain_deadline is not None
    assert 3.9 * 3600 < (node.drain_deadline - timezone.now()).total_seconds() <= 4 * 3600
    assert "Draining: running work is checkpointed and moved at" in response.content.decode()
    assert AuditRecord.objects.filter(object_id=node.pk, action="drain", reason="swap PSU").exists()


def test_a_queue_allowed_to_borrow_spares_uses_them_only_when_nothing_else_is_free():
    base = layout_for(pods_per_dc=1, datacenters=1)  # 4 nodes of 8 GPUs
    spare = np.zeros(base.topo.num_nodes, dtype=bool)
    spare[3] = True
    lay = Layout(replace(base.topo, node_spare=spare))
    queues = [
        QueueSpec("train", nominal={"H100-SXM": 32}),
        QueueSpec("burst", nominal={"H100-SXM": 32}, may_use_spares=True),
    ]
    busy = [running(lay, 1, "train", nodes=[0, 1, 2])]
    pending = [
        PendingJob(10, "train", 8, chip_types=("H100-SXM",)),
        PendingJob(11, "burst", 8, chip_types=("H100-SXM",), submitted_at=1.0),
    ]
    result, _ = cycle(lay, queues, busy, pending, now=5.0)  # the invariant checker allows only this
    assert [(a.job_id, a.on_spares) for a in result.admissions] == [(11, True)]
    assert set(lay.gpu_node[result.admissions[0].held].tolist()) == {3}
    assert 10 in result.pending


def test_recovery_takes_back_a_borrowed_spare_preempting_its_job_first(
    queues, eager_celery, django_capture_on_commit_callbacks
):
    from cluster.models import ChipType
    from monitoring.faults.services import report_fault
    from scheduling.models import Queue, QueueQuota
    from scheduling.services import submit_job

    capture = django_capture_on_commit_callbacks
    h100 = ChipType.objects.get(name="H100-SXM")
    train = Queue.objects.create(name="train")
    burst = Queue.objects.create(name="burst", may_use_spares=True)
    for q in (train, burst):
        QueueQuota.objects.create(queue=q, chip_type=h100, nominal=64)

    def node_of(job):
        return AllocatedGPU.objects.filter(job=job, active=True).first().gpu.node

    with capture(execute=True):
        trains = [submit_job(queue=train, gpus=8, chip_types=["H100-SXM"], topology="node") for _ in range(6)]
    run_cycle()
    assert all(Job.objects.get(pk=j.pk).state == "running" for j in trains)  # the six ordinary nodes
    with capture(execute=True):
        borrower = submit_job(queue=burst, gpus=8, chip_types=["H100-SXM"], topology="node")
    run_cycle()
    borrower.refresh_from_db()
    spare_node = node_of(borrower)
    assert borrower.state == "running" and spare_node.is_spare
    assert "on spare nodes" in borrower.events.get(kind="placed").reason

    victim = next(j for j in trains if node_of(j).rack.pod_id == spare_node.rack.pod_id)
    with capture(execute=True):
        report_fault(node=node_of(victim), source="xid", xid=79)  # the node falls off the bus
    borrower.refresh_from_db()
    assert borrower.preemptions == 1  # requeued; the cycle after the fault gives it the other spare
    assert borrower.state == "running" and node_of(borrower) != spare_node and node_of(borrower).is_spare
    assert (
        "preempted",
        f"its spare GPUs are taken back for the recovery of job {victim.pk}",
    ) in set(borrower.events.values_list("kind", "reason"))
    assert node_of(victim) == spare_node
    assert victim.events.filter(kind="recovered", data__outcome="spare").exists()


def test_a_job_too_large_for_the_spares_left_does_not_keep_a_smaller_one_off_them():
    base = layout_for(pods_per_dc=1, datacenters=1)  # 4 nodes of 8 GPUs
    spare = np.zeros(base.topo.num_nodes, dtype=bool)
    spare[3] = True
    lay = Layout(replace(base.topo, node_spare=spare))
    queues = [QueueSpec("burst", nominal={"H100-SXM": 64}, may_use_spares=True)]
    busy = [running(lay, 1, "burst", nodes=[0, 1, 2]), running(lay, 2, "burst", gpus=list(range(24, 28)))]
    # four spare GPUs left: the 8-GPU job finds no room on them, the 4-GPU job after it does, and
    # the next 4-GPU job finds them taken
    pending = [
        PendingJob(10, "burst", 8, chip_types=("H100-SXM",), submitted_at=1.0),
        PendingJob(11, "burst", 4, chip_types=("H100-SXM",), submitted_at=2.0),
        PendingJob(12, "burst", 4, chip_types=("H100-SXM",), submitted_at=3.0),
    ]
    result, _ = cycle(lay, queues, busy, pending, now=5.0)
    assert [(a.job_id, a.on_spares) for a in result.admissions] == [(11, True)]
    assert {10, 12} <= set(result.pending)
