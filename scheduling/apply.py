"""Write one cycle's decisions: preemptions (saving first where the policy can), resizes,
admissions with their plans, allocations, pending reasons, drained nodes; bulk writes only."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import NamedTuple

from django.db.models import BooleanField, ExpressionWrapper, OuterRef, Q, Subquery

from cluster.services import mark_drained
from engine.reasons import Reason
from engine.workload import CycleResult
from scheduling import sites
from scheduling.bulk import insert_plain, update_rows
from scheduling.checkpoints import job_policy
from scheduling.choices import EventKind, JobState
from scheduling.models import Checkpoint, Job, JobEvent
from scheduling.plans import plan_for, plan_summary, resize_job
from scheduling.replan import after_joining
from scheduling.services import AWAITING_CYCLE, REQUEUE_FIELDS, requeue, stop_job
from scheduling.store import NewAllocations, allocations, chip_names

REASON_REFRESH_CYCLES = 10
log = logging.getLogger("myriad.scheduling")
_DIGITS = re.compile(r"\d+")


@functools.lru_cache(maxsize=1 << 16)
def _wording(reason: str) -> str:
    """A reason with its numbers blanked. Cached: this cycle's old reasons are the last cycle's
    new ones, and many jobs share a reason, so each text is blanked about once."""
    return _DIGITS.sub("#", reason)


class ReasonWriter:
    """Reasons carry live numbers ("largest free block: 312 in pod bj2-p04") that move every
    cycle; rewriting ten thousand rows each cycle for a number is wasteful, so a reason whose
    wording is unchanged is refreshed every REASON_REFRESH_CYCLES cycles only."""

    def __init__(self) -> None:
        self.cycles = 0

    def changed(self, new: dict[int, Reason], old: dict[int, str]) -> list[tuple[int, str, str]]:
        """(job id, sentence, kind) of the reasons to write. A job the cycle deferred to the next
        one (its start limit reached) that still waits for its first decision keeps saying so:
        a fill of 10,000 jobs rewrote all the others' reasons twice, in two cycles back to back."""
        self.cycles += 1
        refresh = self.cycles % REASON_REFRESH_CYCLES == 0
        return [
            (job_id, reason[:2000], reason.kind)
            for job_id, reason in new.items()
            if old.get(job_id) != reason
            and (refresh or _wording(old.get(job_id) or "") != _wording(reason))
            and not (reason.facts.get("deferred") and old.get(job_id) == AWAITING_CYCLE)
        ]


reasons = ReasonWriter()


def apply_decisions(
    result: CycleResult,
    snapshot,
    now: datetime,
    old_reasons: dict[int, str],
    ranked: dict[int, str] | None = None,
    chips: dict[int, str] | None = None,
    decided: Decided | None = None,
    after: list | None = None,
) -> int:
    """Write a cycle's decisions, already checked against what changed since they were read
    (``still_current``); returns the number of GPUs newly allocated. ``chips``: the chip types'
    names by id, and ``decided``: what ``still_current`` read of the admitted jobs, when the caller
    has them already. ``after``: where the pending jobs' reasons go to be written after the commit
    (scheduling.locks.cycle_scope); None: written now."""
    if chips is None:
        chips = chip_names()
    if decided is None:
        decided = read_decided([a.job_id for a in result.admissions], lock=False)
    chip_ids = {name: chip_id for chip_id, name in chips.items()}
    events: list[JobEvent | EventRow] = []

    # 1. preemptions first: their GPUs are released before the preemptors take them
    if result.preemptions:
        events.extend(apply_preemptions(result.preemptions, now))

    # 2. shrinks release their GPUs before anyone takes them; growths are inserted with admissions
    rows = NewAllocations()
    if result.resizes:
        events.extend(_apply_resizes(result.resizes, snapshot, now, rows))

    # 3. admissions: state, placement, events, plans
    admitted_jobs = []
    waits = _waits([a.job_id for a in result.admissions], now, decided)
    for a in result.admissions:
        rows.add(a.job_id, snapshot.gpu_id[a.held])
        admitted_jobs.append(
            (a.job_id, JobState.RUNNING.value, now, chip_ids[a.chip], a.domain[:128], "", "", len(a.held))
        )
        events.extend(_admission_events(a, now, waits.get(a.job_id)))
    if admitted_jobs:
        update_rows(
            Job,
            ["state", "started_at", "chip", "placement", "pending_reason", "pending_kind", "allocated_gpus"],
            admitted_jobs,
        )
        _link_loads(result, snapshot, now)
        _plan_admitted(result, snapshot, now, events, decided.modelled)
    # a job that shares a GPU asks for one (a constraint of the job table): its share is its row's
    written = allocations.insert(rows, now, decided.shares) if rows else None

    # 4. pending reasons (jobs whose chip types were ranked say so)
    for job_id, ranking in (ranked or {}).items():
        if job_id in result.pending:
            result.pending[job_id] = result.pending[job_id].but(f" ({ranking})", ranked=ranking)
    changed = reasons.changed(result.pending, old_reasons)
    if after is None:
        update_rows(Job, ["pending_reason", "pending_kind"], changed)
    elif changed:
        after.append(partial(update_rows, Job, ["pending_reason", "pending_kind"], changed))
    insert_plain(events, model=JobEvent)

    # 5. draining nodes left empty are drained
    if result.drained:
        mark_drained(snapshot.node_id[result.drained].tolist(), at=now)

    shrunk = [(r.job_id, snapshot.gpu_id[r.released]) for r in result.resizes if len(r.released)]
    allocations.carry([p.job_id for p in result.preemptions], shrunk, rows.pairs(), written)
    return len(rows)


