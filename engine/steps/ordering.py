"""Order queue heads, and hold a queue behind a job that waited too long (its queueing strategy).

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from engine.reasons import Reason, duration
from engine.steps.admission import chip_options
from engine.steps.state import CycleState
from engine.workload import PendingJob, Queueing


# --- 1. order ------------------------------------------------------------------------
def ordered(s: CycleState):
    per_queue: dict[int, list[PendingJob]] = {}
    for job in s.pending:
        per_queue.setdefault(s.queue_index.get(job.queue, -1), []).append(job)
    for jobs in per_queue.values():
        jobs.sort(key=lambda j: (-j.priority, j.submitted_at, j.id))
    unknown = per_queue.pop(-1, [])
    for job in unknown:
        s.result.pending[job.id] = Reason(f"queue {job.queue} does not exist", "other", {"queue": job.queue})
    heads = []
    position = dict.fromkeys(per_queue, 0)
    for qi, jobs in per_queue.items():
        heads.append(key(s, qi, jobs[0]))
    heapq.heapify(heads)
    while heads:
        *_, qi = heapq.heappop(heads)
        jobs = per_queue[qi]
        job = jobs[position[qi]]
        yield qi, job
        position[qi] += 1
        if position[qi] < len(jobs):
            heapq.heappush(heads, key(s, qi, jobs[position[qi]]))


def key(s: CycleState, qi: int, job: PendingJob):
    """Jobs that fit within their queue's nominal quota come before jobs that would borrow
    (Kueue's order); then priority, the queue's fair share, submit time."""
    usage, nominal = s.quota.usage[qi], s.quota.nominal[qi]
    borrows = all(usage[c] + job.demand > nominal[c] for c in chip_options(s, qi, job))
    share = s.quota.share(qi, s.queues[qi].weight)
    return (borrows, -job.priority, share, job.submitted_at, job.id, qi)


# --- 1b. queueing strategy ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueueHold:
    """A queue's later jobs wait behind ``job`` on ``chips`` (empty: on every chip type). Backfill:
    ``until`` is its expected start (None: unknown); a later job ending before it may pass."""

    job: int
    chips: frozenset[int]
    reason: Reason
    backfill: bool = False
    until: float | None = None
    gpus: int = 0


def held_behind(s: CycleState, qi: int, job: PendingJob) -> Reason | None:
    """Why ``job`` waits behind an earlier job of its queue this cycle (None when it does not)."""
    held = s.queue_holds.get(qi)
    if held is None:
        return None
    if held.chips and not held.chips & set(chip_options(s, qi, job)):
        return None  # it asks for other chip types than the one it waits behind
    if not held.backfill:
        return held.reason
    if held.until is not None and job.estimated_duration_s is not None:
        if s.now + job.estimated_duration_s <= held.until:
            return None  # it gives the quota back before the blocked job could use it
        own = f"this job's estimated {duration(job.estimated_duration_s)} runs past that"
    else:
        own = "this job has no estimated duration" if held.until is not None else "no end is known"
    return held.reason.but(f"; {own}", estimated_duration_s=job.estimated_duration_s)


def hold(s: CycleState, qi: int, job: PendingJob, reason: Reason) -> Reason:
    """Apply the queue's strategy to a job that could not start; returns its pending reason."""
    queue = s.queues[qi]
    if queue.stopped or qi in s.queue_holds:
        return reason
    if queue.queueing == Queueing.STRICT_FIFO:
        why = f"waiting behind job {job.id}: queue {queue.name} admits its jobs in strict order"
        facts = {"behind_job": job.id, "queue": queue.name}
        s.queue_holds[qi] = QueueHold(job.id, frozenset(), Reason(why, "ordering", facts))
        return reason
    if not s.quota_blocked:
        return reason  # blocked by capacity: reservations and backfill take care of it
    chips = [c for c in chip_options(s, qi, job) if s.quota.ceiling(qi, c) >= job.demand]
    if not chips:
        return reason  # its queue could never hold it: holding would block the queue for nothing
    if queue.queueing == Queueing.BACKFILL:
        return reserve_quota(s, qi, job, chips, reason)
    bound = queue.head_wait_s
    if bound is None:
        return reason
    first = qi not in s.first_blocked
    s.first_blocked.add(qi)
    waited = max(0.0, s.now - job.submitted_at)
    if waited < bound:
        if not first or waited < 60:
            return reason
        return reason.but(
            f" (waited {waited:.0f} s; after {bound:.0f} s queue {queue.name} holds its quota for it)",
            waited_s=round(waited),
            bound_s=round(bound),
        )
    why = (
        f"waiting behind job {job.id} of queue {queue.name}, pending {waited:.0f} s "
        f"(past the queue's bounded wait of {bound:.0f} s)"
    )
    facts = {
        "behind_job": job.id,
        "queue": queue.name,
        "waited_s": round(waited),
        "bound_s": round(bound),
    }
    s.queue_holds[qi] = QueueHold(job.id, frozenset(chips), Reason(why, "ordering", facts))
    return reason.but(
        f" (waited {waited:.0f} s, past {bound:.0f} s: queue {queue.name} holds its quota for it)",
        waited_s=round(waited),
        bound_s=round(bound),
    )


def reserve_quota(s: CycleState, qi: int, job: PendingJob, chips: list[int], reason: Reason) -> Reason:
    """Backfill: reserve the quota ``job`` waits for, from now until its expected start (when
    enough of its queue's running jobs will have ended); returns its pending reason."""
    queue = s.queues[qi]
    starts = [t for t in (quota_free_at(s, qi, job, c) for c in chips) if t is not None]
    until = min(starts) if starts else None
    names = "/".join(s.topo.chip_names[c] for c in chips)
    gpus = s.quota.gpus(job.demand)
    if until is None:
        when = "no running job of the queue has an estimated end, so its later jobs wait"
        mine = f" (queue {queue.name} reserves its {names} quota for it; {when})"
        why = f"waiting behind job {job.id} of queue {queue.name}: its {names} quota is reserved for that job"
    else:
        when = f"in about {duration(until - s.now)}"
        mine = (
            f" (queue {queue.name} reserves its {names} quota for it: expected to start {when}; "
            "later jobs use it only if they end before then)"
        )
        why = (
            f"waiting behind job {job.id} of queue {queue.name}: its {names} quota is reserved for "
            f"that job ({gpus} GPUs) until it starts {when}"
        )
    facts = {"behind_job": job.id, "queue": queue.name, "reserved_until": until, "gpus": gpus}
    held = QueueHold(job.id, frozenset(chips), Reason(why, "ordering", facts), True, until, job.demand)
    s.queue_holds[qi] = held
    return reason.but(mine, reserved_until=until)


def quota_free_at(s: CycleState, qi: int, job: PendingJob, c: int) -> float | None:
    """When queue ``qi`` will have quota for ``job`` on chip ``c``: its running jobs ending in turn
    (by their estimated ends; those without one never), None if they never free enough."""
    chip = s.topo.chip_names[c]
    ending = []
    for r in (*s.running_by_queue_chip.get((qi, c), ()), *s.started):
        if r.estimated_end is None or r.id in s.victims or s.queue_index.get(r.queue) != qi:
            continue
        amount = sum(n for name, n in r.demand_by_chip() if name == chip)
        if amount:
            ending.append((r.estimated_end, amount))
    ending.sort()
    taken, at = 0, None
    for end, amount in ending:
        s.quota.remove(qi, c, amount)
        taken += amount
        if s.quota.check(qi, c, job.demand).ok:
            at = max(end, s.now)
            break
    s.quota.add(qi, c, taken)
    return at
