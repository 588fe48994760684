"""Faults: record them, classify them, take the hardware out of service, recover the jobs they hit.

``report_fault`` records a fault and asks a worker to handle it after commit; ``handle_fault``
(the Celery task's body) runs under the scheduling lock so recovery and scheduling never race:
it classifies the fault (engine.faults), applies the node health state machine, quarantines
lemon nodes, plans each hit job's recovery (engine.recovery) and applies the plan, recording every
step as a job event with its duration.
"""

from __future__ import annotations

import zlib
from datetime import timedelta

import numpy as np
from django.db import transaction
from django.utils import timezone

from cluster.models import GPU, Node
from cluster.services import set_gpus, take_down
from cluster.snapshot import topology_cache
from engine import lifecycle
from engine.checkpoint import CheckpointKind
from engine.recovery import plan_recovery
from engine.workload import Preemption
from monitoring.models import FaultEvent
from scheduling import launch
from scheduling.apply import apply_preemptions
from scheduling.checkpoints import PHYSICS, policy_kind, policy_tier
from scheduling.choices import EventKind, JobState
from scheduling.locks import cycle_lock
from scheduling.models import Allocation, Checkpoint, Job, JobEvent
from scheduling.plans import resize_job
from scheduling.services import requeue
from scheduling.store import Held, NewAllocations, allocations
from scheduling.trigger import request_cycle

LEMON_WINDOW = timedelta(seconds=lifecycle.LEMON_WINDOW_S)


def node_fault_counts(since, node_ids=None) -> dict[int, int]:
    """Faults per node since ``since``, on the node itself or on its GPUs (two grouped queries)."""
    from django.db.models import Count

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
    from engine.faults import SOURCE_TABLE
    from monitoring.choices import FaultSource

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

        def enqueue() -> None:
            from monitoring.tasks import handle_fault_task

            handle_fault_task.delay(fault.pk)

        transaction.on_commit(enqueue)
    return fault


def _affected_gpus(fault: FaultEvent) -> tuple[list[int], Node | None]:
    if fault.gpu_id:
        return [fault.gpu_id], fault.gpu.node
    if fault.node_id:
        return list(fault.node.gpus.values_list("id", flat=True)), fault.node
    if fault.pod_id:
        return list(GPU.objects.filter(node__rack__pod=fault.pod).values_list("id", flat=True)), None
    return [], None


def _jobs_hit(fault: FaultEvent, gpu_ids: list[int]) -> list[int]:
    active = Allocation.objects.filter(active=True, job__state=JobState.RUNNING)
    if fault.link_id:
        link = fault.link
        in_a = set(active.filter(gpu__node__rack__pod__datacenter=link.a).values_list("job_id", flat=True))
        in_b = set(active.filter(gpu__node__rack__pod__datacenter=link.b).values_list("job_id", flat=True))
        return sorted(in_a & in_b)  # jobs whose traffic crosses the link
    return sorted(set(active.filter(gpu_id__in=gpu_ids).values_list("job_id", flat=True)))


def _node_history(node: Node, fault: FaultEvent) -> list[tuple[float, str, int | None]]:
    """(time, source, xid) of the node's other faults (on it or its GPUs) in the lemon window."""
    from django.db.models import Q

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


def _plan(job: Job, fault: FaultEvent, classification, faulty: np.ndarray, held: Held):
    """The job's recovery plan (engine.recovery), with whether a triggered save succeeded: a
    seeded draw per (fault, job), so replaying the same fault gives the same outcome."""
    kind, success = policy_kind(job)
    luck = np.random.default_rng(zlib.crc32(f"{fault.pk}/{job.pk}".encode())).random()
    readable = classification.memory_readable
    # on real nodes (a launched job) a save happens only when the job reports it
    modelled = kind == CheckpointKind.TRIGGERED and readable and not job.command
    triggered_ok = luck < success if modelled else None
    plan = plan_recovery(
        held.layout,
        held.gpus_of(job.pk),
        faulty,
        classification,
        owned=held.owned,
        topology=job.topology,
        policy=kind,
        triggered_ok=triggered_ok,
        state_bytes=lifecycle.checkpoint_bytes(job.parameters, PHYSICS),
        physics=PHYSICS,
        min_gpus=job.min_gpus,
        size_step=job.size_step,
        yielding=held.yielding(),
        tier=policy_tier(job),
    )
    return plan, triggered_ok


def _record_fault(job: Job, fault: FaultEvent, classification, triggered_ok: bool | None) -> None:
    """The faulted event with the work lost (engine.lifecycle.stop: a stop that saves only when
    the triggered save succeeded), and the triggered save (or its failure) when the policy has
    one: a saved one becomes the job's progress."""
    detected = fault.detected_at
    last = job.checkpoints.filter(durable=True).order_by("-at").first()
    outcome = lifecycle.stop(
        fault.at.timestamp(),
        progress_s=last.progress_s if last else job.progress_s,
        started_at=job.started_at.timestamp() if job.started_at else None,
        last_checkpoint_at=last.at.timestamp() if last else None,
        policy=CheckpointKind.TRIGGERED if triggered_ok else None,
    )
    JobEvent.objects.create(
        job=job,
        kind=EventKind.FAULTED,
        at=fault.at,
        reason=f"{fault} ({classification.description})",
        data={
            "fault": fault.pk,
            "action": classification.action.value,
            "detection_s": (detected - fault.at).total_seconds(),
            "lost_s": outcome.lost_s,
        },
    )
    if triggered_ok is None:
        return
    if triggered_ok:
        job.progress_s = outcome.progress_s
        Checkpoint.objects.create(
            job=job,
            at=detected,
            progress_s=job.progress_s,
            kind=CheckpointKind.TRIGGERED,
            durable=True,
            size_bytes=lifecycle.checkpoint_bytes(job.parameters, PHYSICS),
        )
    JobEvent.objects.create(
        job=job,
        kind=EventKind.CHECKPOINTED,
        at=detected,
        reason="triggered checkpoint saved at the fault"
        if triggered_ok
        else "triggered checkpoint failed; restoring the newest periodic checkpoint",
        data={"triggered": True, "succeeded": bool(triggered_ok)},
    )


