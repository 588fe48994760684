"""What a what-if simulation is asked: its length, seed, periods, checkpoint policy, physics,
fleet and scheduler settings, and the default queues of a simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.checkpoint import CheckpointKind, daly_interval, stall_seconds
from engine.lifecycle import checkpoint_bytes
from engine.physics import Physics
from engine.policy import CheckpointPolicy
from engine.scheduler import SchedulerConfig
from engine.tiers import (
    coordination_share,
    rollback_interval,
    step_seconds,
)
from engine.workload import QueueSpec
from sim.fleet import FleetConfig


@dataclass(frozen=True)
class JobTiming:
    interval: float  # seconds between checkpoints
    stall_fraction: float  # of the run's time, stalled by checkpoints
    step_s: float
    rollback: float  # a fault rolls back to a multiple of this (engine.tiers)
    overhead: float  # of the run's time, given to the replica groups' quorum


def job_timing(choice: CheckpointPolicy, parameters: float | None, size: int, ph: Physics) -> JobTiming:
    """A job's checkpoint interval (Daly's when auto) and stall at its size, and where its tier
    lets a fault roll back to."""
    state = checkpoint_bytes(parameters, ph)
    stall = stall_seconds(choice.kind, state, size, ph.storage_gbps(size), ph.host_copy_gbps)
    write = state / (ph.storage_gbps(size) * 1e9) if state else 0.0
    if choice.interval_s is not None:
        tau = choice.interval_s
    else:
        mtbf = 86_400.0 / (ph.gpu_interruptions_per_day * max(size, 1))
        tau = daly_interval(stall, mtbf) if stall > 0 else 600.0
    if choice.kind != CheckpointKind.PERIODIC:
        tau = max(tau, write)
    interval = max(tau, 1.0)
    step_s = max(1.0, step_seconds(parameters or 0.0, size))
    kw = {"state": state, "gpus": size, "step_s": step_s, "replica_groups": choice.replica_groups, "ph": ph}
    rollback = max(1.0, rollback_interval(choice.tier, interval, **kw))
    grouped = size >= 2 * choice.replica_groups
    overhead = coordination_share(choice.tier, step_s) if grouped else 0.0
    return JobTiming(interval, min(0.9, stall / interval) if state else 0.0, step_s, rollback, overhead)


@dataclass(frozen=True)
class SimConfig:
    days: float = 7.0
    seed: int = 0
    cycle_period_s: float = 300.0
    sample_period_s: float = 3600.0
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    physics: Physics = field(default_factory=Physics)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = False
    name: str = "baseline"
    # (datacenter index, from s, until s): out of the control plane's reach; nothing new is placed
    # there meanwhile and the work inside runs on (a site partition)
    partitions: tuple[tuple[int, float, float], ...] = ()


def default_queues(capacity: dict[str, int], inference: dict[str, int] | None = None) -> list[QueueSpec]:
    """Cohort 'shared': pretrain (60%, priority 10, reclaims lent quota), research (25%), dev (15%)
    of what ``inference`` (GPUs per chip type, priority 20, reclaims anything) leaves."""
    inference = inference or {}
    split = {"pretrain": 0.6, "research": 0.25, "dev": 0.15}
    queues = [
        QueueSpec(
            name,
            cohort="shared",
            priority=10 if name == "pretrain" else 0,
            nominal={c: int((n - inference.get(c, 0)) * share) for c, n in capacity.items()},
            reclaim_within_cohort="any" if name == "pretrain" else "never",
        )
        for name, share in split.items()
    ]
    if inference:
        queues.append(
            QueueSpec(
                "inference",
                cohort="shared",
                priority=20,
                nominal=dict(inference),
                reclaim_within_cohort="any",
            )
        )
    return queues
