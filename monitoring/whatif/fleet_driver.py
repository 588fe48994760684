"""Live simulated nodes: the fleet model (sim.fleet) playing the cluster's nodes in real time.

Celery beat runs ``tick()`` every MYRIAD_FLEET_TICK_S seconds when MYRIAD_SIMULATED_FLEET is on
(``make demo`` turns it on). Simulated time runs MYRIAD_FLEET_ACCELERATE times faster than the
wall clock. Each tick:

- sets every GPU's telemetry from the work placed on it (training at its modelled plan's compute
  share of a step, or 92% without a plan; inference replicas at their service's load; idle GPUs
  cooling) and writes one compact frame to the live
  store (5 bytes per GPU, never a row per GPU);
- draws the faults due by now from the fault physics and reports them as FaultEvents, which the
  production fault task classifies and recovers, exactly as a node agent's report would be;
- repairs nodes that faults took down, after a lognormal repair time (down -> repairing -> ready);
- advances running jobs: a checkpoint every policy interval (reported as the node agent does),
  and completion when a job's estimated duration has elapsed in simulated time;
- submits the tenants' work (MYRIAD_FLEET_ARRIVALS, on by default): a seeded day of arrivals (repeated) from
  the trace-calibrated generator (sim.workload: Acme Kalos sizes, Philly run times, large
  pretraining gangs), replayed in simulated time through the same submit path as the API.
"""

from __future__ import annotations

import json
import time

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cluster.agents import agent_node_ids
from cluster.models import GPU, Node
from cluster.services import apply_node_action
from cluster.snapshot import topology_cache
from engine.checkpoint import CheckpointKind
from engine.frames import decode_frame, encode_frame
from engine.lifecycle import checkpoint_bytes
from engine.network import Network, traffic_per_gpu
from engine.states import InvalidTransition
from monitoring.faults.services import report_fault
from monitoring.telemetry import congestion, efficiency, fabric
from monitoring.telemetry.ingest import latest_reports, overlay_agents, stale_s
from monitoring.telemetry.livestore import FRAME_KEY, NETWORK_KEY, STATE_KEY, live_store
from scheduling.checkpoints import PHYSICS
from scheduling.choices import JobState
from scheduling.models import Job, Queue
from scheduling.services import SubmitError, change_states, record_checkpoint, submit_job
from scheduling.store import allocations
from sim.fabric_traffic import simulated_ports
from sim.fleet import Fleet
from sim.workload import generate

SEED = 20261130
DEFAULT_CHECKPOINT_S = 1800.0


def _fleet(snapshot, seq: int) -> Fleet:
    fleet = Fleet(snapshot, seed=SEED)  # lemon nodes stay the same tick after tick
    fleet.rng = np.random.default_rng([SEED, seq])
    return fleet


def _utilization(snapshot, fleet: Fleet) -> np.ndarray:
    util = np.zeros(snapshot.num_gpus, dtype=np.float32)
    pairs = allocations.active_pairs()
    if len(pairs):
        util[topology_cache.gpu_indices(pairs[:, 1])] = fleet.config.training_util
        # a training job with a modelled plan runs its GPUs at the plan's compute share of a step
        planned = Job.objects.filter(state=JobState.RUNNING, kind="training").exclude(plan={})
        for job_id, plan in planned.values_list("id", "plan"):
            parts = plan.get("parts") if plan.get("mixed") else [plan]
            shares = [
                p["breakdown"]["compute"] / p["step_s"]
                for p in parts
                if p.get("breakdown") and p.get("step_s")
            ]
            if shares:
                lo, hi = np.searchsorted(pairs[:, 0], [job_id, job_id + 1])
                util[topology_cache.gpu_indices(pairs[lo:hi, 1])] = float(np.clip(np.mean(shares), 0.05, 1.0))
        served = Job.objects.filter(state=JobState.RUNNING, service__isnull=False).values_list(
            "id", "service__load_rps", "service__desired_replicas", "service__capacity_rps"
        )
        for job_id, load, replicas, capacity in served:
            share = min(1.0, load / max(replicas * capacity, 1e-9)) if replicas else 0.0
            lo, hi = np.searchsorted(pairs[:, 0], [job_id, job_id + 1])
            util[topology_cache.gpu_indices(pairs[lo:hi, 1])] = 0.15 + 0.8 * share
    return util


