"""Pack fractions of a GPU onto shared GPUs without stranding slivers.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.workload import MILLI, PendingJob


class SharingStep:
    # --- shared GPUs ----------------------------------------------------------------------
    def _admit_fraction(self, qi: int, job: PendingJob) -> str:
        """A fraction of one GPU: onto a shared GPU where it leaves no unusable sliver, else onto a
        fresh GPU of the fullest node (whole nodes stay free for gangs), else onto any shared GPU
        with room."""
        reasons = []
        for c in self._chip_options(qi, job):
            check = self.quota.check(qi, c, job.demand)
            if not check.ok:
                reasons.append(check.reason)
                continue
            gpu = self._shared_gpu(c, job.share, strict=True)
            if gpu is None:
                placed = self.pools.place(c, 1, 0)
                if placed is not None:
                    gpu = int(placed[0][0])
                    self.shared = np.append(self.shared, gpu)
            if gpu is None:
                gpu = self._shared_gpu(c, job.share, strict=False)
            if gpu is None:
                reasons.append(f"no {self.topo.chip_names[c]} GPU has {job.share / MILLI:g} of a GPU free")
                continue
            self.gpu_used[gpu] += job.share
            node = int(self.topo.gpu_node[gpu])
            self._record_admission(qi, job, c, np.array([gpu], dtype=np.int64), 0, node)
            return ""
        return "; ".join(reasons)

    def _shared_gpu(self, c: int, share: int, *, strict: bool) -> int | None:
        idx = self.shared
        if not len(idx):
            return None
        left = MILLI - self.gpu_used[idx] - share
        ok = (left >= 0) & (self.topo.gpu_chip[idx] == c) & self.schedulable[idx] & ~self.reserved[idx]
        if strict:
            ok &= (left == 0) | (left >= self.min_share)  # never strand a sliver nobody can use
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        return int(idx[cand[np.argmin(left[cand])]])
