"""One fault sequence, three worlds: the fault task (production, on the database), the cluster
simulator and the one-job ETTR model judge it the same way (engine.lifecycle.judge) and count the
same lost work, detection and restart for it.

The sequence, on one node of a running 8-GPU job with a checkpoint every 600 s since t0:
  t0 + 1000  XID 13 (the application):  restart the job in place; 400 s of work since the checkpoint
  t0 + 3000  XID 63 (a row remap):      keep running, reset the GPU when convenient
  t0 + 5000  XID 13 again:              a repeat, and the node's third fault in a week: a lemon,
                                        quarantined, and the job leaves it
"""

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from cluster.models import Node
from engine import policy as checkpoint_policy
from engine.checkpoint import CheckpointKind
from engine.physics import Physics
from monitoring.faults.services import handle_fault
from monitoring.models import FaultEvent
from scheduling.models import AllocatedGPU, Checkpoint, CheckpointPolicy, Job
from sim.config import SimConfig
from sim.reliability import _TrainingRun
from sim.simulation import Simulation
from sim.workload import SimJob
from tests.test_simulation import one_pod_type

SEQUENCE = ((1000.0, "xid", 13), (3000.0, "xid", 63), (5000.0, "xid", 13))
EVERY_600S = checkpoint_policy.CheckpointPolicy(CheckpointKind.PERIODIC, 600.0, name="every-600s")
PARAMETERS = 1e6  # a small state: checkpoints take milliseconds, so the three clocks agree
EXPECTED = [  # (action, repeated, faults in the window, lemon, what leaves service)
    ("restart_job", False, 1, False, ""),
    ("reset_when_convenient", False, 2, False, ""),
    ("restart_job", True, 3, True, "node"),
]


def _facts(v) -> tuple:
    return (v.action.value, v.repeated, v.recent, v.lemon, v.out)


@pytest.fixture
def production(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    """The sequence through the fault task; returns (verdicts, first fault's figures, node, job)."""
    stored = CheckpointPolicy.from_value(EVERY_600S)
    stored.save()
    assert CheckpointPolicy.objects.get(pk=stored.pk).value == EVERY_600S  # one value, both ways
    body = {
        "queue": "vision",
        "gpus": 8,
        "chip_types": ["H100-SXM"],
        "topology": "node",
        "parameters": PARAMETERS,
        "checkpoint_policy": "every-600s",
    }
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    t0 = timezone.now() - timedelta(hours=3)
    Job.objects.filter(pk=job.pk).update(started_at=t0)
    Checkpoint.objects.create(job=job, at=t0 + timedelta(seconds=600), progress_s=600, durable=True)
    node = Node.objects.get(gpus__allocations__job=job, gpus__allocations__active=True, gpus__index=0)
    gpu = node.gpus.get(index=0)
    verdicts, figures = [], {}
    for k, (dt, source, xid) in enumerate(SEQUENCE):
        fault = FaultEvent.objects.create(gpu=gpu, source=source, xid=xid, at=t0 + timedelta(seconds=dt))
        before = set(AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True))
        handle_fault(fault.pk)
        fault.refresh_from_db()
        v = fault.data["verdict"]
        verdicts.append((fault.action, v["repeated"], v["recent_faults"], v["lemon"], v["out"]))
        after = set(AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True))
        if k == 0:
            faulted = job.events.get(kind="faulted", data__fault=fault.pk).data
            recovered = job.events.get(kind="recovered", data__fault=fault.pk).data
            figures = {
                "lost_work": faulted["lost_s"],
                "detection": faulted["detection_s"],
                "restart": recovered["restart_s"],
                "kept_its_gpus": before == after,
            }
        if k == 2:
            figures["left_the_lemon"] = not (after & set(node.gpus.values_list("id", flat=True)))
    node.refresh_from_db()
    return verdicts, figures, node


def _simulated():
    """The sequence through the cluster simulator."""
    topo = one_pod_type(1, 1, 4, 1)
    cfg = SimConfig(checkpoint=EVERY_600S)
    spec = SimJob(1, "pretrain", 8, 0.0, 86_400.0, "H100-SXM", "node", parameters=PARAMETERS)
    sim = Simulation(topo, [spec], cfg)
    sim.arrive_and_schedule(1)
    job = sim.running[1]
    job.run_start = 0.0  # training (and the checkpoint clock) starts at t0, as in production
    node = int(topo.gpu_node[job.held[0]])
    verdicts, figures = [], {}
    for k, (dt, source, xid) in enumerate(SEQUENCE):
        sim.now = dt
        before, held = dict(job.ettr.buckets), job.held.copy()
        verdicts.append(_facts(sim.inject(node, source, xid)))
        if k == 0:
            delta = {b: job.ettr.buckets[b] - before[b] for b in before}
            figures = {
                "lost_work": delta["lost_work"],
                "detection": delta["detection"],
                "restart": delta["restart"],
                "kept_its_gpus": np.array_equal(np.sort(held), np.sort(job.held)),
            }
        if k == 2:
            figures["left_the_lemon"] = not np.isin(topo.gpu_node[job.held], [node]).any()
    return verdicts, figures, sim, node


def _modelled():
    """The sequence through the one-job ETTR model (no random faults: the rate is set to ~0)."""
    policy = EVERY_600S
    run = _TrainingRun(8, PARAMETERS, policy, 0, Physics(), 8, 1, 1e-12)
    verdicts, figures = [], {}
    for k, (dt, source, xid) in enumerate(SEQUENCE):
        run.run(dt)
        before, nodes = dict(run.buckets), list(run.in_job)
        verdicts.append(_facts(run.hit(0, source, xid)))
        if k == 0:
            delta = {b: run.buckets[b] - before[b] for b in before}
            figures = {
                "lost_work": delta["lost_work"],
                "detection": delta["detection"],
                "restart": delta["restart"],
                "kept_its_gpus": nodes == run.in_job,
            }
        if k == 2:
            figures["left_the_lemon"] = nodes[0] not in run.in_job
    return verdicts, figures, run


def test_the_three_worlds_judge_a_fault_sequence_alike(production):
    prod_verdicts, prod, node = production
    sim_verdicts, sim, simulation, sim_node = _simulated()
    model_verdicts, model, run = _modelled()
    assert prod_verdicts == sim_verdicts == model_verdicts == EXPECTED
    # the hardware: the lemon is quarantined and stays out in every world
    assert node.state == "down" and node.is_lemon
    assert sim_node in simulation.hardware.quarantined and simulation.topo.node_state[sim_node] != 0
    assert run.report.lemons_quarantined == 1
    # a job restart keeps the job where it is (the ETTR model used to swap a node for every one)
    assert prod["kept_its_gpus"] and sim["kept_its_gpus"] and model["kept_its_gpus"]
    assert (prod["left_the_lemon"], sim["left_the_lemon"], model["left_the_lemon"]) == (True, True, True)


def test_the_three_worlds_count_the_same_loss_for_a_fault(production):
    _, prod, _ = production
    _, sim, _, _ = _simulated()
    _, model, _ = _modelled()
    assert prod["lost_work"] == pytest.approx(400.0)  # since the checkpoint at t0 + 600
    for figures in (sim, model):
        for bucket in ("lost_work", "detection", "restart"):
            assert figures[bucket] == pytest.approx(prod[bucket], abs=0.01), bucket
    assert prod["detection"] == 30.0 and prod["restart"] > 0
