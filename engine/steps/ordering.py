"""Order queue heads, and hold a queue behind a job that waited too long (its queueing strategy).

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import heapq

from engine.reasons import Reason
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
def held_behind(s: CycleState, qi: int, job: PendingJob) -> Reason | None:
    """Why ``job`` waits behind an earlier job of its queue this cycle (None when it does not)."""
    held = s.queue_holds.get(qi)
    if held is None:
        return None
    holder, chips, why = held
    if chips and not chips & set(chip_options(s, qi, job)):
        return None  # it asks for other chip types than the one it waits behind
    return why


def hold(s: CycleState, qi: int, job: PendingJob, reason: Reason) -> Reason:
    """Apply the queue's strategy to a job that could not start; returns its pending reason."""
    queue = s.queues[qi]
    if queue.stopped or qi in s.queue_holds:
        return reason
    if queue.queueing == Queueing.STRICT_FIFO:
        why = f"waiting behind job {job.id}: queue {queue.name} admits its jobs in strict order"
        s.queue_holds[qi] = (
            job.id,
            set(),
            Reason(why, "ordering", {"behind_job": job.id, "queue": queue.name}),
        )
        return reason
    bound = queue.head_wait_s
    if bound is None or not s.quota_blocked:
        return reason  # blocked by capacity: reservations and backfill take care of it
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
    chips = [c for c in chip_options(s, qi, job) if s.quota.ceiling(qi, c) >= job.demand]
    if not chips:
        return reason  # its queue could never hold it: holding would block the queue for nothing
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
    s.queue_holds[qi] = (job.id, set(chips), Reason(why, "ordering", facts))
    return reason.but(
        f" (waited {waited:.0f} s, past {bound:.0f} s: queue {queue.name} holds its quota for it)",
        waited_s=round(waited),
        bound_s=round(bound),
    )
