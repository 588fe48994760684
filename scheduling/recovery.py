"""Job recovery after a fault: plan each hit job's recovery (engine.recovery) and apply it: the
work lost, a triggered save, spares taken back from jobs that borrowed them, the GPUs the job gives
up and takes, a shrink or a requeue, every step a job event with its duration.

Monitoring records the fault and judges it (engine.lifecycle.judge); it hands recovery plain
values (``FaultHit``: the fault's id, times, label and classification, and the GPUs that left
service), under the scheduling lock it already holds.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import numpy as np

from cluster.snapshot import topology_cache
from engine import lifecycle, tiers
from engine.checkpoint import CheckpointKind
from engine.faults import Classification
from engine.recovery import plan_recovery
from engine.workload import Preemption
from scheduling.apply import apply_preemptions
from scheduling.checkpoints import PHYSICS, job_policy
from scheduling.choices import EventKind, JobState
from scheduling.models import AllocatedGPU, Allocation, Job, JobEvent
from scheduling.plans import resize_job
from scheduling.services import durable_checkpoint, requeue
from scheduling.store import Holdings, NewAllocations, allocations


@dataclass(frozen=True)
class FaultHit:
    """What recovery reads of a fault: its id (for events), when it happened and was detected,
    how it reads in an event, and its classification (engine.faults)."""

    id: int
    at: datetime
    detected_at: datetime
    label: str
    classification: Classification
    link_stays_down: bool = False  # a datacenter link that is down: the jobs crossing it cannot restart there


def jobs_hit(gpu_ids: list[int], link_ends: tuple[int, int] | None = None) -> list[int]:
    """Running jobs on any of these GPUs, or (``link_ends``: two datacenters' ids) whose traffic
    crosses the link between them."""
    active = Allocation.objects.filter(active=True, job__state=JobState.RUNNING)
    if link_ends is not None:
        a, b = link_ends
        in_a = set(active.filter(node__rack__pod__datacenter_id=a).values_list("job_id", flat=True))
        in_b = set(active.filter(node__rack__pod__datacenter_id=b).values_list("job_id", flat=True))
        return sorted(in_a & in_b)
    held = AllocatedGPU.objects.filter(active=True, job__state=JobState.RUNNING, gpu_id__in=gpu_ids)
    return sorted(set(held.values_list("job_id", flat=True)))


def recover_jobs(
    hit: FaultHit, job_ids: list[int], faulty_gpu_ids: list[int], now
) -> list[tuple[int, float | None]]:
    """Recover every hit job in id order; (job id, modelled seconds to recover: None when the job
    was requeued or runs on real nodes, where launch measures it) for each. The caller holds the
    scheduling lock inside a transaction."""
    if not job_ids:
        return []
    holdings = Holdings()
    faulty = topology_cache.gpu_indices(faulty_gpu_ids) if faulty_gpu_ids else np.array([], dtype=np.int64)
    jobs = Job.objects.select_related("queue__default_checkpoint_policy", "checkpoint_policy").filter(
        pk__in=job_ids
    )
    return [(job.pk, _recover(job, hit, faulty, holdings, now)) for job in jobs]


def _plan(job: Job, hit: FaultHit, faulty: np.ndarray, holdings: Holdings):
    """The job's recovery plan (engine.recovery), with whether a triggered save succeeded: a
    seeded draw per (fault, job), so replaying the same fault gives the same outcome."""
    policy = job_policy(job)
    luck = np.random.default_rng(zlib.crc32(f"{hit.id}/{job.pk}".encode())).random()
    # on real nodes (a launched job) a save happens only when the job reports it
    modelled = policy.triggered and hit.classification.memory_readable and not job.command
    triggered_ok = luck < policy.triggered_success if modelled else None
    plan = plan_recovery(
        holdings.layout,
        holdings.gpus_of(job.pk),
        faulty,
        hit.classification,
        owned=holdings.owned,
        topology=job.topology,
        policy=policy,
        triggered_ok=triggered_ok,
        state_bytes=lifecycle.checkpoint_bytes(job.parameters, PHYSICS),
        physics=PHYSICS,
        min_gpus=job.min_gpus,
        size_step=job.size_step,
        yielding=holdings.yielding(),
        step_s=tiers.step_seconds(job.parameters or 0.0, job.gpus),
    )
    return plan, triggered_ok


def _record_fault(job: Job, hit: FaultHit, triggered_ok: bool | None) -> None:
    """The faulted event with the work lost (engine.lifecycle.stop: a stop that saves only when
    the triggered save succeeded), and the triggered save (or its failure) when the policy has
    one: a saved one becomes the job's progress."""
    classification = hit.classification
    detected = hit.detected_at
    last = job.checkpoints.filter(durable=True).order_by("-at").first()
    outcome = lifecycle.stop(
        hit.at.timestamp(),
        progress_s=last.progress_s if last else job.progress_s,
        started_at=job.started_at.timestamp() if job.started_at else None,
        last_checkpoint_at=last.at.timestamp() if last else None,
        policy=CheckpointKind.TRIGGERED if triggered_ok else None,
    )
    JobEvent.objects.create(
        job=job,
        kind=EventKind.FAULTED,
        at=hit.at,
        reason=f"{hit.label} ({classification.description})",
        data={
            "fault": hit.id,
            "action": classification.action.value,
            "detection_s": (detected - hit.at).total_seconds(),
            "lost_s": outcome.lost_s,
        },
    )
    if triggered_ok is None:
        return
    if triggered_ok:
        job.progress_s = outcome.progress_s
        durable_checkpoint(job, detected, CheckpointKind.TRIGGERED).save()
    JobEvent.objects.create(
        job=job,
        kind=EventKind.CHECKPOINTED,
        at=detected,
        reason="triggered checkpoint saved at the fault"
        if triggered_ok
        else "triggered checkpoint failed; restoring the newest periodic checkpoint",
        data={"triggered": True, "succeeded": bool(triggered_ok)},
    )


def _take_back_spares(job: Job, plan, holdings: Holdings, now) -> None:
    """Jobs that borrowed the spares this recovery takes are preempted first (saving where their
    policy can) and requeued."""
    owners = holdings.owner[plan.replacement_gpus]
    victims = sorted({int(o) for o in owners if o >= 0 and o != job.pk})
    if not victims:
        return
    reason = f"its spare GPUs are taken back for the recovery of job {job.pk}"
    events = apply_preemptions([Preemption(v, job.pk, reason) for v in victims], now)
    JobEvent.objects.bulk_create(events)
    freed = np.isin(holdings.owner, victims)
    holdings.owned[freed] = False
    holdings.owner[freed] = -1


def _move(job: Job, plan, holdings: Holdings, now) -> None:
    """The job gives up its lost GPUs and takes its replacements (``holdings`` follows)."""
    snapshot = holdings.snapshot
    if len(plan.lost_gpus):
        allocations.release(now, job=job, gpu_ids=snapshot.gpu_id[plan.lost_gpus].tolist())
        replacements = NewAllocations()
        replacements.add(job.pk, snapshot.gpu_id[plan.replacement_gpus])
        allocations.insert(replacements, now, {job.pk: job.share})
        holdings.owned[plan.lost_gpus] = False
        holdings.owned[plan.replacement_gpus] = True
        holdings.owner[plan.lost_gpus] = -1
        holdings.owner[plan.replacement_gpus] = job.pk


def _recover(job: Job, hit: FaultHit, faulty: np.ndarray, holdings: Holdings, now) -> float | None:
    """Plan and apply one job's recovery; returns the modelled time to recover (None: requeued).
    ``holdings`` is updated with the GPUs the job gave up and took, for the next job of the same fault."""
    job_gpus = holdings.gpus_of(job.pk)
    plan, triggered_ok = _plan(job, hit, faulty, holdings)
    if hit.link_stays_down and plan.outcome != "none":
        why = (
            "its datacenter link is down: it runs again in one datacenter, or across the link when it is back"
        )
        plan = replace(plan, outcome="requeue", reason=why)
    _record_fault(job, hit, triggered_ok)
    if job.command and job_policy(job).triggered and hit.classification.memory_readable:
        # on real nodes a triggered save is the job's: every rank gets the checkpoint signal (the
        # healthy ones where they run on, the others before they are stopped)
        job.checkpoint_requested_at = hit.detected_at
        Job.objects.filter(pk=job.pk).update(checkpoint_requested_at=hit.detected_at)
    detected = hit.detected_at
    steps = {s.name: round(s.seconds, 3) for s in plan.steps}
    if plan.outcome == "requeue":
        allocations.release(now, job=job)
        holdings.owned[job_gpus] = False
        holdings.owner[job_gpus] = -1
        fields = requeue(job, f"requeued after a fault: {plan.reason}")
        job.save(update_fields=[*fields, "progress_s"])
        data = {"fault": hit.id, "steps": steps, "progress_s": job.progress_s}
        JobEvent.objects.create(job=job, kind=EventKind.REQUEUED, at=detected, reason=plan.reason, data=data)
        return None
    if plan.outcome == "spare":
        _take_back_spares(job, plan, holdings, now)
    _move(job, plan, holdings, now)
    job.save(update_fields=["progress_s"])
    if plan.outcome == "shrink":
        kept = np.setdiff1d(job_gpus, plan.lost_gpus)
        job.allocated_gpus = len(job_gpus)  # the size before the fault, for the event
        reason = f"shrunk from {len(job_gpus)} to {len(kept)} GPUs after a fault"
        resize_job(job, holdings.snapshot, kept, at=detected, reason=reason, fault=hit.id).save()
    if job.command:  # on real nodes the recovery is measured when every rank runs again (launch)
        return None
    JobEvent.objects.create(
        job=job,
        kind=EventKind.RECOVERED,
        at=hit.at + timedelta(seconds=plan.seconds),
        reason=plan.reason,
        data={
            "fault": hit.id,
            "outcome": plan.outcome,
            "steps": steps,
            "restart_s": plan.seconds - steps.get("detect", 0.0),
            "recovery_s": plan.seconds,
            "degraded_s": round(plan.degraded_s, 3),  # replica groups: trained on without one
            "replaced_gpus": len(plan.replacement_gpus),
        },
    )
    return plan.seconds
