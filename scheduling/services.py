"""Job lifecycle: submit, cancel, suspend, resume, finish. Each change is one transaction with
its event; GPUs are released in the same transaction, and a cycle is asked for after commit."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from cluster.audit import changes, record
from cluster.snapshot import topology_cache
from engine import lifecycle
from engine.checkpoint import CheckpointKind
from engine.lifecycle import JobStateError, job_action_target
from engine.placement import LEVELS, level_limit
from engine.steptime import ModelSpec
from scheduling.allocation_models import GPU_COUNT
from scheduling.bulk import insert_with_child, update_rows
from scheduling.checkpoints import PHYSICS
from scheduling.choices import EventKind, JobState
from scheduling.models import QUEUE_SETTINGS, Allocation, Checkpoint, Job, JobEvent, Queue
from scheduling.plans import ranking_for
from scheduling.store import allocations
from scheduling.trigger import assignments_changed, request_cycle

__all__ = ["JobStateError", "change_state", "record_checkpoint", "requeue", "stop_job", "submit_job"]


# a job's reason until a cycle decides about it (a submit, a requeue, a release from hold)
AWAITING_CYCLE = "waiting for the next scheduling cycle"


def capacity_problem(
    gpus: int, chip_types: list[str], topology: str, mixed: bool = False
) -> tuple[str, str] | None:
    """(field, message) when no domain of the cluster could ever hold the job, whatever runs."""
    snap = topology_cache.structure()
    names = list(snap.chip_names)
    wanted = tuple(names.index(c) for c in chip_types) if chip_types else tuple(range(len(names)))
    level = LEVELS[level_limit(topology)]
    best_total, best_domain = topology_cache.capacity(wanted, level, combined=mixed)
    label = ", ".join(chip_types) if chip_types else "any chip type"
    if gpus > best_total:
        return (
            "gpus",
            f"the cluster has only {best_total} GPUs of {label} (spares kept aside); {gpus} requested",
        )
    if gpus > best_domain:
        return (
            "topology",
            f"no {topology} can ever hold {gpus} GPUs of {label}: the largest has {best_domain}; "
            f"allow a larger domain",
        )
    return None


def model_of_fields(model: dict) -> ModelSpec:
    return ModelSpec.from_dict(model)


class SubmitError(ValueError):
    """A job that cannot be submitted as asked; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def submit_problem(fields: dict) -> tuple[str, str] | None:
    """(field, message) when a job's fields break a shape rule (engine.lifecycle.shape_problem) or
    no domain of the cluster could ever hold it; None when it may be submitted. Sets the queue's
    priority as the job's when it names none."""
    gpus, low = fields["gpus"], fields.get("min_gpus")
    problem = lifecycle.shape_problem(
        gpus,
        min_gpus=low,
        size_step=fields.get("size_step", 1),
        share=fields.get("share", 1000),
        mixed=fields.get("mixed_chips", False),
        chip_types=fields.get("chip_types") or (),
    )
    if problem is None:
        problem = capacity_problem(
            low if low is not None else gpus,
            list(fields.get("chip_types") or []),
            fields.get("topology", "datacenter"),
            fields.get("mixed_chips", False),
        )
    if problem is None and fields.get("priority") is None:
        fields["priority"] = fields["queue"].priority
    return problem


def new_job(now=None, **fields) -> Job:
    """The unsaved pending job that a submit of ``fields`` writes, after the checks every submit
    path makes (a bad field raises SubmitError): its model's parameters, and its chip types
    ranked by modelled cost-performance."""
    problem = submit_problem(fields)
    if problem:
        raise SubmitError(*problem)
    model = fields.get("model")
    if model:
        spec = model_of_fields(model)
        fields["model"] = spec.as_dict()
        if not fields.get("parameters"):
            fields["parameters"] = spec.params
        chips = list(fields.get("chip_types") or [])
        if len(chips) > 1:
            # the platform picks the chip type with the best modelled cost-performance first
            ranking = ranking_for(fields["model"], fields["gpus"], chips)
            fields["chip_ranking"] = ranking
            fields["chip_types"] = [r["chip"] for r in ranking if r["feasible"]] or chips
    return Job(
        state=JobState.PENDING,
        submitted_at=now or timezone.now(),
        pending_reason=AWAITING_CYCLE,
        **fields,
    )