def _take_back_spares(job: Job, plan, held: Held, now) -> None:
    """Jobs that borrowed the spares this recovery takes are preempted first (saving where their
    policy can) and requeued."""
    owners = held.owner[plan.replacement_gpus]
    victims = sorted({int(o) for o in owners if o >= 0 and o != job.pk})
    if not victims:
        return
    reason = f"its spare GPUs are taken back for the recovery of job {job.pk}"
    events = apply_preemptions([Preemption(v, job.pk, reason) for v in victims], now)
    JobEvent.objects.bulk_create(events)
    freed = np.isin(held.owner, victims)
    held.owned[freed] = False
    held.owner[freed] = -1


def _move(job: Job, plan, held: Held, now) -> None:
    """The job gives up its lost GPUs and takes its replacements (``held`` follows)."""
    snapshot = held.snapshot
    if len(plan.lost_gpus):
        allocations.release(now, job=job, gpu_ids=snapshot.gpu_id[plan.lost_gpus].tolist())
        replacements = NewAllocations()
        replacements.add(job.pk, snapshot.gpu_id[plan.replacement_gpus])
        allocations.insert(replacements, now, {job.pk: job.share})
        held.owned[plan.lost_gpus] = False
        held.owned[plan.replacement_gpus] = True
        held.owner[plan.lost_gpus] = -1
        held.owner[plan.replacement_gpus] = job.pk


def _recover(
    job: Job, fault: FaultEvent, classification, faulty: np.ndarray, held: Held, now
) -> float | None:
    """Plan and apply one job's recovery; returns the modelled time to recover (None: requeued).
    ``held`` is updated with the GPUs the job gave up and took, for the next job of the same fault."""
    job_gpus = held.gpus_of(job.pk)
    plan, triggered_ok = _plan(job, fault, classification, faulty, held)
    _record_fault(job, fault, classification, triggered_ok)
    if job.command and policy_kind(job)[0] == CheckpointKind.TRIGGERED and classification.memory_readable:
        # on real nodes a triggered save is the job's: every rank gets the checkpoint signal (the
        # healthy ones where they run on, the others before they are stopped)
        job.checkpoint_requested_at = fault.detected_at
        Job.objects.filter(pk=job.pk).update(checkpoint_requested_at=fault.detected_at)
    detected = fault.detected_at
    steps = {s.name: round(s.seconds, 3) for s in plan.steps}
    if plan.outcome == "requeue":
        allocations.release(now, job=job)
        held.owned[job_gpus] = False
        held.owner[job_gpus] = -1
        fields = requeue(job, f"requeued after a fault: {plan.reason}")
        job.save(update_fields=[*fields, "progress_s"])
        data = {"fault": fault.pk, "steps": steps, "progress_s": job.progress_s}
        JobEvent.objects.create(job=job, kind=EventKind.REQUEUED, at=detected, reason=plan.reason, data=data)
        return None
    if plan.outcome == "spare":
        _take_back_spares(job, plan, held, now)
    _move(job, plan, held, now)
    job.save(update_fields=["progress_s"])
    if plan.outcome == "shrink":
        kept = np.setdiff1d(job_gpus, plan.lost_gpus)
        job.allocated_gpus = len(job_gpus)  # the size before the fault, for the event
        reason = f"shrunk from {len(job_gpus)} to {len(kept)} GPUs after a fault"
        resize_job(job, held.snapshot, kept, at=detected, reason=reason, fault=fault.pk).save()
    if job.command:  # on real nodes the recovery is measured when every rank runs again (launch)
        return None
    JobEvent.objects.create(
        job=job,
        kind=EventKind.RECOVERED,
        at=fault.at + timedelta(seconds=plan.seconds),
        reason=plan.reason,
        data={
            "fault": fault.pk,
            "outcome": plan.outcome,
            "steps": steps,
            "restart_s": plan.seconds - steps.get("detect", 0.0),
            "recovery_s": plan.seconds,
            "degraded_s": round(plan.degraded_s, 3),  # replica groups: trained on without one
            "replaced_gpus": len(plan.replacement_gpus),
        },
    )
    return plan.seconds


def handle_fault(fault_id: int, now=None) -> dict:
    """Classify a recorded fault, take hardware out of service and recover the jobs it hit, under
    the scheduling lock. ``now``: the clock (default: the wall clock)."""
    now = now or timezone.now()
    with transaction.atomic(), cycle_lock(wait=True):
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
        recoveries = []
        hit = _jobs_hit(fault, gpu_ids) if c.interrupts_job else []
        held = Held() if hit else None
        faulty_idx = topology_cache.gpu_indices(faulty) if hit and faulty else np.array([], dtype=np.int64)
        for job in Job.objects.select_related("queue__default_checkpoint_policy", "checkpoint_policy").filter(
            pk__in=hit
        ):
            if fault.job_id is None:
                fault.job = job
            recoveries.append(_recover(job, fault, c, faulty_idx, held, now))
        done = [r for r in recoveries if r is not None]
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
            launch.changed()
    return {"fault": fault_id, "action": c.action.value, "jobs_hit": len(hit)}
