"""Admit within quota and place a whole gang in the smallest domain that holds it.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

from engine.placement import LEVELS, FreePool
from engine.reasons import Reason, placement_kind
from engine.workload import MILLI, Admission, PendingJob, RunningJob


class AdmissionStep:
    def _chip_options(self, qi: int, job: PendingJob) -> list[int]:
        """The chip types a job may take, preferred first (the same for every job of a queue that
        lists the same ones: cached for the cycle)."""
        key = (qi, job.chip_types)
        options = self._options.get(key)
        if options is None:
            options = self._options[key] = self._chip_options_of(qi, job)
        return options

    def _chip_options_of(self, qi: int, job: PendingJob) -> list[int]:
        if job.chip_types:
            return [self.chip_index[c] for c in job.chip_types if c in self.chip_index]
        q = self.queues[qi]
        # No preference: the chip types the queue has quota for, or can borrow, in catalogue order.
        options = [c for c, name in enumerate(self.topo.chip_names) if q.nominal.get(name, 0) > 0]
        if q.cohort:
            options += [
                c
                for c in range(len(self.topo.chip_names))
                if c not in options and self.quota.pool_capacity[self.quota.cohort_of[qi], c] > 0
            ]
        return options

    # --- 2./3. admission and placement ----------------------------------------------------
    def _admit_placed(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        placed = self.pools.place(c, job.gpus, max_level)
        backfilled = False
        if placed is None and self._ends_before_horizon(job):
            placed = self.pools.place_backfill(c, job.gpus, max_level)
            backfilled = placed is not None
        if placed is None:
            return False
        gpus, level, domain = placed
        self._record_admission(qi, job, c, gpus, level, domain, backfilled=backfilled)
        return True

    def _admit_on_spares(self, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
        """A job of a queue allowed to borrow spares, with no room elsewhere, goes on spare nodes
        (whole gang there); fault recovery may take them back, preempting it."""
        if self._spare_pool is None:
            if not self.spare_free.any():
                return False
            self._spare_pool = FreePool(self.layout, self.spare_free)
        placed = self._spare_pool.place(c, job.gpus, max_level)
        if placed is None:
            return False
        gpus, level, domain = placed
        self._record_admission(qi, job, c, gpus, level, domain, on_spares=True)
        return True

    def _ends_before_horizon(self, job: PendingJob) -> bool:
        return job.estimated_duration_s is not None and self.now + job.estimated_duration_s <= self.horizon

    def _record_admission(
        self, qi, job, c, gpus, level, domain, *, backfilled=False, preempted=(), parts=(), on_spares=False
    ):
        """``parts``: (chip index, GPUs) per chip type of a mixed-chip gang (``c`` is the first)."""
        self.largest_blocks.clear()
        parts = parts or ((c, len(gpus)),)
        for pc, n in parts:
            self.quota.add(qi, pc, n * job.share)
        names = tuple((self.topo.chip_names[pc], n) for pc, n in parts) if len(parts) > 1 else ()
        chip = self.topo.chip_names[c]
        self.started.append(job.started(gpus, chip, self.now, names))
        self.result.admissions.append(
            Admission(
                job_id=job.id,
                chip=chip,
                gpus=gpus,
                domain=self.layout.domain_name(level, domain),
                borrowed=-(-sum(self.quota.borrowed(qi, pc) for pc, _ in parts) // MILLI),
                backfilled=backfilled,
                preempted=tuple(preempted),
                parts=names,
                on_spares=on_spares,
            )
        )

    def _placement_reason(self, job: PendingJob, c: int, max_level: int) -> Reason:
        chip = self.topo.chip_names[c]
        level_name = LEVELS[max_level]
        block = self.largest_blocks.get((c, max_level))
        if block is None:
            size, level, domain = self.pools.open.largest_block(c, max_level)
            block = self.largest_blocks[(c, max_level)] = (size, self.layout.domain_name(level, domain))
        size, where = block
        facts = {
            "gpus": job.gpus,
            "chip": chip,
            "level": level_name,
            "largest_free": size,
            "largest_in": where,
        }
        if self.pools.free_only_if_reserved(c, job.gpus, max_level):
            starts_in = self.horizon - self.now
            why = (
                "has no estimated duration" if job.estimated_duration_s is None else "would not end before it"
            )
            return Reason(
                f"{job.gpus} {chip} GPUs are free only on GPUs reserved for a larger job starting in "
                f"{starts_in:.0f} s; this job {why}",
                "reservation",
                {**facts, "reservation_starts_in_s": round(starts_in)},
            )
        return Reason(
            f"no {level_name} with {job.gpus} free {chip} GPUs (largest free block: {size} in {where})",
            placement_kind(level_name),
            facts,
        )

    def _charge(self, job: RunningJob, sign: int) -> None:
        """Add (+1) or take back (-1) a running job's quota, per chip type it holds."""
        qi = self.queue_index[job.queue]
        for chip, amount in job.demand_by_chip():
            self.quota.add(qi, self.chip_index[chip], sign * amount)
