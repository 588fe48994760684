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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.placement import FreePool, Layout, level_limit
from engine.pools import Pools
from engine.quota import UNLIMITED, QuotaBook
from engine.reasons import Reason, joined
from engine.steps.admission import AdmissionStep
from engine.steps.drain import DrainStep
from engine.steps.elasticity import ElasticStep
from engine.steps.mixed import MixedChipStep
from engine.steps.ordering import OrderingStep
from engine.steps.preemption import PreemptionStep
from engine.steps.reservation import ReservationStep
from engine.steps.sharing import SharingStep
from engine.workload import (
    MILLI,
    CycleResult,
    PendingJob,
    QueueSpec,
    Reclaim,
    RunningJob,
    WithinQueue,
)


@dataclass(frozen=True)
class SchedulerConfig:
    max_reservations: int = 4  # blocked gangs that hold reservations at once
    max_preemption_attempts: int = 64  # per cycle; the rest wait for the next cycle
    max_victim_domains: int = 16  # candidate domains examined per preemption attempt
    # GPUs one cycle may start (None: no limit); the jobs after it wait for the next cycle, which
    # the caller runs at once. It bounds a cycle's writes (like Slurm's sched_max_job_start).
    max_start_gpus: int | None = None


def build_quota_book(
    queues: list[QueueSpec],
    chip_names,
    running: list[RunningJob],
    usage_by: dict[tuple[str, str], int] | None = None,
    unit: int = MILLI,
) -> QuotaBook:
    """Quota book for the queues, in ``unit``s per GPU (default thousandths); usage from running
    jobs (charged their share of each GPU), or from {(queue, chip): amount in units}."""
    chips = {name: i for i, name in enumerate(chip_names)}
    cohorts = sorted({q.cohort for q in queues if q.cohort})
    cohort_index = {name: i for i, name in enumerate(cohorts)}
    shape = (len(queues), len(chips))
    nominal = np.zeros(shape, dtype=np.int64)
    borrowing = np.full(shape, UNLIMITED, dtype=np.int64)
    lending = np.full(shape, UNLIMITED, dtype=np.int64)
    for qi, q in enumerate(queues):
        for chip, value in q.nominal.items():
            if chip in chips:
                nominal[qi, chips[chip]] = value * unit
        for chip, value in q.borrowing_limit.items():
            if chip in chips and value is not None:
                borrowing[qi, chips[chip]] = value * unit
        for chip, value in q.lending_limit.items():
            if chip in chips and value is not None:
                lending[qi, chips[chip]] = value * unit
    usage = np.zeros(shape, dtype=np.int64)
    queue_index = {q.name: i for i, q in enumerate(queues)}
    for job in running:
        if job.queue not in queue_index:
            continue
        for chip, amount in job.demand_by_chip():
            if chip in chips:
                usage[queue_index[job.queue], chips[chip]] += amount * unit // MILLI
    for (queue, chip), gpus in (usage_by or {}).items():
        if queue in queue_index and chip in chips:
            usage[queue_index[queue], chips[chip]] += gpus
    return QuotaBook(
        [q.name for q in queues],
        list(chip_names),
        [cohort_index[q.cohort] if q.cohort else -1 for q in queues],
        cohorts,
        nominal,
        borrowing,
        lending,
        usage,
        unit,
    )


