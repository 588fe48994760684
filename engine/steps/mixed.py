"""Split a gang over several allowed chip types when no single type can hold it.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.steps.admission import record_admission
from engine.steps.elasticity import quota_headroom
from engine.steps.state import CycleState
from engine.workload import PendingJob


# --- mixed chips -----------------------------------------------------------------------
def admit_mixed(s: CycleState, qi: int, job: PendingJob, chips: list[int], max_level: int) -> bool:
    """Split the gang over several allowed chip types inside the smallest domain that holds it
    (preferred chip types first, each within its quota), when no single type can."""
    sizes = list(range(job.gpus, 0, -1))
    headroom = {c: quota_headroom(s, qi, c, sizes) for c in chips}
    if sum(headroom.values()) < job.gpus:
        return False
    for level in range(max_level + 1):
        usable = sum(np.minimum(s.pools.open.counts(level, c), headroom[c]) for c in chips)
        fits = np.flatnonzero(usable >= job.gpus)
        if not fits.size:
            continue
        domain = int(fits[np.argmin(usable[fits])])
        parts, remaining = [], job.gpus
        for c in chips:
            take = int(min(s.pools.open.counts(level, c)[domain], headroom[c], remaining))
            if take:
                parts.append((c, take))
                remaining -= take
            if not remaining:
                break
        if len(parts) < 2:
            return False  # one type would do: the homogeneous path already said why it did not
        gpus = np.concatenate([s.pools.open.choose(level, domain, c, n) for c, n in parts])
        s.pools.take(gpus)
        record_admission(s, qi, job, parts[0][0], gpus, level, domain, parts=parts)
        return True
    return False
