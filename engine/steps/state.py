"""The state of one scheduling cycle, explicit: what the steps (the other modules of
engine.steps) read and change as they decide. ``engine.scheduler.run`` takes the steps in order.

What it holds: the layout and topology, the queues and the quota book (usage as the cycle
admits), the free pools and the spare pool, the GPU shares in use on shared GPUs, the running jobs
by queue and chip, what this cycle started, evicted, resized and reserved, the queues held behind
a blocked job (``queue_holds``), per-cycle caches (chip options, the lowest-priority candidates,
ending jobs, the largest free blocks, the gang sizes that found no room), and the result.
"""

from __future__ import annotations

import numpy as np

from engine import arrays
from engine.placement import FreePool, Layout
from engine.pools import Pools
from engine.quota import build_quota_book
from engine.reasons import Reason
from engine.scheduler_config import SchedulerConfig
from engine.workload import MILLI, CycleResult, Reservation, RunningJob


def chips_of(job: RunningJob) -> tuple[str, ...]:
    """The chip types a running job holds (a mixed-chip job has several parts)."""
    return tuple(p for p, _ in job.parts) if job.parts else (job.chip,)


def _reachable(layout: Layout, unreachable) -> np.ndarray:
    """GPUs outside the datacenters a partition cuts off (all of them without one)."""
    if unreachable is None or not np.any(unreachable):
        return np.ones(layout.topo.num_gpus, dtype=bool)
    return ~np.asarray(unreachable, dtype=bool)[layout.node_domain[3][layout.gpu_node]]


class RunningIndex:
    """The running jobs with what every cycle derives from them, in one pass: quota usage in
    thousandths per (queue, chip) name, the jobs by those names and by chip name, the fractional
    ones, the GPUs they hold and the running count of each job array. A caller that keeps its
    running jobs between cycles (scheduling.running) keeps one of these too and extends it with the
    jobs started since, in id order, instead of a pass over 100,000 jobs each cycle: extending
    the index of a list gives what the index of the longer list would. Jobs that hold no GPU are
    left out. Each job is charged its GPUs of each chip times its share, as
    ``RunningJob.demand_by_chip`` says, keyed by names (three dict lookups a job)."""

    def __init__(self, running=()) -> None:
        self.jobs: list[RunningJob] = []
        self.usage: dict[tuple[str, str], int] = {}
        self.named: dict[tuple[str, str], list[RunningJob]] = {}
        self.by_chip_name: dict[str, list[RunningJob]] = {}
        self.fractional: list[RunningJob] = []
        self.array_running: dict[int, int] = {}  # array id -> its jobs running
        self._held: list[np.ndarray] = []
        self._owned = np.zeros(0, dtype=np.int64)  # every held GPU, joined once when asked
        self.extend(running)

    def extend(self, running) -> None:
        usage, named, by_chip_name = self.usage, self.named, self.by_chip_name
        holding = [job for job in running if len(job.held)]
        arrays.running_counts(holding, self.array_running)
        for job in holding:
            self.jobs.append(job)
            self._held.append(job.held)
            queue, share = job.queue, job.share
            if share < MILLI:
                self.fractional.append(job)
            for chip, n in job.gpus_by_chip():
                key = (queue, chip)
                usage[key] = usage.get(key, 0) + n * share
                jobs = named.get(key)
                if jobs is None:
                    jobs = named[key] = []
                jobs.append(job)
                jobs = by_chip_name.get(chip)
                if jobs is None:
                    jobs = by_chip_name[chip] = []
                jobs.append(job)

    def owned(self) -> np.ndarray:
        """The snapshot indices of every GPU the jobs hold."""
        if self._held:
            self._owned = np.concatenate([self._owned, *self._held])
            self._held = []
        return self._owned

    def maps(self, queue_index: dict, chip_index: dict):
        """Fresh for one cycle (the cycle may replace entries; this index is kept): quota usage
        by (queue, chip) name, the jobs by (queue index, chip index) and by chip index, the
        fractional jobs. Names become indices once per key, an unknown name as -1 (lists that land
        on the same index key are joined in the order their names were first seen)."""
        by_queue_chip: dict[tuple[int, int], list[RunningJob]] = {}
        for (queue, chip), jobs in self.named.items():
            key = (queue_index.get(queue, -1), chip_index.get(chip, -1))
            by_queue_chip[key] = by_queue_chip[key] + jobs if key in by_queue_chip else list(jobs)
        by_chip: dict[int, list[RunningJob]] = {}
        for chip, jobs in self.by_chip_name.items():
            c = chip_index.get(chip, -1)
            by_chip[c] = by_chip[c] + jobs if c in by_chip else list(jobs)
        return dict(self.usage), by_queue_chip, by_chip, list(self.fractional)


