"""What the scheduler reads and returns: queues, pending and running jobs, and its decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from engine.lifecycle import unsaved_s
from engine.reasons import Reason
from engine.steptime import ModelSpec

MILLI = 1000  # a whole GPU, in the thousandths that shared GPUs are counted in


class Reclaim(StrEnum):
    """Whom a queue below its nominal quota may preempt in the cohort's borrowing queues."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"  # their jobs of lower priority than the one it admits
    ANY = "any"


class WithinQueue(StrEnum):
    """Whom a job may preempt in its own queue."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"


class Queueing(StrEnum):
    """How a queue admits its jobs. Backfill (the default): the quota a job blocked by quota waits
    for is reserved for it at once; a later job of its queue on its chip types may use it only if
    its estimated end comes before the blocked job's expected start (Slurm's backfill, applied to
    quota). Strict FIFO: a job that cannot start blocks every later job of its queue. Best effort:
    later jobs may pass a blocked one, but once a job blocked by quota has waited ``head_wait_s``
    the queue's later jobs on its chip types wait for it (its quota is held for it)."""

    BACKFILL = "backfill"
    BEST_EFFORT = "best_effort"
    STRICT_FIFO = "strict_fifo"


RECLAIM_POLICIES = tuple(Reclaim)
WITHIN_QUEUE_POLICIES = tuple(WithinQueue)
QUEUEING_STRATEGIES = tuple(Queueing)
DEFAULT_HEAD_WAIT_S = 600.0


@dataclass(frozen=True)
class QueueSpec:
    name: str
    cohort: str | None = None
    priority: int = 0
    weight: float = 1.0
    nominal: dict[str, int] = field(default_factory=dict)  # chip type -> GPUs
    borrowing_limit: dict[str, int | None] = field(default_factory=dict)  # None or absent: no limit
    lending_limit: dict[str, int | None] = field(default_factory=dict)  # None or absent: all nominal
    reclaim_within_cohort: Reclaim = Reclaim.NEVER
    within_queue: WithinQueue = WithinQueue.NEVER
    stopped: bool = False
    queueing: Queueing = Queueing.BACKFILL
    head_wait_s: float | None = DEFAULT_HEAD_WAIT_S  # best effort: the bounded wait (None: unbounded)
    # its jobs may run on spare nodes when nothing else is free; fault recovery takes them back
    may_use_spares: bool = False
    # preempting while borrowing (Kueue's borrowWithinCohort): None, the default, never; a number:
    # a job that would borrow may preempt jobs of priority up to it that its policies allow
    borrow_preempt_max_priority: int | None = None

    def __post_init__(self) -> None:
        # policies given by name become their enums; an unknown name fails here, naming the field
        for name, kind in (
            ("reclaim_within_cohort", Reclaim),
            ("within_queue", WithinQueue),
            ("queueing", Queueing),
        ):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                known = ", ".join(kind)
                raise ValueError(
                    f"{name}: unknown policy {value!r} of queue {self.name}; known: {known}"
                ) from None


@dataclass(frozen=True)
class PendingJob:
    id: int
    queue: str
    gpus: int
    priority: int = 0
    chip_types: tuple[str, ...] = ()  # allowed chip types in order of preference; empty: any
    topology: str = "datacenter"  # largest domain the gang may span: node .. region, or any
    submitted_at: float = 0.0
    estimated_duration_s: float | None = None  # seconds; None: unknown (never backfilled)
    min_gpus: int | None = None  # elastic: the smallest size it runs at; None: rigid (gpus)
    size_step: int = 1  # elastic sizes are multiples of this (8: whole nodes)
    share: int = MILLI  # thousandths of each GPU; below 1000 (with gpus == 1): a shared GPU
    mixed: bool = False  # may be split over several of its allowed chip types
    model: ModelSpec | None = None  # what it trains, for the cost of spanning datacenters
    array: int | None = None  # the job array it belongs to (engine.arrays)
    array_limit: int | None = None  # at most this many of the array's jobs run at once

    @property
    def fractional(self) -> bool:
        return self.share < MILLI

    @property
    def demand(self) -> int:
        """Quota this job is charged, in thousandths of a GPU."""
        return self.gpus * self.share

    def started(self, held: np.ndarray, chip: str, now: float, parts=()) -> RunningJob:
        """This job as a running job, admitted at ``now`` on the GPU indices ``held``."""
        end = now + self.estimated_duration_s if self.estimated_duration_s is not None else None
        return RunningJob(
            self.id,
            self.queue,
            held,
            chip,
            self.priority,
            now,
            end,
            now,
            min_gpus=self.min_gpus,
            max_gpus=self.gpus if self.elastic else None,
            size_step=self.size_step,
            topology=self.topology,
            share=self.share,
            parts=tuple(parts),
            array=self.array,
        )

    @property
    def elastic(self) -> bool:
        return self.min_gpus is not None and self.min_gpus < self.gpus

    def sizes(self) -> range:
        """Sizes this job may run at, largest first (rigid: just ``gpus``)."""
        if not self.elastic:
            return range(self.gpus, self.gpus - 1, -1)
        return range(self.gpus, self.min_gpus - 1, -self.size_step)