def _network(snapshot, seq: int, sim_t: float) -> tuple[dict, list]:
    """Uplink utilization of every rack and pod from the training jobs running now, and each
    spanning job's (GPU indices, inter-node bytes/s per GPU) for its NIC ports."""
    network = Network(snapshot)
    pairs = allocations.active_pairs()
    jobs = []
    if len(pairs):
        running = Job.objects.filter(state=JobState.RUNNING, kind="training", parameters__isnull=False)
        for job_id, parameters, chip in running.values_list("id", "parameters", "chip__name"):
            lo, hi = np.searchsorted(pairs[:, 0], [job_id, job_id + 1])
            gpus = topology_cache.gpu_indices(pairs[lo:hi, 1])
            if len(gpus) > 1 and chip:
                jobs.append((gpus, *traffic_per_gpu(float(parameters), chip, len(gpus))))
    network.load(jobs)
    util = network.utilization()
    figures = {
        "seq": seq,
        "t": sim_t,
        "rack_ids": snapshot.rack_id.tolist(),
        "rack_util": np.round(util["rack"], 4).tolist(),
        "pod_ids": snapshot.pod_id.tolist(),
        "pod_util": np.round(util["pod"], 4).tolist(),
    }
    return figures, [(gpus, per_gpu) for gpus, per_gpu, _ in jobs]


def tick(now=None) -> dict:
    started = time.perf_counter()
    store = live_store()
    state = json.loads(store.get(STATE_KEY) or b"{}")
    wall = (now or timezone.now()).timestamp()
    accelerate = settings.FLEET_ACCELERATE
    seq = int(state.get("seq", 0)) + 1
    sim_t = float(state.get("sim_t", wall)) + (wall - float(state.get("wall_t", wall))) * accelerate
    snapshot = topology_cache.current()
    fleet = _fleet(snapshot, seq)
    previous = store.get(FRAME_KEY)
    if previous:
        try:
            _, _, frame = decode_frame(previous)
            if len(frame["temperature"]) == snapshot.num_gpus:
                fleet.temperature = frame["temperature"].astype(np.float32)
        except ValueError:
            pass
    fleet.step(sim_t, _utilization(snapshot, fleet))
    frame = fleet.frame()
    reports = latest_reports(agent_node_ids(), store)
    overlay_agents(frame, snapshot, store, reports)  # nodes with an agent show its readings
    efficiency.record_frame(store, previous, encode_frame(seq, sim_t, frame), frame, sim_t)
    network, traffic = _network(snapshot, seq, sim_t)
    store.put(NETWORK_KEY, json.dumps(network).encode())
    modelled = simulated_ports(snapshot, traffic, np.random.default_rng(seq))
    real = fabric.ports_from_reports(snapshot, reports, stale_s())
    congestion.follow(fabric.publish(snapshot, fabric.merge(real, modelled), "simulated", store, seq), store)
    telemetry_ms = (time.perf_counter() - started) * 1000

    faults = _faults(state, fleet, snapshot, sim_t)
    repaired = _repairs(state, fleet, sim_t, accelerate)
    checkpoints, finished = _advance_jobs(wall, accelerate)
    submitted = _arrivals(state, snapshot, sim_t) if settings.FLEET_ARRIVALS else 0
    state.update(seq=seq, sim_t=sim_t, wall_t=wall)
    store.put(STATE_KEY, json.dumps(state).encode())
    return {
        "seq": seq,
        "gpus": snapshot.num_gpus,
        "faults": faults,
        "repaired": repaired,
        "checkpoints": checkpoints,
        "finished": finished,
        "submitted": submitted,
        "telemetry_ms": round(telemetry_ms, 1),
        "tick_ms": round((time.perf_counter() - started) * 1000, 1),
    }


def _faults(state: dict, fleet: Fleet, snapshot, sim_t: float) -> int:
    in_service = snapshot.node_state == 0
    due = state.get("next_fault")
    if due is None:
        drawn = fleet.next_fault(sim_t, in_service)
        state["next_fault"] = list(drawn) if drawn else None
        return 0
    reported = 0
    real = agent_node_ids()  # nodes with an agent report their own faults
    while due is not None and due[0] <= sim_t:
        _, node_index, cause = due
        _, source, xid = fleet.physics.causes[cause]
        node = Node.objects.filter(pk=int(snapshot.node_id[node_index])).first()
        if node is not None and node.state == "ready" and node.pk not in real:
            gpu = None
            if source == "xid":  # an XID names one GPU of the node
                gpus = list(GPU.objects.filter(node=node).order_by("index"))
                gpu = gpus[int(fleet.rng.integers(len(gpus)))] if gpus else None
            report_fault(
                node=None if gpu else node,
                gpu=gpu,
                source=source,
                xid=xid,
                data={"reported_by": "simulated fleet", "cause": cause},
            )
            reported += 1
        drawn = fleet.next_fault(due[0], in_service)
        due = list(drawn) if drawn else None
    state["next_fault"] = due
    return reported


