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

import heapq
from dataclasses import dataclass, replace

import numpy as np

from engine.placement import LEVELS, FreePool, Layout, level_limit
from engine.quota import UNLIMITED, QuotaBook
from engine.workload import (
    MILLI,
    Admission,
    CycleResult,
    PendingJob,
    Preemption,
    QueueSpec,
    Reservation,
    Resize,
    RunningJob,
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


class Cycle:
    """The state of one cycle. Use ``schedule()``; this class keeps the steps readable."""

    def __init__(self, layout: Layout, queues, running, pending, now: float, config: SchedulerConfig):
        self.layout = layout
        self.topo = layout.topo
        self.config = config
        self.now = now
        self.queues = list(queues)
        self.queue_index = {q.name: i for i, q in enumerate(self.queues)}
        self.chip_index = {name: i for i, name in enumerate(self.topo.chip_names)}
        self.running = [j for j in running if len(j.gpus)]
        self.pending = list(pending)
        self.quota = build_quota_book(self.queues, self.topo.chip_names, self.running)
        self.schedulable = self.topo.schedulable()
        owned = np.zeros(self.topo.num_gpus, dtype=bool)
        if self.running:
            owned[np.concatenate([j.gpus for j in self.running])] = True
        # thousandths used on shared GPUs; a shared GPU is never free for whole-GPU jobs
        self.gpu_used = np.zeros(self.topo.num_gpus, dtype=np.int32)
        for job in self.running:
            if job.fractional:
                self.gpu_used[job.gpus] += job.share
        self.shared = np.flatnonzero(self.gpu_used)  # GPUs with fractions on them
        shares = [j.share for j in self.pending if j.fractional]
        self.min_share = min(shares) if shares else MILLI
        self.pool_all = FreePool(layout, self.schedulable & ~owned)
        self.running_by_queue_chip: dict[tuple[int, int], list[RunningJob]] = {}
        self.running_by_chip: dict[int, list[RunningJob]] = {}
        for job in self.running:
            for chip in self._chips_of(job):
                c = self.chip_index.get(chip, -1)
                self.running_by_queue_chip.setdefault((self.queue_index.get(job.queue, -1), c), []).append(
                    job
                )
                self.running_by_chip.setdefault(c, []).append(job)
        self.pool_open = self.pool_all  # becomes a separate pool once something is reserved
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
        self.held: dict[int, tuple[int, set[int], str]] = {}
        self.first_blocked: set[int] = set()  # queues whose first blocked job was seen
        self.quota_blocked = False  # the last job scheduled was refused by quota on every chip
        self.result = CycleResult()

    # --- 1. order ------------------------------------------------------------------------
    def _ordered(self):
        per_queue: dict[int, list[PendingJob]] = {}
        for job in self.pending:
            per_queue.setdefault(self.queue_index.get(job.queue, -1), []).append(job)
        for jobs in per_queue.values():
            jobs.sort(key=lambda j: (-j.priority, j.submitted_at, j.id))
        unknown = per_queue.pop(-1, [])
        for job in unknown:
            self.result.pending[job.id] = f"queue {job.queue} does not exist"
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
        share = self.quota.share(qi, self.queues[qi].weight)
        return (-job.priority, share, job.submitted_at, job.id, qi)

    # --- the cycle -----------------------------------------------------------------------
    def run(self) -> CycleResult:
        self._drain()
        limit, started = self.config.max_start_gpus, 0
        for qi, job in self._ordered():
            self.result.considered += 1
            if limit is not None and started >= limit:
                self.result.start_limited = True
                self.result.pending[job.id] = (
                    f"waiting for the next cycle: this one started {started} GPUs, its limit is {limit}"
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

    # --- 0. drains ------------------------------------------------------------------------
    def _drain(self) -> None:
        """Running work leaves draining nodes: at the node's deadline, or at once without one (it
        is preempted, so it saves first where its policy can, and requeued). A draining node with
        nothing left on it is drained, ready for repair."""
        deadlines = self.topo.drain_deadlines(self.now)
        draining = ~np.isnan(deadlines)
        if not draining.any():
            return
        held = np.zeros(self.topo.num_nodes, dtype=bool)
        for job in self.running:
            nodes = self.topo.gpu_node[job.gpus]
            due = deadlines[nodes]
            on = ~np.isnan(due)
            if not on.any() or self.now < due[on].min():
                held[nodes] = True
                continue
            node = int(nodes[on][np.argmin(due[on])])
            late = self.topo.node_drain_deadline is not None and not np.isnan(
                self.topo.node_drain_deadline[node]
            )
            reason = f"node {self.topo.node_hostname[node]} is draining" + (
                " and its deadline has passed" if late else ""
            )
            self.victims.add(job.id)
            self._charge(job, -1)
            if job.fractional:
                self.gpu_used[job.gpus] -= job.share
            else:  # its GPUs on other nodes are free again
                self.pool_all.give(job.gpus[self.schedulable[job.gpus]])
            self.result.preemptions.append(Preemption(job.id, None, reason))
        self.result.drained = [int(n) for n in np.flatnonzero(draining & ~held)]

    # --- 1b. queueing strategy ---------------------------------------------------------------
    def _held_behind(self, qi: int, job: PendingJob) -> str:
        """Why ``job`` waits behind an earlier job of its queue this cycle ("" when it does not)."""
        held = self.held.get(qi)
        if held is None:
            return ""
        holder, chips, why = held
        if chips and not chips & set(self._chip_options(qi, job)):
            return ""  # it asks for other chip types than the one it waits behind
        return why

    def _hold(self, qi: int, job: PendingJob, reason: str) -> str:
        """Apply the queue's strategy to a job that could not start; returns its pending reason."""
        queue = self.queues[qi]
        if queue.stopped or qi in self.held:
            return reason
        if queue.queueing == "strict_fifo":
            why = f"waiting behind job {job.id}: queue {queue.name} admits its jobs in strict order"
            self.held[qi] = (job.id, set(), why)
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
            return (
                f"{reason} (waited {waited:.0f} s; after {bound:.0f} s queue {queue.name} "
                f"holds its quota for it)"
            )
        chips = [c for c in self._chip_options(qi, job) if self.quota.ceiling(qi, c) >= job.demand]
        if not chips:
            return reason  # its queue could never hold it: holding would block the queue for nothing
        self.held[qi] = (
            job.id,
            set(chips),
            f"waiting behind job {job.id} of queue {queue.name}, pending {waited:.0f} s "
            f"(past the queue's bounded wait of {bound:.0f} s)",
        )
        return (
            f"{reason} (waited {waited:.0f} s, past {bound:.0f} s: queue {queue.name} holds its quota for it)"
        )

    def _chip_options(self, qi: int, job: PendingJob) -> list[int]:
        if job.chip_types:
            return [self.chip_index[c] for c in job.chip_types if c in self.chip_index]
        q = self.queues[qi]
        # No preference: the chip types the queue has quota for, or can borrow, in catalogue order.
        options = [c for c, name in enumerate(self.topo.chip_names) if q.nominal.get(name, 0) > 0]
        if q.cohort:
            options += [
                c
                for c in range(len(self.topo.chip_names))
                if c not in options and self.quota.pool_capacity[self.quota.cohort_of[qi], c] > 0
            ]
        return options

    def _schedule_job(self, qi: int, job: PendingJob) -> str:
        queue = self.queues[qi]
        self.quota_blocked = False
        if queue.stopped:
            return f"queue {queue.name} is stopped"
        if job.fractional:
            return self._admit_fraction(qi, job)
        chips = self._chip_options(qi, job)
        if not chips:
            wanted = ", ".join(job.chip_types) if job.chip_types else "any chip type"
            return f"queue {queue.name} has no quota for {wanted} and its cohort has none to lend"
        max_level = level_limit(job.topology)
        if job.elastic:
            for c in chips:
                if self._admit_elastic(qi, job, c, max_level):
                    return ""
            # from here on it asks for its minimum, like a rigid job of that size
            job = replace(job, gpus=job.min_gpus, min_gpus=None)
        reasons: list[str] = []
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
                    return ""
                blocked_everywhere = (
                    self.pool_all is self.pool_open or self.pool_all.find(c, job.gpus, max_level) is None
                )
                if blocked_everywhere:
                    self.no_room[(c, max_level)] = min(job.gpus, known or job.gpus)
            else:
                blocked_everywhere = True
            if blocked_everywhere:
                capacity_blocked.append(c)  # blocked by capacity, not only by someone's reservation
                self.capacity_blocked_chips.add(c)
            reasons.append(self._placement_reason(job, c, max_level))
        if job.mixed and len(chips) > 1 and self._admit_mixed(qi, job, chips, max_level):
            return ""
        for c in chips:
            if self.result.preemption_attempts >= self.config.max_preemption_attempts:
                reasons.append("preemption deferred to the next cycle (attempt limit reached)")
                break
            if self._admit_by_shrinking(qi, job, c, max_level):
                return ""
            if self._admit_by_preemption(qi, job, c, max_level):
                return ""
        for c in capacity_blocked:
            if (
                len(self.result.reservations) < self.config.max_reservations
                and self.reservation_attempts < 4 * self.config.max_reservations
            ):
                reservation = self._reserve(job, c, max_level)
                if reservation is not None:
                    when = reservation.start_at - self.now
                    return (
                        f"waiting for reservation: {job.gpus} {self.topo.chip_names[c]} GPUs in "
                        f"{reservation.domain}, expected free in {when:.0f} s"
                    )
        return "; ".join(reasons)

    # --- 2./3. admission and placement ----------------------------------------------------
    def _admit_placed(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        placed = self.pool_open.place(c, job.gpus, max_level)
        backfilled = False
        if placed is None and self.pool_open is not self.pool_all and self._ends_before_horizon(job):
            placed = self.pool_all.place(c, job.gpus, max_level)
            backfilled = placed is not None
            if backfilled:
                self.pool_open.take_where_free(placed[0])
        elif placed is not None and self.pool_open is not self.pool_all:
            self.pool_all.take(placed[0])
        if placed is None:
            return False
        gpus, level, domain = placed
        self._record_admission(qi, job, c, gpus, level, domain, backfilled=backfilled)
        return True

    def _ends_before_horizon(self, job: PendingJob) -> bool:
        return job.estimated_duration is not None and self.now + job.estimated_duration <= self.horizon

    def _record_admission(self, qi, job, c, gpus, level, domain, *, backfilled=False, preempted=(), parts=()):
        """``parts``: (chip index, GPUs) per chip type of a mixed-chip gang (``c`` is the first)."""
        self.largest_blocks.clear()
        parts = parts or ((c, len(gpus)),)
        for pc, n in parts:
            self.quota.add(qi, pc, n * job.share)
        names = tuple((self.topo.chip_names[pc], n) for pc, n in parts) if len(parts) > 1 else ()
        chip = self.topo.chip_names[c]
        self.started.append(job.started(gpus, chip, self.now, names))
        self.result.admissions.append(
            Admission(
                job_id=job.id,
                chip=chip,
                gpus=gpus,
                domain=self.layout.domain_name(level, domain),
                borrowed=-(-sum(self.quota.borrowed(qi, pc) for pc, _ in parts) // MILLI),
                backfilled=backfilled,
                preempted=tuple(preempted),
                parts=names,
            )
        )

    def _placement_reason(self, job: PendingJob, c: int, max_level: int) -> str:
        chip = self.topo.chip_names[c]
        level_name = LEVELS[max_level]
        block = self.largest_blocks.get((c, max_level))
        if block is None:
            size, level, domain = self.pool_open.largest_block(c, max_level)
            block = self.largest_blocks[(c, max_level)] = (size, self.layout.domain_name(level, domain))
        size, where = block
        if self.pool_open is not self.pool_all and self.pool_all.find(c, job.gpus, max_level) is not None:
            return (
                f"{job.gpus} {chip} GPUs are free only on GPUs reserved for a larger job starting in "
                f"{self.horizon - self.now:.0f} s; this job "
                + (
                    "has no estimated duration"
                    if job.estimated_duration is None
                    else "would not end before it"
                )
            )
        return f"no {level_name} with {job.gpus} free {chip} GPUs (largest free block: {size} in {where})"

    def _charge(self, job: RunningJob, sign: int) -> None:
        """Add (+1) or take back (-1) a running job's quota, per chip type it holds."""
        qi = self.queue_index[job.queue]
        for chip, amount in job.demand_by_chip():
            self.quota.add(qi, self.chip_index[chip], sign * amount)

    # --- mixed chips -----------------------------------------------------------------------
    def _admit_mixed(self, qi: int, job: PendingJob, chips: list[int], max_level: int) -> bool:
        """Split the gang over several allowed chip types inside the smallest domain that holds it
        (preferred chip types first, each within its quota), when no single type can."""
        sizes = list(range(job.gpus, 0, -1))
        headroom = {c: self._quota_headroom(qi, c, sizes) for c in chips}
        if sum(headroom.values()) < job.gpus:
            return False
        for level in range(max_level + 1):
            usable = sum(np.minimum(self.pool_open.counts(level, c), headroom[c]) for c in chips)
            fits = np.flatnonzero(usable >= job.gpus)
            if not fits.size:
                continue
            domain = int(fits[np.argmin(usable[fits])])
            parts, remaining = [], job.gpus
            for c in chips:
                take = int(min(self.pool_open.counts(level, c)[domain], headroom[c], remaining))
                if take:
                    parts.append((c, take))
                    remaining -= take
                if not remaining:
                    break
            if len(parts) < 2:
                return False  # one type would do: the homogeneous path already said why it did not
            gpus = np.concatenate([self.pool_open.choose(level, domain, c, n) for c, n in parts])
            self.pool_open.take(gpus)
            if self.pool_open is not self.pool_all:
                self.pool_all.take(gpus)
            self._record_admission(qi, job, parts[0][0], gpus, level, domain, parts=parts)
            return True
        return False

    # --- shared GPUs ----------------------------------------------------------------------
    def _admit_fraction(self, qi: int, job: PendingJob) -> str:
        """A fraction of one GPU: onto a shared GPU where it leaves no unusable sliver, else onto a
        fresh GPU of the fullest node (whole nodes stay free for gangs), else onto any shared GPU
        with room."""
        reasons = []
        for c in self._chip_options(qi, job):
            check = self.quota.check(qi, c, job.demand)
            if not check.ok:
                reasons.append(check.reason)
                continue
            gpu = self._shared_gpu(c, job.share, strict=True)
            if gpu is None:
                placed = self.pool_open.place(c, 1, 0)
                if placed is not None:
                    if self.pool_open is not self.pool_all:
                        self.pool_all.take(placed[0])
                    gpu = int(placed[0][0])
                    self.shared = np.append(self.shared, gpu)
            if gpu is None:
                gpu = self._shared_gpu(c, job.share, strict=False)
            if gpu is None:
                reasons.append(f"no {self.topo.chip_names[c]} GPU has {job.share / MILLI:g} of a GPU free")
                continue
            self.gpu_used[gpu] += job.share
            node = int(self.topo.gpu_node[gpu])
            self._record_admission(qi, job, c, np.array([gpu], dtype=np.int64), 0, node)
            return ""
        return "; ".join(reasons)

    def _shared_gpu(self, c: int, share: int, *, strict: bool) -> int | None:
        idx = self.shared
        if not len(idx):
            return None
        left = MILLI - self.gpu_used[idx] - share
        ok = (left >= 0) & (self.topo.gpu_chip[idx] == c) & self.schedulable[idx] & ~self.reserved[idx]
        if strict:
            ok &= (left == 0) | (left >= self.min_share)  # never strand a sliver nobody can use
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        return int(idx[cand[np.argmin(left[cand])]])

    # --- elastic sizes ------------------------------------------------------------------
    def _quota_headroom(self, qi: int, c: int, sizes: list[int]) -> int:
        """The largest of ``sizes`` (descending) the quota allows now, or 0."""
        lo, hi = 0, len(sizes)  # quota checks are monotone in size: binary search
        while lo < hi:
            mid = (lo + hi) // 2
            if self.quota.check(qi, c, sizes[mid] * MILLI).ok:
                hi = mid
            else:
                lo = mid + 1
        return sizes[lo] if lo < len(sizes) else 0

    def _admit_elastic(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        sizes = list(job.sizes())
        allowed = self._quota_headroom(qi, c, sizes)
        if not allowed:
            return False
        block, _, _ = self.pool_open.largest_block(c, max_level)
        size = next((x for x in sizes if x <= min(allowed, block)), 0)
        if not size:
            return False
        return self._admit_placed(qi, replace(job, gpus=size, min_gpus=None), c, max_level)

    def _admit_by_shrinking(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        """Make room by shrinking elastic jobs the policies would let this job evict."""
        candidates = [
            (v, why)
            for v, why in self._victim_candidates(qi, job, c)
            if v.shrinkable and v.id not in self.resized
        ]
        if not candidates:
            return False
        candidates.sort(key=lambda vc: (vc[0].priority, -len(vc[0].gpus)))
        trial = self.pool_open.copy()
        chosen: list[tuple[RunningJob, str, np.ndarray]] = []

        def deficit() -> int:
            quota_short = job.gpus - (self._quota_headroom(qi, c, list(range(job.gpus, 0, -1))) or 0)
            if trial.find(c, job.gpus, max_level) is not None:
                return max(0, quota_short)
            block, _, _ = trial.largest_block(c, max_level)
            return max(quota_short, job.gpus - block, 1)

        for victim, why in candidates:
            need = deficit()
            if need == 0:
                break
            step = victim.size_step
            count = min(victim.shrinkable, -(-need // step) * step)
            release = np.sort(victim.gpus)[len(victim.gpus) - count :]  # the tail: whole nodes first
            trial.give(release[self.schedulable[release] & ~self.reserved[release]])
            self.quota.remove(self.queue_index[victim.queue], c, count * MILLI)
            chosen.append((victim, why, release))
        if deficit() != 0:
            for victim, _, release in chosen:
                self.quota.add(self.queue_index[victim.queue], c, len(release) * MILLI)
            return False
        self.no_room.clear()
        self.largest_blocks.clear()
        for victim, why, release in chosen:
            usable = release[self.schedulable[release] & ~self.reserved[release]]
            self.pool_all.give(usable)
            if self.pool_open is not self.pool_all:
                self.pool_open.give(usable)
            keep = np.setdiff1d(victim.gpus, release)
            self._replace_running(victim, replace(victim, gpus=keep))
            reason = f"shrunk from {len(victim.gpus)} to {len(keep)} GPUs for job {job.id} ({why})"
            self.result.resizes.append(
                Resize(victim.id, len(victim.gpus), keep, np.empty(0, np.int64), release, reason, job.id)
            )
        placed = self.pool_open.place(c, job.gpus, max_level)
        if placed is None:
            raise AssertionError("a shrink simulated to make room did not")  # counts are exact
        if self.pool_open is not self.pool_all:
            self.pool_all.take(placed[0])
        gpus, level, domain = placed
        self._record_admission(qi, job, c, gpus, level, domain)
        return True

    def _replace_running(self, old: RunningJob, new: RunningJob) -> None:
        self.resized.add(old.id)
        self.running = [new if j.id == old.id else j for j in self.running]
        key = (self.queue_index.get(old.queue, -1), self.chip_index.get(old.chip, -1))
        self.running_by_queue_chip[key] = [
            new if j.id == old.id else j for j in self.running_by_queue_chip[key]
        ]

    def _grow(self) -> None:
        """Elastic jobs below their maximum take GPUs no pending job could use this cycle."""
        growing = [
            j for j in self.running if j.growable and j.id not in self.victims and j.id not in self.resized
        ]
        growing.sort(key=lambda j: (-j.priority, j.started_at, j.id))
        for job in growing:
            qi, c = self.queue_index.get(job.queue, -1), self.chip_index.get(job.chip, -1)
            if qi < 0 or c < 0 or self.queues[qi].stopped or c in self.capacity_blocked_chips:
                continue
            level = level_limit(job.topology)
            domain = int(self.layout.node_domain[level][self.layout.gpu_node[job.gpus[0]]])
            room = int(self.pool_open.counts(level, c)[domain])
            step = job.size_step
            sizes = list(range(min(job.growable, room - room % step), 0, -step))
            add = self._quota_headroom(qi, c, sizes) if sizes else 0
            if not add:
                continue
            placed = self.pool_open.place(c, add, level, within=(level, domain))
            if placed is None:
                continue
            if self.pool_open is not self.pool_all:
                self.pool_all.take(placed[0])
            self.quota.add(qi, c, add * MILLI)
            gpus = np.sort(np.concatenate([job.gpus, placed[0]]))
            self._replace_running(job, replace(job, gpus=gpus))
            self.result.resizes.append(
                Resize(
                    job.id,
                    len(job.gpus),
                    gpus,
                    placed[0],
                    np.empty(0, np.int64),
                    f"grew from {len(job.gpus)} to {len(gpus)} GPUs: free {job.chip} GPUs in its "
                    f"{LEVELS[level]}",
                )
            )

    # --- 4. preemption -------------------------------------------------------------------
    def _victim_candidates(self, qi: int, job: PendingJob, c: int) -> list[tuple[RunningJob, str]]:
        queue = self.queues[qi]
        chip = self.topo.chip_names[c]
        cohort = self.quota.cohort_of[qi]
        reclaiming = (
            queue.reclaim_within_cohort != "never"
            and cohort >= 0
            and self.quota.usage[qi, c] + job.demand <= self.quota.nominal[qi, c]
        )
        within = queue.within_queue == "lower_priority"
        if not reclaiming and not within:
            return []
        pool = []
        if within:
            pool += self.running_by_queue_chip.get((qi, c), [])
        if reclaiming:
            for vq in np.flatnonzero(
                (self.quota.cohort_of == cohort) & (self.quota.usage[:, c] > self.quota.nominal[:, c])
            ):
                if vq != qi:
                    pool += self.running_by_queue_chip.get((int(vq), c), [])
        candidates = []
        for victim in pool:
            if victim.id in self.victims or victim.fractional:  # a shared GPU frees only when all leave
                continue
            vq = self.queue_index.get(victim.queue, -1)
            if vq == qi:
                if queue.within_queue == "lower_priority" and victim.priority < job.priority:
                    candidates.append(
                        (victim, f"preempted by higher-priority job {job.id} in queue {queue.name}")
                    )
            elif (
                reclaiming
                and vq >= 0
                and self.quota.cohort_of[vq] == cohort
                and self.quota.borrowed(vq, c) > 0
                and (queue.reclaim_within_cohort == "any" or victim.priority < job.priority)
            ):
                why = (
                    f"preempted by job {job.id}: queue {queue.name} reclaims {chip} quota "
                    f"lent to queue {victim.queue}"
                )
                candidates.append((victim, why))
        candidates.sort(key=lambda vc: (vc[0].lost_work(self.now), vc[0].priority, -vc[0].started_at))
        return candidates

    def _admit_by_preemption(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        candidates = self._victim_candidates(qi, job, c)
        if not candidates:
            return False
        self.result.preemption_attempts += 1
        lay = self.layout
        gpu_chip = self.topo.gpu_chip
        usable = [
            v.gpus[self.schedulable[v.gpus] & ~self.reserved[v.gpus] & (gpu_chip[v.gpus] == c)]
            for v, _ in candidates
        ]
        for level in range(max_level + 1):
            base = self.pool_open.counts(level, c)
            victim_domains = [lay.node_domain[level][lay.gpu_node[g]] for g in usable]
            potential = base.copy()
            for doms in victim_domains:
                np.add.at(potential, doms, 1)
            domains = np.flatnonzero(potential >= job.gpus)
            if not domains.size:
                continue
            domains = domains[np.argsort(potential[domains], kind="stable")][: self.config.max_victim_domains]
            best = None
            for d in domains:
                chosen = self._victims_for_domain(qi, job, c, int(base[d]), d, victim_domains, candidates)
                if chosen is None:
                    continue
                cost = (
                    sum(candidates[i][0].lost_work(self.now) for i in chosen),
                    sum(len(candidates[i][0].gpus) for i in chosen),
                )
                if best is None or cost < best[0]:
                    best = (cost, int(d), chosen)
            if best is not None:
                return self._evict_and_place(
                    qi, job, c, level, best[1], [candidates[i] for i in best[2]], usable, best[2], max_level
                )
        return False

    def _victims_for_domain(self, qi, job, c, free_here, d, victim_domains, candidates):
        """Victims inside the domain first (they free both GPUs and quota), then any others that
        only free quota, each group in preference order, until the gang fits and the quota allows
        it; then drop, in reverse, every victim that turns out not to be needed."""
        gains = [int(np.count_nonzero(doms == d)) for doms in victim_domains]
        order = [i for i, g in enumerate(gains) if g > 0] + [i for i, g in enumerate(gains) if g == 0]

        def satisfied(chosen: list[int], have: int) -> bool:
            return have >= job.gpus and self._quota_ok_without(qi, job, c, [candidates[k][0] for k in chosen])

        chosen: list[int] = []
        have = free_here
        for i in order:
            if satisfied(chosen, have):
                break
            chosen.append(i)
            have += gains[i]
        if not chosen or not satisfied(chosen, have):
            return None
        for i in reversed(list(chosen)):
            rest = [k for k in chosen if k != i]
            if satisfied(rest, have - gains[i]):
                chosen, have = rest, have - gains[i]
        return chosen

    def _quota_ok_without(self, qi, job, c, victims: list[RunningJob]) -> bool:
        for v in victims:
            self._charge(v, -1)
        ok = self.quota.check(qi, c, job.demand).ok
        for v in victims:
            self._charge(v, +1)
        return ok

    def _evict_and_place(self, qi, job, c, level, domain, victims, usable, chosen_idx, max_level) -> bool:
        freed = [usable[i] for i in chosen_idx]
        self.no_room.clear()
        self.largest_blocks.clear()
        for (victim, _), gpus in zip(victims, freed, strict=True):
            self.pool_all.give(gpus)
            if self.pool_open is not self.pool_all:
                self.pool_open.give(gpus)
            self._charge(victim, -1)
        placed = self.pool_open.place(c, job.gpus, max_level, within=(level, domain))
        if placed is None:  # cannot happen when counts are right; undo and report
            for (victim, _), gpus in zip(victims, freed, strict=True):
                self.pool_all.take_where_free(gpus)
                if self.pool_open is not self.pool_all:
                    self.pool_open.take_where_free(gpus)
                self._charge(victim, +1)
            return False
        gpus, lvl, dom = placed
        if self.pool_open is not self.pool_all:
            self.pool_all.take(gpus)
        for victim, why in victims:
            self.victims.add(victim.id)
            self.result.preemptions.append(Preemption(victim.id, job.id, why))
        self._record_admission(qi, job, c, gpus, lvl, dom, preempted=[v.id for v, _ in victims])
        return True

    # --- 5. reservation --------------------------------------------------------------------
    def _ending(self, c: int) -> tuple[list[RunningJob], list[np.ndarray]]:
        """Running jobs of chip ``c`` with an estimated end, soonest first, and their GPUs of that
        chip (those not schedulable or reserved are dropped when given back)."""
        base = self._ending_cache.get(c)
        if base is None:
            c_of = self.topo.gpu_chip
            jobs = sorted(
                (
                    j
                    for j in self.running_by_chip.get(c, [])
                    if not j.fractional and j.estimated_end is not None
                ),
                key=lambda j: j.estimated_end,
            )
            gpus = [
                j.gpus[self.schedulable[j.gpus] & (c_of[j.gpus] == c)] if j.parts else j.gpus for j in jobs
            ]
            base = self._ending_cache[c] = (jobs, gpus)
        chip = self.topo.chip_names[c]
        extra = [
            j
            for j in self.started
            if j.estimated_end is not None and not j.fractional and chip in self._chips_of(j)
        ]
        pairs = [(j, g) for j, g in zip(*base, strict=True) if j.id not in self.victims]
        if extra:
            c_of = self.topo.gpu_chip
            pairs += [(j, j.gpus[c_of[j.gpus] == c]) for j in extra]
            pairs.sort(key=lambda p: p[0].estimated_end)
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @staticmethod
    def _chips_of(job: RunningJob) -> tuple[str, ...]:
        return tuple(p for p, _ in job.parts) if job.parts else (job.chip,)

    def _first_fit(self, job, c, max_level, releasable, first):
        """The smallest k such that the GPUs of the first k+1 ending jobs make room for the gang,
        with the pool and placement at that point, or None. Releases are given back in chunks of
        doubling size (few pool updates), then the chunk that made room is bisected from a copy
        of the pool before it (freeing more GPUs never takes room away, so the answer is exact)."""
        usable = self.schedulable & ~self.reserved  # a cordoned node's GPUs do not come back

        def released(lo: int, hi: int) -> np.ndarray:
            gpus = np.concatenate(releasable[lo:hi])
            return gpus[usable[gpus]]

        trial = self.pool_open.copy()
        trial.give(released(0, first + 1))
        where = trial.find(c, job.gpus, max_level)
        if where is not None:
            return first, trial, where
        i, step, n = first + 1, 1, len(releasable)
        while i < n:
            j = min(n, i + step)
            before = trial.copy()
            trial.give(released(i, j))
            where = trial.find(c, job.gpus, max_level)
            if where is not None:
                lo, hi, best = i, j - 1, (trial, where)
                while lo < hi:
                    mid = (lo + hi) // 2
                    probe = before.copy()
                    probe.give(released(i, mid + 1))
                    spot = probe.find(c, job.gpus, max_level)
                    if spot is None:
                        lo = mid + 1
                    else:
                        hi, best = mid, (probe, spot)
                return hi, best[0], best[1]
            i, step = j, step * 2
        return None

    def _reserve(self, job: PendingJob, c: int, max_level: int) -> Reservation | None:
        """The GPUs the gang will get first, as running jobs end by their estimates: the shortest
        prefix of ending jobs whose GPUs make a placement possible."""
        self.reservation_attempts += 1
        ending, releasable = self._ending(c)
        if not releasable:
            return None
        counts = np.cumsum([len(g) for g in releasable])
        need = job.gpus - self.pool_open.total(c)
        if counts[-1] < need:
            return None  # even when every running job with an estimate ends, it would not fit

        found = self._first_fit(job, c, max_level, releasable, int(np.searchsorted(counts, need)))
        if found is None:
            return None
        hi, trial, where = found
        chosen = trial.choose(*where, c, job.gpus)
        start = max(ending[hi].estimated_end, self.now)
        if self.pool_open is self.pool_all:
            self.pool_open = self.pool_all.copy()
        self.reserved[chosen] = True
        self.pool_open.take_where_free(chosen)
        self.largest_blocks.clear()
        self.horizon = min(self.horizon, start)
        reservation = Reservation(
            job.id, self.topo.chip_names[c], chosen, start, self.layout.domain_name(*where)
        )
        self.result.reservations.append(reservation)
        return reservation


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