@dataclass(slots=True, eq=False)  # not frozen: a cycle builds up to 100,000, a frozen __init__ is 3x slower
class RunningJob:
    id: int
    queue: str
    held: np.ndarray  # the GPU indices it holds in the snapshot (a request's size is ``gpus``)
    chip: str
    priority: int = 0
    started_at: float = 0.0
    estimated_end: float | None = None
    last_checkpoint_at: float | None = None  # None: no checkpoint yet (all work since start is lost)
    min_gpus: int | None = None  # elastic: may shrink down to this; None: rigid
    max_gpus: int | None = None  # elastic: may grow back up to this
    size_step: int = 1
    topology: str = "datacenter"
    share: int = MILLI  # thousandths of each of its GPUs it uses (below 1000: a shared GPU)
    parts: tuple[tuple[str, int], ...] = ()  # a mixed-chip job: (chip, GPUs) per chip type
    array: int | None = None  # the job array it belongs to (counted against the array's limit)

    @property
    def fractional(self) -> bool:
        return self.share < MILLI

    @property
    def demand(self) -> int:
        return len(self.held) * self.share

    def gpus_by_chip(self) -> tuple[tuple[str, int], ...]:
        """(chip, GPUs) this job holds per chip type."""
        return self.parts or ((self.chip, len(self.held)),)

    def demand_by_chip(self) -> tuple[tuple[str, int], ...]:
        """(chip, thousandths) this job is charged per chip type: its GPUs of each, times its share
        of each GPU (engine.steps.state charges 100,000 jobs a cycle with the same product)."""
        return tuple((chip, n * self.share) for chip, n in self.gpus_by_chip())

    @property
    def shrinkable(self) -> int:
        """GPUs this job can give up by shrinking (0 for a rigid job)."""
        if self.min_gpus is None:
            return 0
        spare = len(self.held) - self.min_gpus
        return max(0, spare - spare % self.size_step)

    @property
    def growable(self) -> int:
        if self.max_gpus is None:
            return 0
        room = self.max_gpus - len(self.held)
        return max(0, room - room % self.size_step)

    def lost_work(self, now: float) -> float:
        """GPU-seconds of work lost if this job were evicted now without a save."""
        return unsaved_s(now, self.started_at, self.last_checkpoint_at) * len(self.held)


@dataclass(frozen=True)
class Admission:
    job_id: int
    chip: str
    held: np.ndarray  # the GPU indices it will hold (its size is len(held))
    domain: str  # the smallest domain holding the whole gang, e.g. "pod bj1-p03"
    borrowed: int  # GPUs above the queue's nominal quota after this admission
    backfilled: bool = False  # placed on GPUs reserved for a larger job, ending before it starts
    preempted: tuple[int, ...] = ()
    parts: tuple[tuple[str, int], ...] = ()  # a mixed-chip job: (chip, GPUs) per chip type
    on_spares: bool = False  # on spare nodes its queue may borrow: recovery may take them back
    congested: bool = False  # spans nodes of a pod whose fabric is congested: no clear domain had room
    span_note: str = ""  # spans datacenters: why, with the slowdown and the wait it saves
    span_slowdown: float = 0.0  # its modelled step time there over inside one datacenter, less 1
    link_loads: tuple[tuple[tuple[int, int], float], ...] = ()  # (datacenter pair, bytes/s) it takes


@dataclass(frozen=True)
class Preemption:
    job_id: int
    by_job: int | None  # the job it made room for; None: the controller moved it (a drain)
    reason: str


@dataclass(frozen=True)
class Reservation:
    job_id: int
    chip: str
    held: np.ndarray  # the GPU indices reserved for it
    start_at: float
    domain: str


@dataclass(frozen=True)
class Resize:
    """An elastic job changes size: it keeps running on ``held`` (its whole new set)."""

    job_id: int
    old_size: int
    held: np.ndarray  # the GPU indices it holds after the resize
    added: np.ndarray  # GPUs it gained (empty when shrinking)
    released: np.ndarray  # GPUs it gave up (empty when growing)
    reason: str
    by_job: int | None = None  # the job it shrank for

    @property
    def new_size(self) -> int:
        return len(self.held)


@dataclass
class CycleResult:
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    pending: dict[int, Reason] = field(default_factory=dict)  # job id -> why it is still pending
    considered: int = 0
    preemption_attempts: int = 0
    start_limited: bool = False  # the start limit left jobs for the next cycle
    drained: list[int] = field(default_factory=list)  # draining nodes (indices) with no work left
    span_decisions_s: list[float] = field(default_factory=list)  # each span-or-wait decision's time
