"""Jobs crossing a datacenter link, re-planned when what the link leaves them changes: lanes lost
or back (the links API) or another job joining it (a cycle's admissions). Each gets its plan over
the link as it is now, with its slowdown over the same GPUs in one datacenter, in a ``planned``
event (the job page; ETTR counts the slowdown in its ``degraded`` bucket). After lanes are lost, a
job slower than the threshold (``MYRIAD_SPAN_REPLAN_SLOWDOWN``) moves wholly into a datacenter that
holds it now, or shrinks into one if it is elastic, whichever finishes sooner than staying:
engine.linkreplan.replan weighs the move's save, restart and restore against the time lost."""

from __future__ import annotations

import numpy as np
from django.conf import settings
from django.utils import timezone

from cluster.models import Datacenter, DatacenterLink
from engine import lifecycle
from engine.linkreplan import Replan, move_seconds, replan
from engine.sites import DEFAULT_DURATION_S, one_site_step_s
from scheduling import sites
from scheduling.checkpoints import PHYSICS, job_policy
from scheduling.choices import EventKind
from scheduling.models import Job, JobEvent
from scheduling.plans import datacenters_of, model_of, plan_for, plan_summary, resize_job
from scheduling.services import requeue, stop_job
from scheduling.store import Holdings, allocations
from scheduling.trigger import assignments_changed, request_cycle


def replan_crossing(link: DatacenterLink, reason: str, at=None, *, act: bool = True, exclude=()) -> list[int]:
    """Re-plan every running job that crosses ``link`` (but ``exclude``) over what it leaves
    them now; with ``act``, one past the threshold moves or shrinks where that finishes sooner.
    Returns the jobs re-planned."""
    at = at or timezone.now()
    ids = [j for j in sites.jobs_crossing(link) if j not in set(exclude)]
    if not ids:
        return []
    holdings = Holdings()
    events, changed = [], []
    jobs = Job.objects.filter(pk__in=ids).select_related(
        "chip", "checkpoint_policy", "queue__default_checkpoint_policy"
    )
    for job in jobs:
        held = holdings.gpus_of(job.pk)
        old, new = job.plan or {}, plan_for(job, job.chip.name if job.chip else "", holdings.snapshot, held)
        if not new:
            continue
        job.plan = new
        job.save(update_fields=["plan"])
        changed.append(job.pk)
        slower = ""
        if old.get("step_s") and new.get("step_s"):
            change = new["step_s"] / old["step_s"] - 1
            slower = f": {old['step_s']:.2f} -> {new['step_s']:.2f} s/step ({change:+.1%})"
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.PLANNED,
                at=at,
                reason=f"re-planned, {reason}{slower}; {plan_summary(new)}"[:2000],
                data={"old_plan": old, "plan": new, "link": link.pk},
            )
        )
        if act and new.get("slowdown") is not None:
            choice, kept = _choice(job, new["slowdown"], held, holdings, at)
            if choice.action == "move":
                events.extend(_move(job, choice, link, holdings, held, at))
            elif choice.action == "shrink":
                events.append(_shrink(job, choice, holdings, held, kept, at))
            elif new["slowdown"] > settings.SPAN_REPLAN_SLOWDOWN:
                events[-1].reason = f"{events[-1].reason}; {choice.note}"[:2000]
    JobEvent.objects.bulk_create(events)
    return changed


def _remaining_s(job: Job, at) -> float:
    """The job's work left at full speed: its estimated duration less the work done so far."""
    done = job.progress_s + _unsaved_s(job, at)
    return max(0.0, (job.estimated_duration_s or DEFAULT_DURATION_S) - done)