class CycleState:
    def __init__(
        self, layout: Layout, queues, running, pending, now: float, config: SchedulerConfig, **sites
    ):
        self.layout = layout
        # sites: links (engine.sites.SiteLinks with the crossing jobs' loads; None: no site model) and
        # unreachable (bool over datacenters a partition cuts off: nothing new goes there)
        self.links = sites.get("links")
        self.topo = layout.topo
        self.config = config
        self.now = now
        self.queues = list(queues)
        self.queue_index = {q.name: i for i, q in enumerate(self.queues)}
        self.chip_index = {name: i for i, name in enumerate(self.topo.chip_names)}
        index = running if isinstance(running, RunningIndex) else RunningIndex(running)
        self.running = list(index.jobs)
        self.pending = list(pending)
        usage, self.running_by_queue_chip, self.running_by_chip, fractional = index.maps(
            self.queue_index, self.chip_index
        )
        self.quota = build_quota_book(self.queues, self.topo.chip_names, [], usage_by=usage)
        reachable = _reachable(layout, sites.get("unreachable"))
        self.schedulable = self.topo.schedulable() & reachable
        owned = np.zeros(self.topo.num_gpus, dtype=bool)
        owned[index.owned()] = True
        # thousandths used on shared GPUs; a shared GPU is never free for whole-GPU jobs
        self.gpu_used = np.zeros(self.topo.num_gpus, dtype=np.int32)
        for job in fractional:
            self.gpu_used[job.held] += job.share
        self.shared = np.flatnonzero(self.gpu_used)  # GPUs with fractions on them
        shares = [j.share for j in self.pending if j.fractional]
        self.min_share = min(shares) if shares else MILLI
        self.share_mixes: dict = {}  # chip -> the kinds of work fractions are packed against
        self.pools = Pools(layout, self.schedulable & ~owned)
        # free GPUs of spare nodes, for queues allowed to borrow them (built when first asked)
        self.spare_free = self.topo.usable() & self.topo.node_spare[self.topo.gpu_node] & ~owned & reachable
        self.spare_pool: FreePool | None = None
        # (chip, level limit) -> the smallest job that found no room on spares this cycle (the
        # spare pool only shrinks within a cycle)
        self.no_spare_room: dict[tuple[int, int], int] = {}
        self.lowest_cache: dict[tuple[int, int], tuple[list, float]] = {}  # engine.steps.preemption
        # (queue, chip) -> (its running list, (its jobs in eviction order, their priorities))
        self.eviction_order: dict[tuple[int, int], tuple[list, tuple[list, list]]] = {}
        self.eviction_keys: dict = {}  # running job -> its place in the eviction order
        self.borrowers: dict[tuple[int, int], tuple[tuple, list[int]]] = {}  # (cohort, chip) -> queues
        self.any_shrinkable: bool | None = None  # engine.steps.elasticity, asked once a cycle
        self.reserved = np.zeros(self.topo.num_gpus, dtype=bool)
        self.horizon = float("inf")  # earliest reservation start
        self.reservation_attempts = 0
        self.ending_cache: dict[int, tuple] = {}
        # (chip, level limit) -> the smallest gang that found no room this cycle
        self.no_room: dict[tuple[int, int], int] = {}
        # (chip, level limit) -> (size, name) of the largest free block, for reasons
        self.largest_blocks: dict[tuple[int, int], tuple[int, str]] = {}
        self.placement_reasons: dict[tuple[int, int, int], Reason] = {}  # (chip, level, GPUs) -> why
        self.victims: set[int] = set()
        self.resized: set[int] = set()  # elastic jobs shrunk or grown this cycle
        self.capacity_blocked_chips: set[int] = set()  # chips some pending job found no room on
        self.started: list[RunningJob] = []  # admitted this cycle, as running jobs
        # queue index -> the job its later jobs wait behind (engine.steps.ordering.QueueHold)
        self.queue_holds: dict = {}
        self.array_running = dict(index.array_running)  # array id -> its jobs running
        self.array_reasons: dict = {}  # array id -> why its jobs past the limit wait (engine.arrays)
        self.first_blocked: set[int] = set()  # queues whose first blocked job was seen
        self.quota_blocked = False  # the last job scheduled was refused by quota on every chip
        self.borrow_blocked: Reason | None = (
            None  # why the last preemption attempt was refused while borrowing
        )
        self.options_cache: dict[tuple, list[int]] = {}  # (queue, chip types) -> chip options
        self.span_waits: dict[int, str] = {}  # job -> why it waits rather than span datacenters
        self.span_reserved: dict[int, Reservation] = {}  # mixed-chip gangs that wait, and their room
        self.result = CycleResult()
