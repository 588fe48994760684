"""What monitoring does when the inventory changes, a job launches or a cycle runs, and the Celery
tasks behind its own signals (connected in MonitoringConfig.ready)."""

from __future__ import annotations

import time

import numpy as np
from celery import group
from django.db.models import Max, Q

from cluster.outages import best_effort
from monitoring.faults import partitions
from monitoring.models import FaultEvent
from monitoring.tasks import handle_fault_task, run_simulation_part
from monitoring.telemetry import fabric, metrics
from monitoring.telemetry.livestore import live_store
from scheduling.choices import EventKind
from scheduling.models import JobEvent, JobProcess

FABRIC_FRESH_S = 60.0


def congested_pods_now(sender, snapshot, **kwargs):
    """The pods (in the snapshot's order) a congested fabric link touches, from the newest fabric
    entry; None when there is none fresh (a minute old at most) or the live store is down."""
    entry = best_effort("reading the fabric figures", fabric.newest, live_store())
    if not entry or time.time() - entry.get("t", 0) > FABRIC_FRESH_S or not entry.get("congested_pods"):
        return None
    hot = {entry["pod_ids"][i] for i in entry["congested_pods"]}
    return np.isin(snapshot.pod_id, list(hot))


def partitioned_datacenters(sender, snapshot, **kwargs):
    """The datacenters (in the snapshot's order) with an open partition; None when there is none."""
    ids = partitions.open_datacenters()
    return np.isin(snapshot.datacenter_id, list(ids)) if ids else None


def clear_faults_of_returned_nodes(sender, nodes, action: str, at, **kwargs) -> None:
    """A repaired node comes back whole: its open faults, and its GPUs', are cleared."""
    if action == "return":
        FaultEvent.objects.filter(Q(node__in=nodes) | Q(gpu__node__in=nodes), cleared_at__isnull=True).update(
            cleared_at=at
        )


def measure_recovery(sender, job, placement, at, **kwargs) -> None:
    """The job's open fault gets its measured steps: detected, processes stopped, placed again,
    every rank running; its recovered event carries them (ETTR reads restart_s)."""
    p, now = placement, at
    fault = (
        FaultEvent.objects.filter(job=job, recovery_s__isnull=True, at__lte=p.since)
        .exclude(data__has_key="measured")
        .order_by("-at")
        .first()
    )
    if fault is None:
        return
    detected = fault.detected_at or fault.at
    stopped = (
        JobProcess.objects.filter(job=job, ended_at__gte=fault.at).exclude(generation=p.generation)
    ).aggregate(t=Max("ended_at"))["t"]
    steps = {
        "detected_s": (detected - fault.at).total_seconds(),
        "processes_stopped_s": (stopped - fault.at).total_seconds() if stopped else None,
        "placed_s": (p.since - fault.at).total_seconds(),
        "running_s": (now - fault.at).total_seconds(),
    }
    steps = {k: round(v, 3) if v is not None else None for k, v in steps.items()}
    fault.recovery_s = steps["running_s"]
    fault.data = {**fault.data, "measured": steps}
    fault.save(update_fields=["recovery_s", "data"])
    # from the fault's detection, or from the new placement when the job waited for one (ETTR
    # counts that wait as waiting, from the requeue to the admission)
    restart = (now - max(detected, p.since)).total_seconds()
    JobEvent.objects.create(
        job=job,
        kind=EventKind.RECOVERED,
        at=now,
        reason=f"running again on every node {steps['running_s']:.1f} s after {fault} (measured)",
        data={
            "fault": fault.pk,
            "measured": True,
            "steps": steps,
            "restart_s": round(restart, 3),
            "recovery_s": steps["running_s"],
        },
    )


def record_cycle(sender, seconds: float, **kwargs) -> None:
    """A scheduling cycle that ran goes into the shared duration histogram (/metrics)."""

    metrics.record_cycle(seconds)


def queue_fault(sender, fault: int, **kwargs) -> None:
    """monitoring.signals.fault_recorded: the fault task handles it on the faults workers."""
    handle_fault_task.delay(fault)


def queue_simulation_parts(sender, simulation: int, indices: list[int], **kwargs) -> None:
    """monitoring.signals.simulation_parts_wanted: one task per part, as a Celery group."""
    group(run_simulation_part.s(simulation, index) for index in indices).apply_async()