def submitted_event(job: Job, reason: str, **data) -> JobEvent:
    """The (unsaved) event of a job's submit."""
    return JobEvent(
        kind=EventKind.SUBMITTED,
        at=job.submitted_at,
        reason=reason,
        data={
            "gpus": job.gpus,
            "min_gpus": job.min_gpus,
            "chip_types": job.chip_types,
            "topology": job.topology,
            **({"chip_ranking": job.chip_ranking} if job.chip_ranking else {}),
            **data,
        },
    )


def submit_job(*, now=None, **fields) -> Job:
    """Submit a job: every caller (API, autoscaler, simulated fleet, management commands) goes
    through the same checks; a bad field raises SubmitError and writes nothing. ``now``: the
    clock (default: the wall clock)."""
    job = new_job(now, **fields)
    # The submit path is hot (pipelines submit thousands of jobs): the job and its submitted event
    # are written by statements built once (one statement on PostgreSQL), not by the ORM anew.
    event = submitted_event(job, f"submitted to queue {job.queue.name}")
    insert_with_child(job, event, "job")  # both rows or neither
    # a job just written has no forecast yet (the forecast plays pending jobs later): the answer
    # to the submit reads none without asking the database
    Job.forecast.related.set_cached_value(job, None)
    request_cycle()
    return job


# the fields a requeue changes, for bulk updates
REQUEUE_FIELDS = [
    "state",
    "started_at",
    "placement",
    "pending_reason",
    "pending_kind",
    "allocated_gpus",
    "link_loads",
]


def requeue(job: Job, reason: str) -> list[str]:
    """A running job goes back to pending with its progress (after a preemption, a drain or a
    fault); returns the fields changed. The caller releases its GPUs and writes its events."""
    job.state = job_action_target("requeue", job.state)
    job.started_at, job.placement, job.allocated_gpus = None, "", 0
    job.link_loads = None  # it gives back its share of the datacenter links it crossed
    job.pending_reason = reason[:2000]
    job.pending_kind = ""  # until the next cycle says what it waits for
    return REQUEUE_FIELDS


def stop_job(job: Job, now, kind: CheckpointKind | None, *, graceful: bool = True):
    """Stop a running job's work (engine.lifecycle.stop): its progress and newest checkpoint are
    updated on ``job``; returns the outcome and the unsaved Checkpoint row written at the stop
    (None when nothing was saved)."""
    outcome = lifecycle.stop(
        now.timestamp(),
        progress_s=job.progress_s,
        started_at=job.started_at.timestamp() if job.started_at else None,
        last_checkpoint_at=job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else None,
        policy=kind,
        graceful=graceful,
    )
    if not outcome.saved:
        return outcome, None
    job.progress_s, job.last_checkpoint_at = outcome.progress_s, now
    return outcome, durable_checkpoint(job, now, kind)


def durable_checkpoint(job: Job, at, kind) -> Checkpoint:
    """The (unsaved) row of a whole durable checkpoint of ``job`` at ``at``, at its progress now."""
    size = lifecycle.checkpoint_bytes(job.parameters, PHYSICS)
    return Checkpoint(job=job, at=at, progress_s=job.progress_s, kind=kind, durable=True, size_bytes=size)


# a job action -> the event it writes
ACTION_EVENTS = {
    "cancel": EventKind.CANCELLED,
    "suspend": EventKind.SUSPENDED,
    "resume": EventKind.RESUMED,
    "finish": EventKind.FINISHED,
    "fail": EventKind.FAILED,
}