class Cycle(
    DrainStep,
    OrderingStep,
    AdmissionStep,
    MixedChipStep,
    SharingStep,
    ElasticStep,
    PreemptionStep,
    ReservationStep,
):
    """The state of one cycle, and its order of steps; each step lives in its own module of
    engine.steps. Use ``schedule()``."""

    def __init__(self, layout: Layout, queues, running, pending, now: float, config: SchedulerConfig):
        self.layout = layout
        self.topo = layout.topo
        self.config = config
        self.now = now
        self.queues = list(queues)
        self.queue_index = {q.name: i for i, q in enumerate(self.queues)}
        self.chip_index = {name: i for i, name in enumerate(self.topo.chip_names)}
        self.running = [j for j in running if len(j.held)]
        self.pending = list(pending)
        self.quota = build_quota_book(self.queues, self.topo.chip_names, self.running)
        self.schedulable = self.topo.schedulable()
        owned = np.zeros(self.topo.num_gpus, dtype=bool)
        if self.running:
            owned[np.concatenate([j.held for j in self.running])] = True
        # thousandths used on shared GPUs; a shared GPU is never free for whole-GPU jobs
        self.gpu_used = np.zeros(self.topo.num_gpus, dtype=np.int32)
        for job in self.running:
            if job.fractional:
                self.gpu_used[job.held] += job.share
        self.shared = np.flatnonzero(self.gpu_used)  # GPUs with fractions on them
        shares = [j.share for j in self.pending if j.fractional]
        self.min_share = min(shares) if shares else MILLI
        self.share_mixes: dict = {}  # chip -> the kinds of work fractions are packed against
        self.pools = Pools(layout, self.schedulable & ~owned)
        # free GPUs of spare nodes, for queues allowed to borrow them (built when first asked)
        self.spare_free = self.topo.usable() & self.topo.node_spare[self.topo.gpu_node] & ~owned
        self._spare_pool: FreePool | None = None
        self.running_by_queue_chip: dict[tuple[int, int], list[RunningJob]] = {}
        self._lowest_cache: dict[tuple[int, int], tuple[list, float]] = {}  # PreemptionStep
        self.running_by_chip: dict[int, list[RunningJob]] = {}
        for job in self.running:
            for chip in self._chips_of(job):
                c = self.chip_index.get(chip, -1)
                self.running_by_queue_chip.setdefault((self.queue_index.get(job.queue, -1), c), []).append(
                    job
                )
                self.running_by_chip.setdefault(c, []).append(job)
        self.reserved = np.zeros(self.topo.num_gpus, dtype=bool)
        self.horizon = float("inf")  # earliest reservation start
        self.reservation_attempts = 0
        self._ending_cache: dict[int, tuple] = {}
        # (chip, level limit) -> the smallest gang that found no room this cycle
        self.no_room: dict[tuple[int, int], int] = {}
        # (chip, level limit) -> (size, name) of the largest free block, for reasons
        self.largest_blocks: dict[tuple[int, int], tuple[int, str]] = {}
        self.victims: set[int] = set()
        self.resized: set[int] = set()  # elastic jobs shrunk or grown this cycle
        self.capacity_blocked_chips: set[int] = set()  # chips some pending job found no room on
        self.started: list[RunningJob] = []  # admitted this cycle, as running jobs
        # queue index -> (the job its later jobs wait behind, that job's chip options, reason)
        self.queue_holds: dict[int, tuple[int, set[int], Reason]] = {}
        self.first_blocked: set[int] = set()  # queues whose first blocked job was seen
        self.quota_blocked = False  # the last job scheduled was refused by quota on every chip
        self.borrow_blocked: Reason | None = (
            None  # why the last preemption attempt was refused while borrowing
        )
        self._options: dict[tuple, list[int]] = {}  # (queue, chip types) -> chip options
        self.result = CycleResult()

    def run(self) -> CycleResult:
        """0. drains; 1. queue heads in order, each held behind its queue's blocked job or
        scheduled (admission, placement, mixed chips, sharing, shrinking, preemption, reservation);
        2. growth of elastic jobs into what nobody else could use."""
        self._drain()
        limit, started = self.config.max_start_gpus, 0
        for qi, job in self._ordered():
            self.result.considered += 1
            if limit is not None and started >= limit:
                self.result.start_limited = True
                self.result.pending[job.id] = Reason(
                    f"waiting for the next cycle: this one started {started} GPUs, its limit is {limit}",
                    "other",
                    {"started_gpus": started, "limit_gpus": limit},
                )
                continue
            behind = self._held_behind(qi, job)
            if behind:
                self.result.pending[job.id] = behind
                continue
            admitted = len(self.result.admissions)
            reason = self._schedule_job(qi, job)
            if reason:
                self.result.pending[job.id] = self._hold(qi, job, reason)
            started += sum(len(a.gpus) for a in self.result.admissions[admitted:])
        if not self.result.start_limited:  # growth takes only what no pending job could use
            self._grow()
        return self.result

    def _schedule_job(self, qi: int, job: PendingJob) -> Reason | None:
        """Admit the job (None) or say why it stays pending."""
        queue = self.queues[qi]
        self.quota_blocked = False
        if queue.stopped:
            return Reason(f"queue {queue.name} is stopped", "stopped", {"queue": queue.name})
        if job.fractional:
            return self._admit_fraction(qi, job)
        chips = self._chip_options(qi, job)
        if not chips:
            wanted = ", ".join(job.chip_types) if job.chip_types else "any chip type"
            return Reason(
                f"queue {queue.name} has no quota for {wanted} and its cohort has none to lend",
                "quota",
                {"queue": queue.name, "chip_types": list(job.chip_types)},
            )
        max_level = level_limit(job.topology)
        if job.elastic:
            for c in chips:
                if self._admit_elastic(qi, job, c, max_level):
                    return None
            # from here on it asks for its minimum, like a rigid job of that size
            job = replace(job, gpus=job.min_gpus, min_gpus=None)
        reasons: list[Reason] = []
        capacity_blocked = self._try_chips(qi, job, chips, max_level, reasons)
        if capacity_blocked is None:
            return None
        if job.mixed and len(chips) > 1 and self._admit_mixed(qi, job, chips, max_level):
            return None
        # reclaiming lent quota on any chip type comes before evicting the queue's own work
        passes = []
        if queue.reclaim_within_cohort != Reclaim.NEVER and self.quota.cohort_of[qi] >= 0:
            passes.append(False)
        if queue.within_queue == WithinQueue.LOWER_PRIORITY:
            passes.append(True)
        for own in passes:
            for c in chips:
                if self.result.preemption_attempts >= self.config.max_preemption_attempts:
                    limit = self.config.max_preemption_attempts
                    deferred = "preemption deferred to the next cycle (attempt limit reached)"
                    reasons.append(Reason(deferred, "capacity", {"attempt_limit": limit}))
                    break
                if self._admit_by_shrinking(qi, job, c, max_level, own):
                    return None
                if self._admit_by_preemption(qi, job, c, max_level, own):
                    return None
                if own and self.borrow_blocked:
                    reasons.append(self.borrow_blocked)
        return self._try_reserve(job, capacity_blocked, max_level) or joined(reasons)

    def _try_chips(self, qi, job, chips, max_level, reasons: list[Reason]) -> list[int] | None:
        """Admit and place on the first chip type that has quota and room (None: admitted);
        otherwise returns the chip types it found no room on, and adds each chip's reason."""
        capacity_blocked: list[int] = []
        self.quota_blocked = True
        for c in chips:
            check = self.quota.check(qi, c, job.demand)
            if not check.ok:
                reasons.append(check.reason)
                continue
            self.quota_blocked = False
            # Within a cycle free GPUs only shrink (until a preemption gives some back), so once a
            # gang of g GPUs found no room at a level, nothing larger will: skip the search.
            known = self.no_room.get((c, max_level))
            if known is None or job.gpus < known:
                if self._admit_placed(qi, job, c, max_level):
                    return None
                blocked_everywhere = self.pools.blocked_everywhere(c, job.gpus, max_level)
                if blocked_everywhere:
                    self.no_room[(c, max_level)] = min(job.gpus, known or job.gpus)
            else:
                blocked_everywhere = True
            if blocked_everywhere:
                capacity_blocked.append(c)  # blocked by capacity, not only by someone's reservation
                self.capacity_blocked_chips.add(c)
            if self.queues[qi].may_use_spares and self._admit_on_spares(qi, job, c, max_level):
                return None
            reasons.append(self._placement_reason(job, c, max_level))
        return capacity_blocked

    def _try_reserve(self, job, capacity_blocked: list[int], max_level: int) -> Reason | None:
        """Reserve for a gang blocked by capacity; returns its reason, or None without a reservation."""
        for c in capacity_blocked:
            if (
                len(self.result.reservations) < self.config.max_reservations
                and self.reservation_attempts < 4 * self.config.max_reservations
            ):
                reservation = self._reserve(job, c, max_level)
                if reservation is not None:
                    when = reservation.start_at - self.now
                    chip = self.topo.chip_names[c]
                    return Reason(
                        f"waiting for reservation: {job.gpus} {chip} GPUs in "
                        f"{reservation.domain}, expected free in {when:.0f} s",
                        "reservation",
                        {
                            "gpus": job.gpus,
                            "chip": chip,
                            "domain": reservation.domain,
                            "free_in_s": round(when),
                        },
                    )
        return None


def schedule(
    layout: Layout,
    queues: list[QueueSpec],
    running: list[RunningJob],
    pending: list[PendingJob],
    now: float,
    config: SchedulerConfig | None = None,
) -> CycleResult:
    """Run one scheduling cycle over a snapshot; returns decisions and never changes its inputs."""
    return Cycle(layout, queues, running, pending, now, config or SchedulerConfig()).run()
