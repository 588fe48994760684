"""Live simulated nodes: each tick writes one compact telemetry frame, reports due faults through
the production fault path, repairs nodes, checkpoints and finishes jobs."""

import json
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from cluster.models import Node
from engine.frames import decode_frame
from monitoring.models import FaultEvent
from monitoring.telemetry.livestore import FRAME_KEY, STATE_KEY, live_store, reset_store
from monitoring.whatif.fleet_driver import tick
from scheduling.models import AllocatedGPU, Job


@pytest.fixture
def store(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.FLEET_ACCELERATE = 60
    reset_store()
    s = live_store()
    s.delete(FRAME_KEY)
    s.delete(STATE_KEY)
    yield s
    s.delete(FRAME_KEY)
    s.delete(STATE_KEY)
    reset_store()


@pytest.fixture
def running(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    body = {
        "queue": "vision",
        "gpus": 16,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "estimated_duration_s": 7200,
        "parameters": 7e9,
    }
    with django_capture_on_commit_callbacks(execute=True):
        job_id = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.state == "running"
    return job


def test_a_tick_writes_one_frame_that_follows_the_work(store, running, viewer_client):
    result = tick()
    assert result["gpus"] == 76
    response = viewer_client.get("/api/v1/telemetry/frame/")
    assert response.status_code == 200 and response["Content-Type"] == "application/octet-stream"
    seq, _, frame = decode_frame(response.content)
    assert seq == 1 and len(response.content) == 21 + 5 * 76  # five bytes per GPU, no rows
    from cluster.snapshot import topology_cache
    from scheduling.models import AllocatedGPU

    busy = topology_cache.gpu_indices(
        np.array(list(AllocatedGPU.objects.filter(job=running, active=True).values_list("gpu_id", flat=True)))
    )
    idle = np.setdiff1d(np.arange(76), busy)
    assert frame["util"][busy].min() > 80 and frame["util"][idle].max() == 0
    assert frame["temperature"][busy].mean() > frame["temperature"][idle].mean()
    assert viewer_client.get("/api/v1/telemetry/frame/", {"since": seq}).status_code == 204
    network = viewer_client.get("/api/v1/telemetry/network/").json()
    assert len(network["rack_util"]) == len(network["rack_ids"]) and network["seq"] == seq
    # the 16-GPU job spans two nodes of one rack (topology pod): nothing leaves its rack
    assert max(network["rack_util"]) == 0
    tick()
    assert decode_frame(store.get(FRAME_KEY))[0] == 2


def test_due_faults_go_through_the_production_fault_path_and_nodes_come_back(
    store, running, django_capture_on_commit_callbacks
):
    tick()  # draws the first fault
    state = json.loads(store.get(STATE_KEY))
    from cluster.snapshot import topology_cache

    gpu = AllocatedGPU.objects.filter(job=running, active=True).select_related("gpu__node").first().gpu
    node_index = int(np.flatnonzero(topology_cache.current().node_id == gpu.node_id)[0])
    state["next_fault"] = [state["sim_t"] - 1, node_index, "faulty_gpu"]  # XID 79: reboot the node
    store.put(STATE_KEY, json.dumps(state).encode())
    with django_capture_on_commit_callbacks(execute=True):
        result = tick()
    assert result["faults"] == 1
    fault = FaultEvent.objects.get()
    assert fault.data["reported_by"] == "simulated fleet" and fault.xid == 79
    node = Node.objects.get(pk=gpu.node_id)
    assert node.state == "down"
    running.refresh_from_db()
    assert running.state == "running" and running.events.filter(kind="recovered").exists()
    # the repair is due: the next tick brings the node back through repairing to ready
    state = json.loads(store.get(STATE_KEY))
    state["repairs"] = {str(node.pk): state["sim_t"] - 1}
    store.put(STATE_KEY, json.dumps(state).encode())
    assert tick()["repaired"] == 1
    node.refresh_from_db()
    assert node.state == "ready"


def test_jobs_checkpoint_and_finish_in_simulated_time(store, running):
    Job.objects.filter(pk=running.pk).update(started_at=timezone.now() - timedelta(seconds=40))
    result = tick()  # 40 s x 60 = 40 simulated minutes: past the 30-minute default interval
    assert result["checkpoints"] == 1
    running.refresh_from_db()
    assert running.checkpoints.count() == 1 and running.progress_s > 1800
    Job.objects.filter(pk=running.pk).update(started_at=timezone.now() - timedelta(seconds=130))
    assert tick()["finished"] == 1  # 130 s x 60 > its 2 hours
    running.refresh_from_db()
    assert running.state == "finished"


def test_a_planned_training_job_runs_at_its_modelled_utilization(
    store, queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    body = {
        "queue": "vision",
        "gpus": 16,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "model": {"preset": "llama3-70b"},
    }
    with django_capture_on_commit_callbacks(execute=True):
        job = Job.objects.get(pk=operator_client.post("/api/v1/jobs/", body, format="json").json()["id"])
    job.refresh_from_db()
    plan = job.plan
    assert job.state == "running", job.pending_reason
    share = plan["breakdown"]["compute"] / plan["step_s"]
    tick()
    _, _, frame = decode_frame(store.get(FRAME_KEY))
    from cluster.snapshot import topology_cache

    gpus = topology_cache.gpu_indices(
        np.array(list(AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True)))
    )
    assert abs(float(frame["util"][gpus].mean()) - 100 * share) < 3


def test_the_simulated_tenants_submit_a_seeded_day_of_work_through_the_submit_path(store, small_cluster):
    from django.core.management import call_command

    from monitoring.whatif.fleet_driver import ARRIVAL_DAYS, SEED, WARM_START_S
    from sim.workload import generate

    call_command("seed_queues")
    now = timezone.now()
    first = tick(now)
    jobs = generate(
        {"H100-SXM": 64, "A100-80G": 12}, ARRIVAL_DAYS, seed=SEED, target_load=0.9, pretrain_share=0.4
    )
    from scheduling.services import capacity_problem

    # the submit path refuses what no domain of this small cluster could ever hold, as the API does
    fits = {j.id for j in jobs if capacity_problem(j.gpus, [j.chip], j.topology) is None}
    assert len(fits) < len(jobs)
    jobs = [j for j in jobs if j.id in fits]
    expected = [j for j in jobs if 0 < j.arrival <= WARM_START_S]
    assert first["submitted"] == len(expected) > 0  # the warm start: the first six simulated hours
    submitted = Job.objects.order_by("id")
    assert [j.name for j in submitted] == [f"{j.queue}-{j.id}" for j in expected]
    assert {j.queue.name for j in submitted} <= {"pretrain", "research", "finetune"}
    assert all(j.events.filter(kind="submitted").exists() for j in submitted)
    # one wall minute later at 60x: the next simulated hour's arrivals, and no job twice
    second = tick(now + timedelta(seconds=60))
    later = [j for j in jobs if WARM_START_S < j.arrival <= WARM_START_S + 3600]
    assert second["submitted"] == len(later)
    assert Job.objects.count() == len(expected) + len(later)