def reason_after(state: str, actor: str = "") -> str:
    """A job's pending reason once an action has moved it to ``state``."""
    if state == JobState.SUSPENDED:
        return f"suspended by {actor}" if actor else "suspended"
    return AWAITING_CYCLE if state == JobState.PENDING else ""


@transaction.atomic
def change_state(job_id: int, action: str, *, actor: str = "", reason: str = "", now=None) -> Job:
    """An operator's or a node's action on a job (engine.lifecycle.JOB_ACTIONS), with its event;
    the job's GPUs are released in the same transaction. ``now``: the clock (default: wall)."""
    if not change_states([job_id], action, actor=actor, reason=reason, now=now):
        raise Job.DoesNotExist(f"no job {job_id}")
    return Job.objects.get(pk=job_id)


CHANGE_CHUNK = 5000  # job ids per IN (...) list


@transaction.atomic
def change_states(
    job_ids, action: str, *, actor: str = "", reason: str = "", now=None, data: dict | None = None
) -> int:
    """``action`` on every job of ``job_ids`` at once, each as an operator's or a node's action on
    one job: its new state (engine.lifecycle.JOB_ACTIONS; a job it does not apply to raises
    JobStateError and nothing changes), its GPUs released, its event (with ``data``). A statement or
    two per few thousand jobs, never one per job: 7,834 jobs of the simulated fleet ending in one
    tick took 24 s one at a time. Returns how many jobs there were."""
    now = now or timezone.now()
    text = reason or f"{action} by {actor}" if actor else reason
    ids = sorted(set(job_ids))
    rows, freed = [], {}
    for i in range(0, len(ids), CHANGE_CHUNK):
        chunk = ids[i : i + CHANGE_CHUNK]
        rows += (
            Job.objects.select_for_update()
            .filter(pk__in=chunk)
            .values_list("id", "state", "started_at", "command")
        )
        held = Allocation.objects.filter(job_id__in=chunk, active=True)
        freed.update(held.values_list("job_id").annotate(n=Sum(GPU_COUNT)).order_by())
        allocations.release(now, jobs=chunk)
    updates, events = [], []
    for job_id, state, started_at, _ in rows:
        target = job_action_target(action, state)
        ended = now if target in (JobState.CANCELLED, JobState.FINISHED, JobState.FAILED) else None
        started = started_at if action in ("finish", "fail") else None
        updates.append((job_id, target, reason_after(target, actor), "", ended, started, 0))
        released = {"gpus_released": freed.get(job_id, 0), **({"by": actor} if actor else {})}
        events.append(
            JobEvent(
                job_id=job_id,
                kind=ACTION_EVENTS[action],
                at=now,
                reason=text or action,
                data={**(data or {}), **released},
            )
        )
    fields = ["state", "pending_reason", "pending_kind", "finished_at", "started_at", "allocated_gpus"]
    update_rows(Job, fields, updates)
    JobEvent.objects.bulk_create(events, batch_size=CHANGE_CHUNK)
    if freed or action == "resume":
        request_cycle()
    if any(command and job_id in freed for job_id, *_, command in rows):
        assignments_changed()  # their agents stop them
    return len(rows)


@transaction.atomic
@transaction.atomic
def record_checkpoint(job: Job, **fields) -> Checkpoint:
    """A checkpoint reported by the job's nodes: its progress becomes the job's saved progress.
    The same report twice (a retry, a replay) records nothing new and returns the first; a report
    older than the job's saved progress (out of order) is kept but never moves progress back."""
    Job.objects.select_for_update().filter(pk=job.pk).values("pk").first()  # one report at a time
    same = Checkpoint.objects.filter(
        job=job,
        step=fields.get("step", 0),
        progress_s=fields["progress_s"],
        durable=fields.get("durable", True),
    ).first()
    if same is not None:
        same.duplicate = True
        return same
    fields.setdefault("at", timezone.now())
    checkpoint = Checkpoint.objects.create(job=job, **fields)
    checkpoint.duplicate = False
    if checkpoint.durable:
        Job.objects.filter(pk=job.pk, progress_s__lte=checkpoint.progress_s).update(
            progress_s=checkpoint.progress_s, last_checkpoint_at=checkpoint.at
        )
    JobEvent.objects.create(
        job=job,
        kind=EventKind.CHECKPOINTED,
        at=checkpoint.at,
        reason=f"{checkpoint.kind} checkpoint at step {checkpoint.step}"
        + ("" if checkpoint.durable else " (in memory)"),
        data={
            "step": checkpoint.step,
            "progress_s": checkpoint.progress_s,
            "stall_s": checkpoint.stall_s,
            "durable": checkpoint.durable,
        },
    )
    return checkpoint


