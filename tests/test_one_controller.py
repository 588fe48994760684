"""One controller, two worlds: the same job and the same fault sequence, run through the live
services (database, Celery tasks) and through the what-if simulator, place the job on the same
nodes and recover it the same way, step by step."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.models import ChipType, Node
from cluster.snapshot import load_topology
from engine import policy as checkpoint_policy
from engine.checkpoint import CheckpointKind
from monitoring.faults.services import report_fault
from scheduling.cycle import run_cycle
from scheduling.models import AllocatedGPU, CheckpointPolicy, Queue, QueueQuota
from scheduling.services import submit_job
from scheduling.store import load_queues
from sim.config import SimConfig
from sim.simulation import Simulation
from sim.workload import SimJob

# (fault source, XID, the simulator's name for that cause), each on the job's first node
SEQUENCE = [
    ("xid", 13, "software"),  # restart in place
    ("xid", 79, "faulty_gpu"),  # the node goes down: a spare node of the pod replaces it
    ("heartbeat_loss", None, "host_other"),  # again: the pod's one spare is taken, so healthy GPUs
    ("xid", 13, "software"),
]


@pytest.mark.django_db
def test_the_simulator_and_the_live_services_place_and_recover_alike(
    small_cluster, eager_celery, django_capture_on_commit_callbacks
):
    policy = CheckpointPolicy.objects.create(name="async", kind="async")
    queue = Queue.objects.create(name="train", default_checkpoint_policy=policy)
    QueueQuota.objects.create(queue=queue, chip_type=ChipType.objects.get(name="H100-SXM"), nominal=64)
    topo = load_topology()  # the cluster both worlds start from

    job = submit_job(
        queue=queue, name="llm", gpus=16, chip_types=["H100-SXM"], topology="pod", parameters=7e9
    )
    run_cycle()
    sim = Simulation(
        topo,
        [SimJob(job.pk, "train", 16, 0.0, 1e7, "H100-SXM", topology="pod", parameters=7e9)],
        SimConfig(checkpoint=checkpoint_policy.CheckpointPolicy(CheckpointKind.ASYNC)),
        queues=load_queues(),
    )
    sim.arrive_and_schedule(job.pk)

    def live_nodes() -> list[str]:
        held = AllocatedGPU.objects.filter(job=job, active=True)
        return sorted(set(held.values_list("gpu__node__hostname", flat=True)))

    def sim_nodes() -> list[str]:
        held = sim.jobs[job.pk].held
        return sorted({topo.node_hostname[n] for n in np.unique(topo.gpu_node[held])})

    assert live_nodes() == sim_nodes() and len(live_nodes()) == 2
    outcomes = []
    for source, xid, cause in SEQUENCE:
        host = live_nodes()[0]
        with django_capture_on_commit_callbacks(execute=True):
            fault = report_fault(node=Node.objects.get(hostname=host), source=source, xid=xid)
        sim.inject_fault(topo.node_hostname.index(host), cause)
        fault.refresh_from_db()
        recovered = job.events.filter(kind="recovered", data__fault=fault.pk).get()
        _, sim_outcome, sim_seconds = sim.recoveries[-1]
        assert recovered.data["outcome"] == sim_outcome
        assert recovered.data["recovery_s"] == pytest.approx(sim_seconds, rel=1e-9)
        assert fault.recovery_s == pytest.approx(sim_seconds, rel=1e-9)
        assert live_nodes() == sim_nodes()
        node_state = Node.objects.get(hostname=host).state
        sim_state = "down" if sim.topo.node_state[topo.node_hostname.index(host)] else "ready"
        assert (node_state == "down") == (sim_state == "down")
        outcomes.append(sim_outcome)
    assert outcomes == ["restart_in_place", "spare", "replacement", "restart_in_place"]
