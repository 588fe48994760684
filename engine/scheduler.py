"""One scheduling cycle: order, admit, place, preempt, reserve and backfill. Pure: it reads a
snapshot and returns decisions; the caller applies them.

1. Order queue heads by job priority, then the queue's fair share (usage / weight), then submit
   time. Each queue's own jobs stay in (priority, submit time) order.
2. Admission: quota per chip type, borrowing from the cohort within borrowing and lending limits.
3. Placement: the smallest topology domain that holds the whole gang (engine.placement), best
   fit inside it. Pools are updated so later jobs in the cycle see what was used.
4. Preemption when a job cannot be admitted or placed: reclaim quota lent to borrowing queues, or
   evict lower-priority work of the same queue, as the queue's policies allow. Victims are whole
   jobs, the smallest set that frees a placeable block in one domain, preferring the least work
   since the last checkpoint; the placement is simulated before anything is evicted.
5. Reservation and backfill: a gang blocked by capacity reserves the GPUs it will get first (when
   running jobs end, by their estimates); later jobs may use those GPUs only if they end before.
6. Every job left pending gets a specific reason.

Elastic jobs (a size range, in steps such as whole nodes) are admitted at the largest size the
quota and the free GPUs allow, at or above their minimum. When a job cannot be placed, elastic
jobs that the preemption policies would let it evict are shrunk first (only as far as needed,
never below their minimum); only if that is not enough are whole jobs evicted. At the end of
the cycle, elastic jobs below their maximum grow into GPUs nobody else could use this cycle.

The steps are functions over one explicit state (engine.steps.state.CycleState); each lives in
its own module of engine.steps, and ``run`` takes them in order.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import replace

from engine import arrays
from engine.placement import Layout, level_limit
from engine.reasons import Reason, joined, moment
from engine.scheduler_config import SchedulerConfig
from engine.sites import DATACENTER_LEVEL
from engine.steps.admission import admit_on_spares, chip_options, placement_reason
from engine.steps.drain import drain
from engine.steps.elasticity import admit_by_shrinking, admit_elastic, grow
from engine.steps.mixed import admit_mixed
from engine.steps.ordering import held_behind, hold, ordered
from engine.steps.preemption import admit_by_preemption
from engine.steps.reservation import earliest, reserve
from engine.steps.sharing import admit_fraction
from engine.steps.spanning import admit_placed_or_span, spans
from engine.steps.state import CycleState, RunningIndex
from engine.workload import CycleResult, PendingJob, QueueSpec, Reclaim, RunningJob, WithinQueue

# SchedulerConfig: where callers find it with schedule
__all__ = ["SchedulerConfig", "collections_deferred", "schedule"]


def run(s: CycleState) -> CycleResult:
    """0. drains; 1. queue heads in order, each held by its array's running limit, behind its
    queue's blocked job, or scheduled (admission, placement, mixed chips, sharing, shrinking,
    preemption, reservation); 2. growth of elastic jobs into what nobody else could use."""
    drain(s)
    limit, started = s.config.max_start_gpus, 0
    most = s.config.max_starts
    for qi, job in ordered(s):
        s.result.considered += 1
        if (limit is not None and started >= limit) or (
            most is not None and len(s.result.admissions) >= most
        ):
            # every job not yet decided waits for the next cycle, whatever its order: say so
            # without ordering the rest
            s.result.start_limited = True
            reason = start_limit_reason(started, limit, len(s.result.admissions), most)
            starting = {a.job_id for a in s.result.admissions}
            for other in s.pending:
                if other.id not in starting and other.id not in s.result.pending:
                    s.result.pending[other.id] = reason
                    s.result.considered += other.id != job.id
            break
        behind = arrays.limited(s.array_running, s.array_reasons, job) or held_behind(s, qi, job)
        if behind:
            s.result.pending[job.id] = behind
            continue
        admitted = len(s.result.admissions)
        reason = schedule_job(s, qi, job)
        if reason:
            s.result.pending[job.id] = hold(s, qi, job, reason)
        elif job.array is not None:
            s.array_running[job.array] = s.array_running.get(job.array, 0) + 1
        started += sum(len(a.held) for a in s.result.admissions[admitted:])
    if most is not None and len(s.result.admissions) >= most:
        # the limit reached with no job left in sight still leaves work: the caller shows a cycle
        # only each array's first ``most`` pending jobs, and the rest come next
        s.result.start_limited = True
    if not s.result.start_limited:  # growth takes only what no pending job could use
        grow(s)
    return s.result


def start_limit_reason(started: int, limit: int | None, jobs: int, most: int | None) -> Reason:
    if most is not None and jobs >= most:
        text = f"waiting for the next cycle: this one started {jobs} jobs, its limit is {most}"
    else:
        text = f"waiting for the next cycle: this one started {started} GPUs, its limit is {limit}"
    # deferred: nothing was decided about the job, the next cycle (at once) decides
    facts = {
        "started_gpus": started,
        "limit_gpus": limit,
        "started_jobs": jobs,
        "limit_jobs": most,
        "deferred": True,
    }
    return Reason(text, "other", facts)


def schedule_job(s: CycleState, qi: int, job: PendingJob) -> Reason | None:
    """Admit the job (None) or say why it stays pending."""
    queue = s.queues[qi]
    s.quota_blocked = False
    if queue.stopped:
        return Reason(f"queue {queue.name} is stopped", "stopped", {"queue": queue.name})
    if job.fractional:
        return admit_fraction(s, qi, job)
    chips = chip_options(s, qi, job)
    if not chips:
        wanted = ", ".join(job.chip_types) if job.chip_types else "any chip type"
        return Reason(
            f"queue {queue.name} has no quota for {wanted} and its cohort has none to lend",
            "quota",
            {"queue": queue.name, "chip_types": list(job.chip_types)},
        )
    max_level = level_limit(job.topology)
    if spans(s, max_level) and s.config.span_policy == "never":
        max_level = DATACENTER_LEVEL
    if job.elastic:
        for c in chips:
            if admit_elastic(s, qi, job, c, max_level):
                return None
        # from here on it asks for its minimum, like a rigid job of that size
        job = replace(job, gpus=job.min_gpus, min_gpus=None)
    reasons: list[Reason] = []
    capacity_blocked = try_chips(s, qi, job, chips, max_level, reasons)
    if capacity_blocked is None:
        return None
    if job.mixed and len(chips) > 1 and admit_mixed(s, qi, job, chips, max_level):
        return None
    span_wait = s.span_waits.get(job.id)  # it waits rather than span: on one chip type, or mixed
    if spans(s, max_level):  # past the span decision, evictions and reservations stay in one datacenter
        max_level = DATACENTER_LEVEL
    # reclaiming lent quota on any chip type comes before evicting the queue's own work
    passes = []
    if queue.reclaim_within_cohort != Reclaim.NEVER and s.quota.cohort_of[qi] >= 0:
        passes.append(False)
    if queue.within_queue == WithinQueue.LOWER_PRIORITY:
        passes.append(True)
    for own in passes:
        for c in chips:
            if s.result.preemption_attempts >= s.config.max_preemption_attempts:
                limit = s.config.max_preemption_attempts
                deferred = "preemption deferred to the next cycle (attempt limit reached)"
                reasons.append(Reason(deferred, "capacity", {"attempt_limit": limit}))
                break
            if admit_by_shrinking(s, qi, job, c, max_level, own):
                return None
            if admit_by_preemption(s, qi, job, c, max_level, own):
                return None
            if own and s.borrow_blocked:
                reasons.append(s.borrow_blocked)
    reason = try_reserve(s, job, capacity_blocked, max_level) or joined(reasons)
    if span_wait is not None and reason is not None:
        return reason.but(f"; {span_wait}", span=span_wait)
    return reason


def try_chips(s: CycleState, qi, job, chips, max_level, reasons: list[Reason]) -> list[int] | None:
    """Admit and place on the first chip type that has quota and room (None: admitted);
    otherwise returns the chip types it found no room on, and adds each chip's reason."""
    capacity_blocked: list[int] = []
    unplaced: list[tuple[int, int, int]] = []  # (where its reason goes, chip, level)
    s.quota_blocked = True
    for c in chips:
        check = s.quota.check(qi, c, job.demand)
        if not check.ok:
            reasons.append(check.reason)
            continue
        s.quota_blocked = False
        # Within a cycle free GPUs only shrink (until a preemption gives some back), so once a
        # gang of g GPUs found no room at a level, nothing larger will: skip the search.
        known = s.no_room.get((c, max_level))
        if known is None or job.gpus < known:
            if admit_placed_or_span(s, qi, job, c, max_level):
                return None
            if job.id in s.span_waits:  # room across datacenters, but spanning did not pay
                blocked_everywhere = s.pools.blocked_everywhere(c, job.gpus, DATACENTER_LEVEL)
            else:
                blocked_everywhere = s.pools.blocked_everywhere(c, job.gpus, max_level)
                if blocked_everywhere:
                    s.no_room[(c, max_level)] = min(job.gpus, known or job.gpus)
        else:
            blocked_everywhere = True
        if blocked_everywhere:
            capacity_blocked.append(c)  # blocked by capacity, not only by someone's reservation
            s.capacity_blocked_chips.add(c)
        inside = DATACENTER_LEVEL if spans(s, max_level) else max_level
        if s.queues[qi].may_use_spares and admit_on_spares(s, qi, job, c, inside):
            return None
        level = DATACENTER_LEVEL if job.id in s.span_waits else max_level
        unplaced.append((len(reasons), c, level))
        reasons.append(None)
    # Why it found no room, per chip type: worded only now that it stays pending (a job that
    # starts on its sixth chip type needs none). Trying a chip type changes nothing unless the
    # job starts, so each reads what it would have read when tried.
    for at, c, level in unplaced:
        reasons[at] = placement_reason(s, job, c, level)
    return capacity_blocked