POLICY_AUDITED = (
    "name",
    "description",
    "kind",
    "interval_s",
    "triggered_success",
    "recovery_tier",
    "replica_groups",
    "cordon_stragglers",
    "ettr_goal",
)


def queue_audit_state(queue: Queue) -> dict:
    """What an audit record of a queue compares: its settings and each chip type's quota."""
    state = {f: getattr(queue, f) for f in QUEUE_SETTINGS}
    for q in queue.quotas.select_related("chip_type"):
        for f in ("nominal", "borrowing_limit", "lending_limit"):
            state[f"{q.chip_type.name}.{f}"] = getattr(q, f)
    return state


def policy_audit_state(policy) -> dict:
    return {f: getattr(policy, f) for f in POLICY_AUDITED} if policy else {}


def lock_referenced(serializer, fields: tuple[str, ...]) -> None:
    """Lock the rows a write is about to point at (a cohort, a checkpoint policy): a concurrent
    delete of one then either waits for this transaction (and finds what now points at it) or
    committed before, and the row deleted since the serializer validated it is a 400 naming the
    field, with nothing written (without the lock, the database refused the commit: a 500)."""
    for field in fields:
        target = serializer.validated_data.get(field)
        if target is not None and not _locked(target):
            raise ValidationError({field: [f"{target} was deleted while this request ran"]})


@transaction.atomic
def delete_locked(instance) -> None:
    """Delete ``instance`` after locking its row, so that the rows pointing at it are found after
    any write setting them (lock_referenced) has committed."""
    _locked(instance)
    instance.delete()


def _locked(row) -> bool:
    """Lock ``row`` for this transaction (SELECT ... FOR UPDATE); False when it no longer exists."""
    return bool(list(type(row).objects.select_for_update().filter(pk=row.pk).values_list("pk", flat=True)))


@transaction.atomic
def save_queue(serializer, *, actor, reason: str = "") -> Queue:
    """Create or change a queue through its (validated) serializer, with its audit record; a cycle
    is asked for after the commit, since new quotas or policies may admit or preempt."""
    lock_referenced(serializer, ("cohort", "default_checkpoint_policy"))
    creating = serializer.instance is None
    before = {} if creating else queue_audit_state(serializer.instance)
    queue = serializer.save()
    diff = changes(before, queue_audit_state(queue))
    if diff:
        record(actor, "create" if creating else "update", "queue", queue, diff, reason)
    request_cycle()
    return queue


@transaction.atomic
def set_queue_stopped(queue: Queue, stopped: bool, *, actor, reason: str = "") -> Queue:
    """Stop a queue (it admits nothing; running work keeps running) or resume it, audited."""
    if queue.stopped != stopped:
        record(
            actor,
            "stop" if stopped else "resume",
            "queue",
            queue,
            {"stopped": [queue.stopped, stopped]},
            reason,
        )
        queue.stopped = stopped
        queue.save(update_fields=["stopped", "updated_at"])
    request_cycle()
    return queue


@transaction.atomic
def save_policy(serializer, *, actor, reason: str = ""):
    """Create or change a checkpoint policy through its (validated) serializer, audited."""
    creating = serializer.instance is None
    before = policy_audit_state(serializer.instance)
    policy = serializer.save()
    diff = changes(before, policy_audit_state(policy))
    record(actor, "create" if creating else "update", "checkpoint policy", policy, diff, reason)
    return policy