def _choice(job: Job, slowdown: float, held: np.ndarray, holdings: Holdings, at) -> tuple[Replan, np.ndarray]:
    """Stay, move or shrink (engine.linkreplan.replan), and the GPUs a shrink keeps."""
    snap = holdings.snapshot
    chip = job.chip.name if job.chip else ""
    c = snap.chip_names.index(chip) if chip in snap.chip_names else -1
    free = snap.schedulable() & ~holdings.owned & (snap.gpu_chip == c)
    free[held] = True  # its own GPUs come back when it moves
    counts = np.bincount(datacenters_of(snap, np.flatnonzero(free)), minlength=len(snap.datacenter_id))
    move_s, move_to = None, ""
    if counts.max(initial=0) >= len(held):
        policy = job_policy(job)
        state = lifecycle.checkpoint_bytes(job.parameters, PHYSICS)
        unsaved = _unsaved_s(job, at)
        move_s = move_seconds(len(held), state, unsaved, lifecycle.saves_on_demand(policy.kind), PHYSICS)
        move_to = Datacenter.objects.get(pk=int(snap.datacenter_id[int(np.argmax(counts))])).name
    shrink_speed, kept = None, held[:0]
    if job.min_gpus:
        theirs = datacenters_of(snap, held)
        biggest = np.bincount(theirs).argmax()
        n = int((theirs == biggest).sum())
        n -= n % max(1, job.size_step)
        full, small = (one_site_step_s(model_of(job), chip, k) for k in (len(held), n))
        if n >= job.min_gpus and full and small:
            shrink_speed, kept = full / small, held[theirs == biggest][:n]
    choice = replan(
        slowdown,
        _remaining_s(job, at),
        threshold=settings.SPAN_REPLAN_SLOWDOWN,
        move_s=move_s,
        move_to=move_to,
        shrink_speed=shrink_speed,
        shrink_gpus=len(kept),
    )
    return choice, kept


def _unsaved_s(job: Job, at) -> float:
    return lifecycle.unsaved_s(
        at.timestamp(),
        job.started_at.timestamp() if job.started_at else None,
        job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else None,
    )


def _move(job: Job, choice: Replan, link, holdings: Holdings, held: np.ndarray, at) -> list[JobEvent]:
    """Stop the job (saving first when its policy can), give back its GPUs and its link shares,
    and requeue it: the next cycle places it inside one datacenter."""
    outcome, checkpoint = stop_job(job, at, job_policy(job).kind)
    events = []
    if checkpoint is not None:
        checkpoint.save()
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.CHECKPOINTED,
                at=at,
                reason="saved before moving into one datacenter",
                data={"progress_s": job.progress_s},
            )
        )
    allocations.release(at, job=job)
    holdings.owned[held], holdings.owner[held] = False, -1
    fields = requeue(job, f"moving into one datacenter: {choice.note}")
    job.save(update_fields=[*fields, "progress_s", "last_checkpoint_at"])
    events.append(
        JobEvent(
            job=job,
            kind=EventKind.REQUEUED,
            at=at,
            reason=f"moved off link {link}: {choice.note}"[:2000],
            data={"link": link.pk, "moved": True, "lost_s": outcome.lost_s, "progress_s": job.progress_s},
        )
    )
    if job.command:
        assignments_changed()  # its agents stop it
    request_cycle()
    return events


def _shrink(job: Job, choice: Replan, holdings: Holdings, held, kept, at) -> JobEvent:
    """An elastic job keeps only its GPUs in one datacenter and gives back its link shares."""
    snap = holdings.snapshot
    released = np.setdiff1d(held, kept)
    allocations.release(at, job=job, gpu_ids=snap.gpu_id[released].tolist())
    holdings.owned[released], holdings.owner[released] = False, -1
    job.link_loads = None
    job.save(update_fields=["link_loads"])
    event = resize_job(job, snap, kept, at=at, reason=f"shrunk into one datacenter: {choice.note}")
    if job.command:
        assignments_changed()
    request_cycle()
    return event


def after_joining(admitted: dict[int, list], at) -> None:
    """Re-plan the jobs already on the links that this cycle's spanning admissions joined
    (``admitted``: job id -> its stored link loads)."""
    pairs = {tuple(sorted(e[:2])) for loads in admitted.values() for e in loads}
    for link in DatacenterLink.objects.select_related("a", "b"):
        if (link.a_id, link.b_id) in pairs or (link.b_id, link.a_id) in pairs:
            joined = ", ".join(str(j) for j in sorted(admitted))
            replan_crossing(link, f"job {joined} joined link {link}", at, act=False, exclude=admitted)