def _link_loads(result: CycleResult, snapshot, now: datetime) -> None:
    """Jobs placed across datacenters keep the share of each link they took (given back when they
    are requeued: scheduling.services.requeue); the jobs already on those links are re-planned
    over what is left to them."""
    joined = {}
    for a in result.admissions:
        if a.link_loads:
            joined[a.job_id] = sites.as_stored(snapshot, a.link_loads)
            Job.objects.filter(pk=a.job_id).update(link_loads=joined[a.job_id])
    if joined:
        after_joining(joined, now)


class Decided(NamedTuple):
    """What the writes need to know of the jobs a cycle decided about, read in one statement with
    their rows locked (``read_decided``): the state each is in now, when it last joined the queue
    (its last requeue, else its submission), the thousandths of a GPU of those that share one,
    and which describe their model (they get a parallel plan)."""

    states: dict[int, str]
    since: dict[int, datetime]
    shares: dict[int, int]
    modelled: set[int]


def read_decided(job_ids, lock: bool = True) -> Decided:
    """The facts of ``job_ids`` (one statement; ``lock``: their rows locked until the commit)."""
    if not job_ids:
        return Decided({}, {}, {}, set())
    requeued = JobEvent.objects.filter(job_id=OuterRef("pk"), kind=EventKind.REQUEUED).order_by("-at")
    rows = Job.objects.select_for_update() if lock else Job.objects
    rows = (
        rows.filter(pk__in=list(job_ids))
        .annotate(
            requeued=Subquery(requeued.values("at")[:1]),
            modelled=ExpressionWrapper(~Q(model={}), output_field=BooleanField()),
        )
        .values_list("id", "state", "submitted_at", "requeued", "share", "modelled")
    )
    decided = Decided({}, {}, {}, set())
    for job_id, state, submitted, again, share, modelled in rows:
        decided.states[job_id] = state
        decided.since[job_id] = max(submitted, again or submitted)
        if share < 1000:
            decided.shares[job_id] = share
        if modelled:
            decided.modelled.add(job_id)
    return decided


def _waits(job_ids: list[int], now: datetime, decided: Decided | None = None) -> dict[int, float]:
    """Seconds each job waited for this admission: since its last requeue, else its submission
    (the queue history reads it from the admitted event: scheduling.history)."""
    since = (decided or read_decided(job_ids, lock=False)).since
    return {j: round(max(0.0, (now - since[j]).total_seconds()), 3) for j in job_ids if j in since}


class EventRow(NamedTuple):
    """A job event as ``insert_plain`` writes it (JobEvent's columns): a cycle that starts 1,000
    jobs writes 2,000 of them, and a model instance each cost eight times as much to build."""

    job_id: int
    kind: str
    at: datetime
    reason: str
    data: dict


def _admission_events(a, now: datetime, wait_s: float | None = None) -> list[EventRow]:
    data = {"chip": a.chip, "gpus": len(a.held), "borrowed": a.borrowed, "wait_s": wait_s}
    if a.parts:
        data["parts"] = dict(a.parts)
    if a.preempted:
        data["preempted"] = list(a.preempted)
    on = " + ".join(f"{n} {c}" for c, n in a.parts) if a.parts else a.chip
    return [
        EventRow(
            job_id=a.job_id,
            kind=EventKind.ADMITTED,
            at=now,
            reason=f"admitted on {on}" + (f", borrowing {a.borrowed}" if a.borrowed else ""),
            data=data,
        ),
        EventRow(
            job_id=a.job_id,
            kind=EventKind.PLACED,
            at=now,
            reason=f"placed in {a.domain}"
            + (" (backfilled)" if a.backfilled else "")
            + (" on spare nodes (fault recovery may take them back)" if a.on_spares else "")
            + (" across a congested fabric (no pod with clear links had room)" if a.congested else "")
            + (f"; {a.span_note}" if a.span_note else ""),
            data={
                "domain": a.domain,
                "span": a.span_note,
                "gpus": len(a.held),
                "backfilled": a.backfilled,
                "on_spares": a.on_spares,
                "congested_fabric": a.congested,
            },
        ),
    ]


