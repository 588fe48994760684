"""Finding the node that hangs or slows a synchronous training job, from per-rank progress.

Each node reports, for the job's rank on it: ``step``, the last step whose local compute (forward
and backward) finished, counted before the step's gradient collective; ``step_at``, when that
counter last moved; and its last few steps' compute seconds. In a synchronous job every rank
waits in the collective for the slowest, so the step counters say who is behind and the compute
times say who is slow:

- **Hang.** No rank's counter moved for ``hang_s`` (``max(hang_steps x the job's step time,
  hang_floor_s)``). The ranks behind the front, or whose reports stopped, are the culprits; when
  every rank is at the front and reporting, the job hangs in a collective (the network, or every
  rank) and no node is named.
- **Straggler.** A node whose median compute time over its last ``window`` steps is more than
  ``slow_share`` above the job's median, and whose compute was that slow in at least
  ``consistent`` of those steps (one slow step, a pause for garbage collection or a checkpoint, is
  not a straggler); or one more than ``strong_share`` slower in each of its newest
  ``strong_steps`` steps, so a badly slowed node with long steps is named within a minute.

Pure NumPy over arrays with one row per node; nothing is kept between calls.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ProgressRule:
    hang_steps: float = 3.0
    hang_floor_s: float = 30.0
    window: int = 6
    consistent: int = 4
    slow_share: float = 0.10
    strong_share: float = 0.30  # a node this much slower in each of its newest steps ...
    strong_steps: int = 3  # ... this many, is named sooner

    def hang_s(self, step_s: float) -> float:
        return max(self.hang_steps * step_s, self.hang_floor_s)


@dataclass(frozen=True)
class Verdict:
    hung: bool = False
    culprits: tuple[int, ...] = ()  # row indices of the nodes that stopped
    stragglers: tuple[int, ...] = ()  # row indices of the slow nodes
    slowdown: dict[int, float] = field(default_factory=dict)  # straggler -> its compute / the median
    step_s: float = 0.0  # the job's step time, as measured
    reason: str = ""


def localize(
    step: np.ndarray,
    step_at: np.ndarray,
    reported_at: np.ndarray,
    recent: np.ndarray,
    now: float,
    rule: ProgressRule | None = None,
) -> Verdict:
    """The verdict for one job. ``step``, ``step_at``, ``reported_at``: one value per node (NaN or
    -1 where a node never reported); ``recent``: (nodes, k) compute seconds of the node's last k
    steps, newest last, NaN-padded."""
    rule = rule or ProgressRule()
    step = np.asarray(step, dtype=np.float64)
    step_at = np.asarray(step_at, dtype=np.float64)
    reported_at = np.asarray(reported_at, dtype=np.float64)
    recent = np.asarray(recent, dtype=np.float64)
    if recent.ndim != 2 or len(recent) != len(step):
        raise ValueError("recent must have one row of compute times per node")
    seen = np.isfinite(step) & (step >= 0)
    if not seen.any():
        return Verdict(reason="no progress reported yet")
    last = recent[:, -rule.window :]
    with warnings.catch_warnings():  # a node with no compute times yet is an all-NaN row
        warnings.simplefilter("ignore", RuntimeWarning)
        per_node = np.nanmedian(last, axis=1)
    measured = per_node[np.isfinite(per_node)]
    step_s = float(np.max(measured)) if len(measured) else 0.0  # the slowest rank sets the pace
    hang_s = rule.hang_s(step_s)
    front = np.nanmax(np.where(seen, step, np.nan))
    moved = np.nanmax(np.where(seen, step_at, np.nan))
    if now - moved > hang_s:
        behind = seen & (step < front)
        silent = ~seen | ~np.isfinite(reported_at) | (now - np.nan_to_num(reported_at, nan=-np.inf) > hang_s)
        culprits = tuple(int(i) for i in np.flatnonzero(behind | silent))
        if culprits:
            reason = (
                f"no rank advanced for {now - moved:.0f} s; "
                f"{len(culprits)} node(s) stopped before step {front:.0f}"
            )
        else:
            reason = f"no rank advanced for {now - moved:.0f} s and none is behind: a hang in a collective"
        return Verdict(True, culprits, (), {}, step_s, reason)
    return _stragglers(last, per_node, step_s, rule)


def _stragglers(last: np.ndarray, per_node: np.ndarray, step_s: float, rule: ProgressRule) -> Verdict:
    ok = np.isfinite(per_node)
    if ok.sum() < 2:  # no one to compare with
        return Verdict(step_s=step_s)
    ref = float(np.median(per_node[ok]))
    limit = ref * (1.0 + rule.slow_share)
    times = np.nan_to_num(last, nan=0.0)
    slow_steps = np.sum(times > limit, axis=1)
    strong = np.all(times[:, -rule.strong_steps :] > ref * (1.0 + rule.strong_share), axis=1)
    flagged = ok & (((per_node > limit) & (slow_steps >= rule.consistent)) | strong)
    found = tuple(int(i) for i in np.flatnonzero(flagged))
    slowdown = {i: round(float(per_node[i] / ref), 3) for i in found}
    reason = f"{len(found)} node(s) over {100 * rule.slow_share:.0f}% slower than the median" if found else ""
    return Verdict(False, (), found, slowdown, step_s, reason)
