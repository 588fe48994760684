"""Order queue heads, and hold a queue behind a job that waited too long (its queueing strategy).

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import heapq

from engine.reasons import Reason
from engine.workload import PendingJob, Queueing


class OrderingStep:
    # --- 1. order ------------------------------------------------------------------------
    def _ordered(self):
        per_queue: dict[int, list[PendingJob]] = {}
        for job in self.pending:
            per_queue.setdefault(self.queue_index.get(job.queue, -1), []).append(job)
        for jobs in per_queue.values():
            jobs.sort(key=lambda j: (-j.priority, j.submitted_at, j.id))
        unknown = per_queue.pop(-1, [])
        for job in unknown:
            self.result.pending[job.id] = Reason(
                f"queue {job.queue} does not exist", "other", {"queue": job.queue}
            )
        heads = []
        position = dict.fromkeys(per_queue, 0)
        for qi, jobs in per_queue.items():
            heads.append(self._key(qi, jobs[0]))
        heapq.heapify(heads)
        while heads:
            *_, qi = heapq.heappop(heads)
            jobs = per_queue[qi]
            job = jobs[position[qi]]
            yield qi, job
            position[qi] += 1
            if position[qi] < len(jobs):
                heapq.heappush(heads, self._key(qi, jobs[position[qi]]))

    def _key(self, qi: int, job: PendingJob):
        """Jobs that fit within their queue's nominal quota come before jobs that would borrow
        (Kueue's order); then priority, the queue's fair share, submit time."""
        usage, nominal = self.quota.usage[qi], self.quota.nominal[qi]
        borrows = all(usage[c] + job.demand > nominal[c] for c in self._chip_options(qi, job))
        share = self.quota.share(qi, self.queues[qi].weight)
        return (borrows, -job.priority, share, job.submitted_at, job.id, qi)

    # --- 1b. queueing strategy ---------------------------------------------------------------
    def _held_behind(self, qi: int, job: PendingJob) -> Reason | None:
        """Why ``job`` waits behind an earlier job of its queue this cycle (None when it does not)."""
        held = self.queue_holds.get(qi)
        if held is None:
            return None
        holder, chips, why = held
        if chips and not chips & set(self._chip_options(qi, job)):
            return None  # it asks for other chip types than the one it waits behind
        return why

    def _hold(self, qi: int, job: PendingJob, reason: Reason) -> Reason:
        """Apply the queue's strategy to a job that could not start; returns its pending reason."""
        queue = self.queues[qi]
        if queue.stopped or qi in self.queue_holds:
            return reason
        if queue.queueing == Queueing.STRICT_FIFO:
            why = f"waiting behind job {job.id}: queue {queue.name} admits its jobs in strict order"
            self.queue_holds[qi] = (
                job.id,
                set(),
                Reason(why, "ordering", {"behind_job": job.id, "queue": queue.name}),
            )
            return reason
        bound = queue.head_wait_s
        if bound is None or not self.quota_blocked:
            return reason  # blocked by capacity: reservations and backfill take care of it
        first = qi not in self.first_blocked
        self.first_blocked.add(qi)
        waited = max(0.0, self.now - job.submitted_at)
        if waited < bound:
            if not first or waited < 60:
                return reason
            return reason.but(
                f" (waited {waited:.0f} s; after {bound:.0f} s queue {queue.name} holds its quota for it)",
                waited_s=round(waited),
                bound_s=round(bound),
            )
        chips = [c for c in self._chip_options(qi, job) if self.quota.ceiling(qi, c) >= job.demand]
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
        self.queue_holds[qi] = (job.id, set(chips), Reason(why, "ordering", facts))
        return reason.but(
            f" (waited {waited:.0f} s, past {bound:.0f} s: queue {queue.name} holds its quota for it)",
            waited_s=round(waited),
            bound_s=round(bound),
        )