def _plan_admitted(result: CycleResult, snapshot, now: datetime, events: list[JobEvent], modelled) -> None:
    """Jobs that describe their model (``modelled``) get a modelled parallel plan for where they
    landed."""
    admitted = {a.job_id: a for a in result.admissions if a.job_id in modelled}
    if not admitted:
        return
    for job in Job.objects.filter(pk__in=list(admitted)).only("id", "model"):
        a = admitted[job.pk]
        plan = plan_for(job, a.chip, snapshot, a.held, a.parts)
        Job.objects.filter(pk=job.pk).update(plan=plan)
        events.append(
            JobEvent(
                job_id=job.pk, kind=EventKind.PLANNED, at=now, reason=plan_summary(plan), data={"plan": plan}
            )
        )


def _apply_resizes(resizes, snapshot, now: datetime, rows: NewAllocations) -> list[JobEvent]:
    """Shrink and grow elastic jobs: allocations, size, re-chosen plan, and a resized event that
    carries the old and new plan with their modelled throughput."""
    events = []
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=[r.job_id for r in resizes]).select_related("chip")}
    for r in resizes:
        job = jobs[r.job_id]
        if len(r.released):
            allocations.release(now, job=job, gpu_ids=snapshot.gpu_id[r.released].tolist())
        rows.add(job.pk, snapshot.gpu_id[r.added])
        extra = {"by_job": r.by_job} if r.by_job is not None else {}
        events.append(resize_job(job, snapshot, r.held, at=now, reason=r.reason, **extra))
    return events


def still_current(result: CycleResult) -> tuple[CycleResult, Decided]:
    """The decisions whose jobs are still in the state the cycle read, their rows locked until the
    cycle commits. An operator's cancel or a node's finish does not take the scheduling lock: one
    that committed after the cycle read its snapshot drops that job's decision (a job cancelled
    while pending is not started; a running job that finished is not preempted or resized, and its
    GPUs are already free). One that comes after this waits for the cycle, then acts on what it
    wrote. Returns the decisions kept and what the writes need of their jobs (``Decided``, read in
    the same statement)."""
    ids = {a.job_id for a in result.admissions}
    ids |= {p.job_id for p in result.preemptions} | {r.job_id for r in result.resizes}
    decided = read_decided(ids)
    if not ids:
        return result, decided
    states = decided.states
    admissions = [a for a in result.admissions if states.get(a.job_id) == JobState.PENDING]
    preemptions = [p for p in result.preemptions if states.get(p.job_id) == JobState.RUNNING]
    resizes = [r for r in result.resizes if states.get(r.job_id) == JobState.RUNNING]
    dropped = len(result.admissions) + len(result.preemptions) + len(result.resizes)
    dropped -= len(admissions) + len(preemptions) + len(resizes)
    if not dropped:
        return result, decided
    log.info("cycle: %d decisions dropped; their jobs changed state after the cycle read them", dropped)
    return replace(result, admissions=admissions, preemptions=preemptions, resizes=resizes), decided


def apply_preemptions(preemptions, now: datetime) -> list[JobEvent]:
    """Victims go back to pending with their progress, saving first where their policy can
    (engine.lifecycle.stop, the rule the simulator follows too)."""
    victims = {p.job_id: p for p in preemptions}
    allocations.release(now, jobs=victims)
    jobs = list(
        Job.objects.filter(pk__in=victims).select_related(
            "checkpoint_policy", "queue__default_checkpoint_policy"
        )
    )
    events, checkpoints = [], []
    for job in jobs:
        p = victims[job.pk]
        held = {"gpus": job.allocated_gpus or job.gpus, "chip_id": job.chip_id}  # what it gave up
        kind = job_policy(job).kind
        outcome, checkpoint = stop_job(job, now, kind)
        if checkpoint is not None:
            checkpoints.append(checkpoint)
            events.append(
                JobEvent(
                    job=job,
                    kind=EventKind.CHECKPOINTED,
                    at=now,
                    reason="saved before preemption",
                    data={"progress_s": job.progress_s, "preemption": True},
                )
            )
        job.preemptions += 1
        requeue(job, f"requeued after preemption: {p.reason}")
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.PREEMPTED,
                at=now,
                reason=p.reason,
                data={"by_job": p.by_job, "progress_s": job.progress_s, "lost_s": outcome.lost_s, **held},
            )
        )
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.REQUEUED,
                at=now,
                reason="requeued with its progress after preemption",
                data={"progress_s": job.progress_s},
            )
        )
    Checkpoint.objects.bulk_create(checkpoints)
    # one prepared statement for every victim (Django's bulk_update wrote a CASE per row and field:
    # 3.5 s for 1,000 victims on SQLite)
    fields = [*REQUEUE_FIELDS, "preemptions", "progress_s", "last_checkpoint_at"]
    update_rows(Job, fields, [(job.pk, *(getattr(job, f) for f in fields)) for job in jobs])
    return events
