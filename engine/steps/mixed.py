"""Split a gang over several allowed chip types when no single type can hold it.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.workload import PendingJob


class MixedChipStep:
    # --- mixed chips -----------------------------------------------------------------------
    def _admit_mixed(self, qi: int, job: PendingJob, chips: list[int], max_level: int) -> bool:
        """Split the gang over several allowed chip types inside the smallest domain that holds it
        (preferred chip types first, each within its quota), when no single type can."""
        sizes = list(range(job.gpus, 0, -1))
        headroom = {c: self._quota_headroom(qi, c, sizes) for c in chips}
        if sum(headroom.values()) < job.gpus:
            return False
        for level in range(max_level + 1):
            usable = sum(np.minimum(self.pools.open.counts(level, c), headroom[c]) for c in chips)
            fits = np.flatnonzero(usable >= job.gpus)
            if not fits.size:
                continue
            domain = int(fits[np.argmin(usable[fits])])
            parts, remaining = [], job.gpus
            for c in chips:
                take = int(min(self.pools.open.counts(level, c)[domain], headroom[c], remaining))
                if take:
                    parts.append((c, take))
                    remaining -= take
                if not remaining:
                    break
            if len(parts) < 2:
                return False  # one type would do: the homogeneous path already said why it did not
            gpus = np.concatenate([self.pools.open.choose(level, domain, c, n) for c, n in parts])
            self.pools.take(gpus)
            self._record_admission(qi, job, parts[0][0], gpus, level, domain, parts=parts)
            return True
        return False