def try_reserve(s: CycleState, job, capacity_blocked: list[int], max_level: int) -> Reason | None:
    """Reserve for a gang blocked by capacity; returns its reason, or None without a reservation.
    A gang that chose to wait for one datacenter rather than span reserves there whatever the
    limit on reservations: its wait was weighed against spanning, and a wait nobody holds room for
    is not the one weighed (the next gang's estimate would count on the same GPUs)."""
    held = s.span_reserved.get(job.id)  # a mixed-chip gang that waits for a split in one datacenter
    if held is not None:
        return reservation_reason(s, job, held)
    waits = job.id in s.span_waits
    if waits and len(capacity_blocked) > 1:  # it reserves on the type it weighed: the soonest
        found = {c: earliest(s, job, c, max_level) for c in capacity_blocked}
        starts = [(f[0], c) for c, f in found.items() if f is not None]
        if not starts:
            return None
        c = min(starts, key=lambda start: start[0])[1]  # ties: the preferred type
        return reservation_reason(s, job, reserve(s, job, c, max_level, found[c]))
    for c in capacity_blocked:
        if waits or (
            len(s.result.reservations) < s.config.max_reservations
            and s.reservation_attempts < 4 * s.config.max_reservations
        ):
            reservation = reserve(s, job, c, max_level)
            if reservation is not None:
                return reservation_reason(s, job, reservation)
    return None