def _repairs(state: dict, fleet: Fleet, sim_t: float, accelerate: float) -> int:
    repairs = {int(k): v for k, v in state.get("repairs", {}).items()}
    out = list(Node.objects.filter(state__in=["down", "repairing"]).values_list("id", "state"))
    for node_id, _ in out:
        repairs.setdefault(node_id, sim_t + fleet.repair_s())
    repaired = 0
    for node_id, node_state in out:
        if repairs[node_id] > sim_t:
            continue
        node = Node.objects.get(pk=node_id)
        try:
            with transaction.atomic():
                if node_state == "down":
                    apply_node_action([node], "repair", actor="simulated fleet", reason="repair started")
                apply_node_action([node], "return", actor="simulated fleet", reason="repaired")
        except InvalidTransition:
            continue
        repairs.pop(node_id, None)
        repaired += 1
    still_out = {n for n, _ in out}
    state["repairs"] = {str(k): v for k, v in repairs.items() if k in still_out}
    return repaired


def _advance_jobs(wall: float, accelerate: float) -> tuple[int, int]:
    checkpoints = finished = 0
    running = (
        Job.objects.filter(state=JobState.RUNNING, started_at__isnull=False)
        .select_related("checkpoint_policy", "queue__default_checkpoint_policy")
        .only(
            "id",
            "started_at",
            "estimated_duration_s",
            "last_checkpoint_at",
            "progress_s",
            "parameters",
            "service_id",
            "checkpoint_policy__kind",
            "checkpoint_policy__interval_s",
            "queue__default_checkpoint_policy__kind",
            "queue__default_checkpoint_policy__interval_s",
        )
    )
    ended = []
    for job in running.filter(command=""):  # launched jobs end by their exit codes (scheduling.launch)
        elapsed = (wall - job.started_at.timestamp()) * accelerate
        if job.estimated_duration_s and elapsed >= job.estimated_duration_s:
            ended.append(job.pk)
            continue
        policy = job.effective_checkpoint_policy
        interval = (policy.interval_s if policy and policy.interval_s else None) or DEFAULT_CHECKPOINT_S
        last = job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else job.started_at.timestamp()
        since = (wall - last) * accelerate
        if since >= interval and job.service_id is None:
            record_checkpoint(
                job,
                step=int(job.progress_s + since),
                progress_s=job.progress_s + since,
                kind=policy.kind if policy else CheckpointKind.ASYNC,
                durable=True,
                size_bytes=checkpoint_bytes(job.parameters, PHYSICS),
            )
            checkpoints += 1
    if ended:  # all at once: thousands end together after a burst of starts
        finished = change_states(ended, "finish", actor="simulated fleet", reason="finished (simulated)")
    return checkpoints, finished


ARRIVAL_DAYS = 1.0  # one seeded day of arrivals, repeated
WARM_START_S = 6 * 3600.0  # the first tick submits the first six simulated hours: a busy cluster at once
MAX_ARRIVALS_PER_TICK = 500
# the generator's queues -> the queues `seed_queues` creates
QUEUE_NAMES = {"pretrain": "pretrain", "research": "research", "dev": "finetune"}
_workloads: dict[tuple, list] = {}


def _workload(capacity: dict[str, int]) -> list:

    key = tuple(sorted(capacity.items()))
    if key not in _workloads:
        _workloads[key] = generate(capacity, ARRIVAL_DAYS, seed=SEED, target_load=0.9, pretrain_share=0.4)
    return _workloads[key]


def _arrivals(state: dict, snapshot, sim_t: float) -> int:
    """Submit the jobs whose arrival time passed since the last tick (the day repeats)."""

    queues = {q.name: q for q in Queue.objects.filter(name__in=set(QUEUE_NAMES.values()), stopped=False)}
    if not queues:
        return 0
    capacity = {chip: n for chip, n in snapshot.count_by_chip().items() if n}
    jobs = _workload(capacity)
    horizon = ARRIVAL_DAYS * 86_400.0
    start = float(state.setdefault("arrivals_t0", sim_t - WARM_START_S))
    done = float(state.get("arrived_until", 0.0))
    now = sim_t - start
    if now <= done:
        return 0
    due = []
    for day in range(int(done // horizon), int(now // horizon) + 1):  # the day repeats
        due += [j for j in jobs if done < j.arrival + day * horizon <= now]
    submitted = 0  # a burst beyond MAX_ARRIVALS_PER_TICK (a long pause of the beat) is dropped
    for job in due[:MAX_ARRIVALS_PER_TICK]:
        queue = queues.get(QUEUE_NAMES.get(job.queue, ""))
        if queue is None:
            continue
        try:
            submit_job(
                name=f"{job.queue}-{job.id}",
                queue=queue,
                gpus=job.gpus,
                chip_types=[job.chip],
                topology=job.topology,
                priority=max(job.priority, queue.priority),
                kind=job.kind,
                estimated_duration_s=job.work_s,
                parameters=job.parameters or None,
            )
        except SubmitError:
            continue  # refused as the API would refuse it (e.g. a gang larger than any domain here)
        submitted += 1
    state["arrived_until"] = now
    return submitted
