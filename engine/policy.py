"""A checkpoint policy as one value: how a job saves its state and how it recovers from a fault.

Production (scheduling.models.CheckpointPolicy converts to and from it), the cluster simulator
(sim.config) and the ETTR model (sim.reliability) all read this one shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint import CheckpointKind
from engine.tiers import DEFAULT_REPLICA_GROUPS, RecoveryTier


@dataclass(frozen=True)
class CheckpointPolicy:
    """``kind`` None: the job saves nothing (a fault loses everything since it started).
    ``interval_s`` None: auto, the Young/Daly interval for the job (never shorter than the
    durable write). ``triggered_success``: the chance a save triggered at a fault succeeds when
    GPU memory is readable. ``tier``: how a fault is found and recovered from (engine.tiers);
    ``replica_groups``: the data-parallel replica groups, for the replica-groups tier."""

    kind: CheckpointKind | None = CheckpointKind.ASYNC
    interval_s: float | None = None
    triggered_success: float = 0.95
    tier: str = RecoveryTier.RESTART
    replica_groups: int = DEFAULT_REPLICA_GROUPS
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or (self.kind.value if self.kind else "none")

    @property
    def saves_from_memory(self) -> bool:
        """Asynchronous and triggered saves keep a copy in host memory to restore from."""
        return self.kind in (CheckpointKind.ASYNC, CheckpointKind.TRIGGERED)

    @property
    def triggered(self) -> bool:
        return self.kind == CheckpointKind.TRIGGERED


NO_POLICY = CheckpointPolicy(kind=None, name="none")
