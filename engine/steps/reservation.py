"""Reserve for a gang blocked by capacity the GPUs it will get first, as running jobs end.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.workload import PendingJob, Reservation, RunningJob


class ReservationStep:
    # --- 5. reservation --------------------------------------------------------------------
    def _ending(self, c: int) -> tuple[list[RunningJob], list[np.ndarray]]:
        """Running jobs of chip ``c`` with an estimated end, soonest first, and their GPUs of that
        chip (those not schedulable or reserved are dropped when given back)."""
        base = self._ending_cache.get(c)
        if base is None:
            c_of = self.topo.gpu_chip
            jobs = sorted(
                (
                    j
                    for j in self.running_by_chip.get(c, [])
                    if not j.fractional and j.estimated_end is not None
                ),
                key=lambda j: j.estimated_end,
            )
            gpus = [
                j.held[self.schedulable[j.held] & (c_of[j.held] == c)] if j.parts else j.held for j in jobs
            ]
            base = self._ending_cache[c] = (jobs, gpus)
        chip = self.topo.chip_names[c]
        extra = [
            j
            for j in self.started
            if j.estimated_end is not None and not j.fractional and chip in self._chips_of(j)
        ]
        pairs = [(j, g) for j, g in zip(*base, strict=True) if j.id not in self.victims]
        if extra:
            c_of = self.topo.gpu_chip
            pairs += [(j, j.held[c_of[j.held] == c]) for j in extra]
            pairs.sort(key=lambda p: p[0].estimated_end)
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @staticmethod
    def _chips_of(job: RunningJob) -> tuple[str, ...]:
        return tuple(p for p, _ in job.parts) if job.parts else (job.chip,)

    def _first_fit(self, job, c, max_level, releasable, first):
        """The smallest k such that the GPUs of the first k+1 ending jobs make room for the gang,
        with the pool and placement at that point, or None. Releases are given back in chunks of
        doubling size (few pool updates), then the chunk that made room is bisected from a copy
        of the pool before it (freeing more GPUs never takes room away, so the answer is exact)."""
        usable = self.schedulable & ~self.reserved  # a cordoned node's GPUs do not come back

        def released(lo: int, hi: int) -> np.ndarray:
            gpus = np.concatenate(releasable[lo:hi])
            return gpus[usable[gpus]]

        trial = self.pools.open.copy()
        trial.give(released(0, first + 1))
        where = trial.find(c, job.gpus, max_level)
        if where is not None:
            return first, trial, where
        i, step, n = first + 1, 1, len(releasable)
        while i < n:
            j = min(n, i + step)
            before = trial.copy()
            trial.give(released(i, j))
            where = trial.find(c, job.gpus, max_level)
            if where is not None:
                lo, hi, best = i, j - 1, (trial, where)
                while lo < hi:
                    mid = (lo + hi) // 2
                    probe = before.copy()
                    probe.give(released(i, mid + 1))
                    spot = probe.find(c, job.gpus, max_level)
                    if spot is None:
                        lo = mid + 1
                    else:
                        hi, best = mid, (probe, spot)
                return hi, best[0], best[1]
            i, step = j, step * 2
        return None

    def _reserve(self, job: PendingJob, c: int, max_level: int) -> Reservation | None:
        """The GPUs the gang will get first, as running jobs end by their estimates: the shortest
        prefix of ending jobs whose GPUs make a placement possible."""
        self.reservation_attempts += 1
        ending, releasable = self._ending(c)
        if not releasable:
            return None
        counts = np.cumsum([len(g) for g in releasable])
        need = job.gpus - self.pools.open.total(c)
        if counts[-1] < need:
            return None  # even when every running job with an estimate ends, it would not fit

        found = self._first_fit(job, c, max_level, releasable, int(np.searchsorted(counts, need)))
        if found is None:
            return None
        hi, trial, where = found
        chosen = trial.choose(*where, c, job.gpus)
        start = max(ending[hi].estimated_end, self.now)
        self.reserved[chosen] = True
        self.pools.reserve(chosen)
        self.largest_blocks.clear()
        self.horizon = min(self.horizon, start)
        reservation = Reservation(
            job.id, self.topo.chip_names[c], chosen, start, self.layout.domain_name(*where)
        )
        self.result.reservations.append(reservation)
        return reservation
