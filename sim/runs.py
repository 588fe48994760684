"""A simulated job's runs: what it still has to do, where it runs, and where its time went.

Training progress is accounted in GPU-seconds of work. A running job checkpoints every tau
seconds of productive time (its policy: periodic synchronous with a stall of state size over
storage bandwidth, asynchronous with a short copy to host memory, or triggered with an
asynchronous fallback; tau fixed or Daly's optimum for the job's fault rate); a fault loses the
work since the last checkpoint (none when a triggered save succeeds), costs the detection latency
and a restart (reschedule, process start, communicator initialization, checkpoint load). A
preempted job keeps what its policy could save, as in production. Each job's time is split into
productive time and the loss buckets of the ETTR definition (engine.ettr).

These functions change one job; the simulation (sim.simulation) owns the clock, the GPUs'
owners and the events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.ettr import Ettr
from engine.lifecycle import checkpoint_bytes, unsaved_s
from engine.network import model_for
from engine.physics import Physics
from engine.policy import CheckpointPolicy
from engine.sites import SPANNING
from engine.workload import PendingJob, RunningJob
from sim.config import job_timing
from sim.workload import SimJob


@dataclass
class JobRun:
    """One simulated job: its spec, the work it still has to do and its current run."""

    spec: SimJob
    remaining: float  # GPU-seconds of work still to do
    held: np.ndarray | None = None  # the GPU indices it runs on (None: not running)
    run_start: float = 0.0  # productive work starts here (after restart overheads)
    interval: float = 3600.0
    stall_fraction: float = 0.0
    overhead: float = 0.0  # share of time given to the replica groups' quorum (degraded)
    rollback: float = 3600.0  # a fault rolls back to a multiple of this (engine.tiers)
    slowdown: float = 0.0  # how much slower its steps run across datacenters (engine.sites)
    step_s: float = 1.0
    version: int = 0  # raised at every start, stop and recovery: older end events are ignored
    first_admit: float | None = None
    waiting_since: float | None = None
    ended: float | None = None
    ettr: Ettr = field(default_factory=Ettr)  # its loss buckets (the wall time is set at the summary)
    interruptions: int = 0

    @classmethod
    def of(cls, spec: SimJob) -> JobRun:
        return cls(spec, spec.work_s * spec.gpus)

    @property
    def size(self) -> int:
        """How many GPUs it runs on now (0: not running)."""
        return len(self.held) if self.held is not None else 0

    @property
    def keep(self) -> float:
        """The share of its run time that trains (less checkpoint stalls and the quorum's share)."""
        return 1 - self.stall_fraction - self.overhead

    def finish_time(self) -> float:
        """When its remaining work is done at its size, if nothing interrupts it."""
        return self.run_start + self.remaining / self.size / max(1e-9, self.keep)

    def checkpoints(self, now: float) -> int:
        """Checkpoints its run has written by ``now``."""
        return math.floor(max(0.0, now - self.run_start) / self.interval)

    def unsaved_s(self, at: float) -> float:
        """Training seconds a fault at ``at`` would lose: back to the last rollback point
        (engine.lifecycle.unsaved_s), less the stalls and the quorum's share."""
        return unsaved_s(at, self.run_start, None, every=self.rollback) * self.keep

    def account(self, at: float) -> float:
        """Its run's checkpoint stalls and quorum share up to ``at``; returns the run's seconds."""
        elapsed = max(0.0, at - self.run_start)
        self.ettr.add("checkpoint_stall", elapsed * self.stall_fraction)
        self.ettr.add("degraded", elapsed * self.overhead)
        return elapsed


def as_pending(job: JobRun) -> PendingJob:
    """The job as the scheduler sees it pending: asking for what it still has to do."""
    spec = job.spec
    return PendingJob(
        spec.id,
        spec.queue,
        spec.gpus,
        spec.priority,
        (spec.chip,),
        spec.topology,
        spec.arrival,
        job.remaining / spec.gpus,
        spec.min_gpus,
        spec.size_step,
        model=model_for(spec.parameters) if spec.topology in SPANNING and spec.parameters else None,
    )


def as_running(job: JobRun, now: float) -> RunningJob:
    """The job as the scheduler sees it running: its GPUs, expected end and last checkpoint."""
    spec = job.spec
    done = job.checkpoints(now)
    return RunningJob(
        spec.id,
        spec.queue,
        job.held,
        spec.chip,
        spec.priority,
        job.first_admit or now,
        job.finish_time(),
        job.run_start + done * job.interval if done else None,
        min_gpus=spec.min_gpus,
        max_gpus=spec.gpus if spec.min_gpus is not None else None,
        size_step=spec.size_step,
        topology=spec.topology,
    )


def set_policy(job: JobRun, choice: CheckpointPolicy, ph: Physics) -> None:
    """Checkpoint interval, stall, rollback and overhead for the job at its size; across
    datacenters its steps are slower by its ``slowdown`` as well."""
    t = job_timing(choice, job.spec.parameters, job.size, ph)
    job.interval, job.stall_fraction, job.step_s = t.interval, t.stall_fraction, t.step_s
    job.rollback, job.overhead = t.rollback, t.overhead + job.slowdown / (1 + job.slowdown)


def start(job: JobRun, held: np.ndarray, now: float, ph: Physics, *, resumed: bool, slowdown: float) -> None:
    """A run begins on ``held`` now: the wait so far and the restart's overheads (process start,
    communicator, and for a resumed job rescheduling and the checkpoint's load) are accounted.
    ``slowdown``: how much slower its steps are where it is placed (0 inside one datacenter).
    The caller sets the checkpoint policy (set_policy) after this."""
    size = len(held)
    job.held = np.asarray(held, dtype=np.int64)
    job.slowdown = slowdown
    overhead = ph.process_start_s + ph.comm_init_s(size)
    if resumed:
        state = checkpoint_bytes(job.spec.parameters, ph)
        overhead += ph.reschedule_s + state / (ph.storage_gbps(size) * 1e9)
    if job.first_admit is None:
        job.first_admit = now
    if job.waiting_since is not None:
        job.ettr.add("waiting", now - job.waiting_since)
        job.waiting_since = None
    job.ettr.add("restart", overhead)
    job.run_start = now + overhead
    job.version += 1


def save(job: JobRun, at: float, *, saves: bool) -> float:
    """Account the run up to ``at``; returns the GPU-seconds lost. ``saves``: the policy saved
    the state now (a graceful stop of an on-demand policy, or a triggered save that worked), so
    nothing is lost; otherwise the work since the last rollback point is (engine.lifecycle)."""
    done = job.account(at) * job.keep * job.size
    lost = 0.0 if saves else job.unsaved_s(at) * job.size
    job.ettr.add("lost_work", lost / job.size)
    job.remaining = max(0.0, job.remaining - (done - lost))
    job.run_start = at
    return lost


def finish(job: JobRun, now: float) -> None:
    """The job's work is done now: its last run's stalls and quorum share are accounted."""
    job.account(now)
    job.remaining = 0.0
    job.held = None
    job.ended = now


def recovered(job: JobRun, held: np.ndarray, now: float, plan) -> None:
    """The job goes on in place on ``held`` after a fault, as its recovery plan (engine.recovery)
    says: the restart after detection, and the time it trained on without a replica group."""
    detection = plan.steps[0].seconds
    job.held = held
    job.ettr.add("restart", plan.seconds - detection)  # reschedule + restart + load, as planned
    job.ettr.add("degraded", plan.degraded_s)
    job.run_start = now + plan.seconds + plan.degraded_s
    job.version += 1
