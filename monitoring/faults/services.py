"""Faults: record them, judge them, take the hardware out of service, have the jobs they hit recovered.

``report_fault`` records a fault and asks a worker to handle it after commit; ``handle_fault``
(the Celery task's body) runs under the scheduling lock so recovery and scheduling never race:
it judges the fault (engine.lifecycle.judge: repeated, lemon, action, what leaves service),
applies the node health state machine, quarantines lemon nodes, and hands each hit job to
scheduling.recovery with plain values.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from cluster.models import GPU, Node
from cluster.services import cordon, set_gpus, take_down
from engine import lifecycle
from engine.faults import SOURCE_TABLE
from monitoring.choices import FaultSource
from monitoring.models import FaultEvent
from monitoring.signals import fault_recorded
from scheduling import recovery
from scheduling.locks import locked_transaction
from scheduling.trigger import assignments_changed, request_cycle

LEMON_WINDOW = timedelta(seconds=lifecycle.LEMON_WINDOW_S)


def node_fault_counts(since, node_ids=None) -> dict[int, int]:
    """Faults per node since ``since``, on the node itself or on its GPUs (two grouped queries)."""
    counts: dict[int, int] = {}
    sides = (
        ("node_id", {"node__isnull": False}),
        ("gpu__node_id", {"node__isnull": True, "gpu__isnull": False}),
    )
    for key, only in sides:
        qs = FaultEvent.objects.filter(at__gte=since, **only)
        if node_ids is not None:
            qs = qs.filter(**{f"{key}__in": list(node_ids)})
        for node_id, n in qs.values_list(key).annotate(n=Count("id")).order_by():
            counts[node_id] = counts.get(node_id, 0) + n
    return counts


def fault_problem(attrs: dict) -> dict | None:
    """{field: message} when a fault report is incomplete or contradictory (API and admin)."""
    targets = [k for k in ("node", "gpu", "pod", "link") if attrs.get(k) is not None]
    if not targets:
        return {"node": "name what failed: a node, a gpu, a pod or a link"}
    if len(targets) > 1:
        return {targets[1]: f"name one thing that failed, not {' and '.join(targets)}"}
    source = attrs.get("source")
    if source == FaultSource.XID and attrs.get("xid") is None:
        return {"xid": "an XID fault needs its code"}
    if source != FaultSource.XID and attrs.get("xid") is not None:
        return {"xid": f"only XID faults carry a code, not {source}"}
    if source not in SOURCE_TABLE and source != FaultSource.XID:
        return {"source": f"unknown fault source {source}"}
    return None


def report_fault(**fields) -> FaultEvent:
    """Record a fault (validated by the caller) and have it handled once the record commits."""
    fields.setdefault("at", timezone.now())
    with transaction.atomic():
        fault = FaultEvent.objects.create(**fields)

        transaction.on_commit(lambda: fault_recorded.send(sender=FaultEvent, fault=fault.pk))
    return fault


def _affected_gpus(fault: FaultEvent) -> tuple[list[int], Node | None]:
    if fault.gpu_id:
        return [fault.gpu_id], fault.gpu.node
    if fault.node_id:
        return list(fault.node.gpus.values_list("id", flat=True)), fault.node
    if fault.pod_id:
        return list(GPU.objects.filter(node__rack__pod=fault.pod).values_list("id", flat=True)), None
    return [], None


def _node_history(node: Node, fault: FaultEvent) -> list[tuple[float, str, int | None]]:
    """(time, source, xid) of the node's other faults (on it or its GPUs) in the lemon window."""
    rows = (
        FaultEvent.objects.filter(Q(node=node) | Q(gpu__node=node), at__gte=fault.at - LEMON_WINDOW)
        .exclude(pk=fault.pk)
        .values_list("at", "source", "xid")
    )
    return [(at.timestamp(), source, xid) for at, source, xid in rows]


def _take_out_of_service(fault: FaultEvent, v: lifecycle.Verdict, gpu_ids: list[int], node: Node | None, now):
    """Apply the fault verdict to the hardware (cluster.services: the node table, the GPUs'
    state and health)."""
    if v.gpu_down:
        set_gpus(gpu_ids, state="down", health="critical")
    elif v.gpu_warning:
        set_gpus(gpu_ids, health="warning")
    if node is None:
        return
    if v.lemon:
        text = f"quarantined as a lemon: {v.recent} faults in {LEMON_WINDOW.days} days"
        take_down(node, text, at=now, lemon=True)
    elif v.node_down:
        take_down(node, f"{fault}: {v.action.value.replace('_', ' ')}"[:255], at=now)
    elif v.node_cordoned:
        cordon(node, f"{fault}: {fault.description or 'cordoned'}"[:255], at=now)


def handle_fault(fault_id: int, now=None) -> dict:
    """Classify a recorded fault, take hardware out of service and recover the jobs it hit, under
    the scheduling lock. ``now``: the clock (default: the wall clock)."""
    now = now or timezone.now()
    with locked_transaction():
        fault = (
            FaultEvent.objects.select_for_update(of=("self",))
            .select_related("gpu__node", "node", "pod", "link")
            .get(pk=fault_id)
        )
        gpu_ids, node = _affected_gpus(fault)
        history = _node_history(node, fault) if node is not None else []
        v = lifecycle.judge(history, fault.at.timestamp(), fault.source, fault.xid)
        c = v.classification
        fault.action = c.action.value
        fault.cause = c.cause
        fault.description = fault.description or c.description
        if fault.detected_at is None:  # an agent's report says when it was seen; else the model
            fault.detected_at = fault.at + timedelta(seconds=c.detection_s)
        _take_out_of_service(fault, v, gpu_ids, node, now)
        if v.node_down and node is not None:
            faulty = list(node.gpus.values_list("id", flat=True))
        else:
            faulty = gpu_ids if v.out else []
        hit = []
        if c.interrupts_job:
            link = (fault.link.a_id, fault.link.b_id) if fault.link_id else None
            hit = recovery.jobs_hit(gpu_ids, link)
        stays_down = bool(fault.link_id) and fault.link.state == "down"
        facts = recovery.FaultHit(fault.pk, fault.at, fault.detected_at, str(fault), c, stays_down)
        recoveries = recovery.recover_jobs(facts, hit, faulty, now)
        if fault.job_id is None and recoveries:
            fault.job_id = recoveries[0][0]
        done = [seconds for _, seconds in recoveries if seconds is not None]
        fault.recovery_s = max(done) if done else None
        fault.data = {
            **fault.data,
            "jobs_hit": hit,
            "interrupts_job": c.interrupts_job,
            "verdict": {"repeated": v.repeated, "recent_faults": v.recent, "lemon": v.lemon, "out": v.out},
        }
        fault.save()
        if hit or faulty:
            request_cycle()
            assignments_changed()
    return {"fault": fault_id, "action": c.action.value, "jobs_hit": len(hit)}
