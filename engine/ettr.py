"""Effective training time (ETTR) accounting: one type for every world that measures it.

ETTR = time with forward progress that survived / wall time. Every second of a job's wall time
that did not make durable progress falls in exactly one loss bucket; productive time is the wall
time less the buckets. The job page and the ETTR API (scheduling.ettr, from the job's events),
the cluster simulator's summary (sim.summary) and the one-job ETTR model (sim.reliability) all
keep an ``Ettr`` and read its ratio and shares, so the arithmetic is written once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# "degraded" is the throughput a job gives up while one of its replica groups is out or to the
# groups' per-step quorum (engine.tiers).
ETTR_BUCKETS: tuple[str, ...] = (
    "checkpoint_stall",
    "detection",
    "restart",
    "lost_work",
    "degraded",
    "waiting",
)


def _empty() -> dict[str, float]:
    return dict.fromkeys(ETTR_BUCKETS, 0.0)


@dataclass
class Ettr:
    """A job's (or a sum of jobs') wall time and its losses by bucket, in seconds (GPU-seconds
    once weighted by GPUs)."""

    wall_s: float = 0.0
    buckets: dict[str, float] = field(default_factory=_empty)

    def add(self, bucket: str, seconds: float) -> None:
        if bucket not in self.buckets:
            raise KeyError(f"unknown ETTR bucket {bucket!r}; known: {', '.join(ETTR_BUCKETS)}")
        self.buckets[bucket] += seconds

    @property
    def lost_s(self) -> float:
        """Seconds of the wall time lost, never more than the wall time (a recovery modelled to
        end after the window closes is cut at the window)."""
        return min(sum(self.buckets.values()), self.wall_s)

    @property
    def productive_s(self) -> float:
        return self.wall_s - self.lost_s

    @property
    def ratio(self) -> float | None:
        """Productive time / wall time; None for no wall time."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def shares(self) -> dict[str, float]:
        """Each bucket's share of the wall time (zeros for no wall time)."""
        wall = self.wall_s
        return {k: v / wall if wall > 0 else 0.0 for k, v in self.buckets.items()}

    def weighted(self, gpus: float) -> Ettr:
        """This accounting in GPU-seconds: every figure times ``gpus``."""
        return Ettr(self.wall_s * gpus, {k: v * gpus for k, v in self.buckets.items()})

    def __add__(self, other: Ettr) -> Ettr:
        return Ettr(self.wall_s + other.wall_s, {k: v + other.buckets[k] for k, v in self.buckets.items()})

    @classmethod
    def total(cls, parts: Iterable[Ettr]) -> Ettr:
        out = cls()
        for part in parts:
            out = out + part
        return out
