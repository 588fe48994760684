"""The scheduler's limits per cycle (engine.scheduler)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_reservations: int = 4  # blocked gangs that hold reservations at once
    max_preemption_attempts: int = 64  # per cycle; the rest wait for the next cycle
    max_victim_domains: int = 16  # candidate domains examined per preemption attempt
    # GPUs one cycle may start (None: no limit); the jobs after it wait for the next cycle, which
    # the caller runs at once. It bounds a cycle's writes (like Slurm's sched_max_job_start).
    max_start_gpus: int | None = None
    # jobs one cycle may start (None: no limit): a stream of small jobs (arrays) keeps each cycle
    # short and the next one follows at once; the caller reads no more than this many pending jobs
    # of one array per cycle (scheduling.pending.load_pending's window)
    max_starts: int | None = None
    # gangs allowed to span datacenters (topology region or any): "never", "whenever" no single
    # datacenter holds them, or when it "pays" (engine.sites); the margin the wait saved must
    # beat the time lost by (the share of a link placements may take is the links' own setting)
    span_policy: str = "pays"
    span_margin: float = 0.1
