"""Checkpoint policies and their arithmetic: stalls, the Young/Daly interval, expected loss.

Notation (faults.md of the design notes): delta = blocking checkpoint cost (s), M = the job's mean
time between faults (s), R = restart time after a fault (detection + reschedule + initialize +
load), tau = compute time between checkpoints.

- Young (1974): tau = sqrt(2 delta M).
- Daly (2006, FGCS 22(3)): tau = sqrt(2 delta M) [1 + 1/3 sqrt(delta/2M) + 1/9 (delta/2M)] - delta
  for delta < 2M, else tau = M.
- First-order waste: each fault costs tau/2 of lost work (on average) plus R, and checkpoints cost
  delta every tau, so ETTR ~= 1 - delta/tau - (tau/2 + R)/M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class CheckpointKind(StrEnum):
    PERIODIC = "periodic"  # synchronous: training stalls while the checkpoint is written
    ASYNC = "async"  # a short stall to copy to host memory, then a background write
    TRIGGERED = "triggered"  # save when a fault is detected, with a periodic fallback


def write_seconds(state: float, storage_gbps: float) -> float:
    """Time to write the whole training state to durable storage at ``storage_gbps`` GB/s."""
    return state / (storage_gbps * 1e9)


def stall_seconds(
    kind: CheckpointKind, state: float, gpus: int, storage_gbps: float, host_copy_gbps: float
) -> float:
    """How long training stops for one checkpoint under this mechanism."""
    if kind == CheckpointKind.PERIODIC:
        return write_seconds(state, storage_gbps)
    # async (and the periodic part of triggered): each GPU copies its shard to host memory
    per_gpu = state / max(gpus, 1)
    return per_gpu / (host_copy_gbps * 1e9)


def young_interval(stall: float, mtbf: float) -> float:
    return math.sqrt(2.0 * stall * mtbf)


def daly_interval(stall: float, mtbf: float) -> float:
    if stall >= 2.0 * mtbf:
        return mtbf
    x = stall / (2.0 * mtbf)
    return math.sqrt(2.0 * stall * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall


def expected_ettr(interval: float, stall: float, mtbf: float, restart: float) -> float:
    """First-order expected ETTR of a periodic policy (never below zero)."""
    return max(0.0, 1.0 - stall / interval - (interval / 2.0 + restart) / mtbf)


@dataclass(frozen=True)
class Recommendation:
    interval_s: float
    expected_ettr: float
    chosen_interval_s: float | None
    chosen_expected_ettr: float | None


def recommend(stall: float, mtbf: float, restart: float, chosen: float | None = None) -> Recommendation:
    """The Daly interval for this stall and MTBF, with the expected ETTR next to the operator's choice."""
    tau = max(daly_interval(stall, mtbf), 1.0)
    return Recommendation(
        interval_s=tau,
        expected_ettr=expected_ettr(tau, stall, mtbf, restart),
        chosen_interval_s=chosen,
        chosen_expected_ettr=expected_ettr(chosen, stall, mtbf, restart) if chosen else None,
    )
