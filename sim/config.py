"""What a what-if simulation is asked: its length, seed, periods, checkpoint policy, physics,
fleet and scheduler settings, and the default queues of a simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.checkpoint import CheckpointKind
from engine.physics import Physics
from engine.scheduler import SchedulerConfig
from engine.workload import QueueSpec
from sim.fleet import FleetConfig


@dataclass(frozen=True)
class CheckpointChoice:
    kind: CheckpointKind = CheckpointKind.ASYNC
    interval_s: float | None = None  # None: Daly's optimum for the job
    triggered_success: float = 0.95


@dataclass(frozen=True)
class SimConfig:
    days: float = 7.0
    seed: int = 0
    cycle_period_s: float = 300.0
    sample_period_s: float = 3600.0
    checkpoint: CheckpointChoice = field(default_factory=CheckpointChoice)
    physics: Physics = field(default_factory=Physics)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = False
    name: str = "baseline"


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
