"""Recovery plans: spares first, then a healthy placement, else requeue; never faulty hardware,
never a GPU another job holds."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.checkpoint import CheckpointKind
from engine.faults import classify, classify_xid
from engine.policy import CheckpointPolicy
from engine.recovery import plan_recovery
from tests.engine_helpers import gpus_of_nodes, layout_for


def _layout_with_spares():
    lay = layout_for(datacenters=1, pods_per_dc=2, racks=2, nodes_per_rack=2)  # 8 nodes, 64 GPUs
    lay.topo.node_spare[3] = True  # last node of pod 0
    lay.topo.node_spare[7] = True  # last node of pod 1
    return lay


def test_a_gpu_fault_is_recovered_from_a_spare_in_the_same_pod():
    lay = _layout_with_spares()
    job = gpus_of_nodes(lay, 0, 1, 2)
    owned = np.zeros(lay.topo.num_gpus, dtype=bool)
    owned[job] = True
    faulty = gpus_of_nodes(lay, 1)
    plan = plan_recovery(
        lay,
        job,
        faulty,
        classify_xid(79),
        owned=owned,
        policy=CheckpointPolicy(CheckpointKind.ASYNC),
        state_bytes=16 * 7e9,
    )
    assert plan.outcome == "spare"
    assert set(lay.topo.gpu_node[plan.replacement_gpus]) == {3}
    assert [s.name for s in plan.steps] == ["detect", "reschedule", "restart", "load"]
    assert plan.seconds < 120


def test_an_application_fault_restarts_in_place():
    lay = _layout_with_spares()
    job = gpus_of_nodes(lay, 0)
    owned = np.zeros(lay.topo.num_gpus, dtype=bool)
    owned[job] = True
    plan = plan_recovery(
        lay,
        job,
        job[:0],
        classify_xid(13),
        owned=owned,
        policy=CheckpointPolicy(CheckpointKind.TRIGGERED),
        triggered_ok=True,
    )
    assert plan.outcome == "restart_in_place" and plan.triggered_checkpoint is True
    assert len(plan.replacement_gpus) == 0


def test_an_application_fault_on_a_lemon_moves_the_job_off_it():
    # the same XID 13, the node's third fault in a week: the verdict takes the node out
    lay = _layout_with_spares()
    job = gpus_of_nodes(lay, 0)
    owned = np.zeros(lay.topo.num_gpus, dtype=bool)
    owned[job] = True
    plan = plan_recovery(
        lay, job, job, classify_xid(13), owned=owned, policy=CheckpointPolicy(CheckpointKind.ASYNC)
    )
    assert plan.outcome == "spare" and set(plan.lost_gpus) == set(job)
    assert not set(plan.replacement_gpus) & set(job)


def test_without_spares_a_healthy_placement_nearby_is_used_then_requeue():
    lay = layout_for(datacenters=1, pods_per_dc=1, racks=2, nodes_per_rack=2)  # 4 nodes, no spares
    job = gpus_of_nodes(lay, 0, 1)
    owned = np.zeros(lay.topo.num_gpus, dtype=bool)
    owned[job] = True
    plan = plan_recovery(lay, job, gpus_of_nodes(lay, 1), classify("heartbeat_loss"), owned=owned)
    assert plan.outcome == "replacement" and set(lay.topo.gpu_node[plan.replacement_gpus]) <= {2, 3}
    owned[:] = True  # everything else is busy
    plan = plan_recovery(lay, job, gpus_of_nodes(lay, 1), classify("heartbeat_loss"), owned=owned)
    assert plan.outcome == "requeue" and "requeued with its progress" in plan.reason


@settings(max_examples=80, deadline=None)
@given(
    job_nodes=st.sets(st.integers(0, 15), min_size=1, max_size=6),
    busy_nodes=st.sets(st.integers(0, 15), max_size=8),
    down_nodes=st.sets(st.integers(0, 15), max_size=4),
    spares=st.sets(st.integers(0, 15), max_size=4),
    fault_node=st.integers(0, 5),
    xid=st.sampled_from([13, 46, 48, 62, 79, 94, 95, 119]),
)
def test_recovery_never_lands_on_faulty_busy_or_unschedulable_gpus(
    job_nodes, busy_nodes, down_nodes, spares, fault_node, xid
):
    lay = layout_for(datacenters=2, pods_per_dc=1, racks=4, nodes_per_rack=2)  # 16 nodes
    for n in spares:
        lay.topo.node_spare[n] = True
    for n in down_nodes - job_nodes:
        lay.topo.node_state[n] = 3  # down
    job_nodes = sorted(job_nodes)
    job = gpus_of_nodes(lay, *job_nodes)
    owned = np.zeros(lay.topo.num_gpus, dtype=bool)
    owned[job] = True
    others = sorted(busy_nodes - set(job_nodes))
    if others:
        owned[gpus_of_nodes(lay, *others)] = True
    faulty = gpus_of_nodes(lay, job_nodes[fault_node % len(job_nodes)])
    plan = plan_recovery(lay, job, faulty, classify_xid(xid), owned=owned, topology="any")
    new = plan.replacement_gpus
    assert not np.isin(new, faulty).any()
    assert not owned[new].any()
    assert lay.topo.usable()[new].all()
    if plan.outcome in ("spare", "replacement"):
        assert len(new) == len(plan.lost_gpus) == len(faulty)
        assert len(np.unique(new)) == len(new)