def reservation_reason(s: CycleState, job, reservation) -> Reason:
    chip = reservation.chip
    return Reason(
        f"waiting for reservation: {job.gpus} {chip} GPUs in "
        f"{reservation.domain}, expected free at {moment(reservation.start_at)}",
        "reservation",
        {
            "gpus": job.gpus,
            "chip": chip,
            "domain": reservation.domain,
            "free_in_s": round(reservation.start_at - s.now),
            "free_at": reservation.start_at,
        },
    )


def schedule(
    layout: Layout,
    queues: list[QueueSpec],
    running: list[RunningJob] | RunningIndex,
    pending: list[PendingJob],
    now: float,
    config: SchedulerConfig | None = None,
    congested_pods=None,
    links=None,
    unreachable=None,
) -> CycleResult:
    """Run one scheduling cycle over a snapshot; returns decisions and never changes its inputs.
    ``running``: the running jobs, or their index (engine.steps.state.RunningIndex) kept by a
    caller between cycles.
    ``congested_pods``: bool over the snapshot's pods whose fabric links are congested now
    (engine.fabric.congested_pods): gangs that span nodes go there last. ``links``: the
    datacenter links with the loads of the jobs crossing them (engine.sites.SiteLinks; copied):
    gangs allowed to span datacenters do so by ``config.span_policy`` within their capacity;
    None keeps no site model (a gang spans whenever one datacenter does not hold it).
    ``unreachable``: bool over the snapshot's datacenters the control plane cannot reach (a
    partition): nothing new is placed there; the work inside keeps running."""
    if links is not None:
        links = links.copy()
    state = CycleState(
        layout,
        queues,
        running,
        pending,
        now,
        config or SchedulerConfig(),
        links=links,
        unreachable=unreachable,
    )
    state.pools.set_congestion(congested_pods)
    return run(state)


@contextmanager
def collections_deferred():
    """No garbage-collection pass inside a cycle, wherever it runs (the scheduling worker, the
    simulator). A cycle allocates about a million short-lived objects (its snapshot, the jobs, the
    decisions), which start collections; a full one walks the whole heap of a process that keeps
    100,000 running jobs and took 200-290 ms inside a cycle of the worker (the mixed benchmark's
    p99 was those cycles), and 10-30 ms inside the simulator's (a span decision timed at 35 ms).
    Nearly all of a cycle's objects are freed by reference counting as it ends; what is cyclic is
    collected once collections resume. Cycles of one process never interleave here."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
