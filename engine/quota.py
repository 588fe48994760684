"""Quota accounting per queue and chip type, with cohort borrowing and lending (Kueue semantics).

Each queue has, per chip type, a nominal quota (GPUs), a borrowing limit (how far above nominal
it may go by borrowing; None = no limit) and a lending limit (how much of its nominal others may
borrow; None = all of it). The part of nominal that is not lendable is guaranteed to the queue.
A cohort pools its members' lendable quota: a member's usage beyond its guaranteed part draws on
that pool, so when others have borrowed a queue's lendable quota, the queue gets it back by
reclaiming (preempting the borrowers) as its policy allows. Queues without a cohort use their
nominal quota and nothing more.

Amounts are integers in ``unit``s per GPU: the scheduler counts in thousandths of a GPU
(unit=1000) so jobs that share GPUs are charged their fraction; messages speak GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.reasons import Reason
from engine.workload import MILLI, QueueSpec, RunningJob

UNLIMITED = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class QuotaCheck:
    ok: bool
    reason: Reason | None = None  # why not (engine.reasons), kind "quota"
    kind: str = ""  # "", "nominal", "borrowing_limit", "cohort": what ran out


class QuotaBook:
    """Usage and limits as [queue, chip] integer arrays; updated in place as a cycle admits."""

    def __init__(
        self,
        queue_names: list[str],
        chip_names: list[str] | tuple[str, ...],
        cohort_of: list[int],
        cohort_names: list[str],
        nominal: np.ndarray,
        borrowing_limit: np.ndarray,
        lending_limit: np.ndarray,
        usage: np.ndarray,
        unit: int = 1,
    ):
        self.unit = unit
        self.queue_names = list(queue_names)
        self.chip_names = list(chip_names)
        self.cohort_names = list(cohort_names)
        self.cohort_of = np.asarray(cohort_of, dtype=np.int64)
        self.nominal = np.asarray(nominal, dtype=np.int64)
        self.borrowing_limit = np.asarray(borrowing_limit, dtype=np.int64)
        self.lendable = np.minimum(np.asarray(lending_limit, dtype=np.int64), self.nominal)
        self.guaranteed = self.nominal - self.lendable
        self.usage = np.asarray(usage, dtype=np.int64).copy()
        self.queue_total = self.usage.sum(axis=1)
        n_cohorts = len(cohort_names)
        self.pool_capacity = np.zeros((n_cohorts, len(self.chip_names)), dtype=np.int64)
        members = self.cohort_of >= 0
        np.add.at(self.pool_capacity, self.cohort_of[members], self.lendable[members])
        self._recount_pool()

    def _recount_pool(self) -> None:
        self.pool_usage = np.zeros_like(self.pool_capacity)
        members = self.cohort_of >= 0
        np.add.at(self.pool_usage, self.cohort_of[members], self._pool_draw(self.usage)[members])

    def _pool_draw(self, usage: np.ndarray) -> np.ndarray:
        return np.maximum(0, usage - self.guaranteed)

    def gpus(self, amount) -> str:
        """An amount in units, written in GPUs ("32", "0.25")."""
        value = int(amount) / self.unit
        return f"{value:.0f}" if value == int(value) else f"{value:g}"

    # --- queries -------------------------------------------------------------------------
    def borrowed(self, q: int, c: int) -> int:
        return max(0, int(self.usage[q, c] - self.nominal[q, c]))

    def lent(self, q: int, c: int) -> int:
        """Queue q's share of what the cohort's borrowers use: the borrowed total split in
        proportion to each member's unused lendable quota."""
        cohort = self.cohort_of[q]
        if cohort < 0:
            return 0
        members = np.flatnonzero(self.cohort_of == cohort)
        draw = np.maximum(0, self.usage[members, c] - self.guaranteed[members, c])
        unused = np.maximum(0, self.lendable[members, c] - draw)
        borrowed = int(np.maximum(0, self.usage[members, c] - self.nominal[members, c]).sum())
        total_unused = int(unused.sum())
        if borrowed == 0 or total_unused == 0:
            return 0
        mine = int(unused[np.flatnonzero(members == q)[0]])
        return round(borrowed * mine / total_unused)

    def cohort_available(self, cohort: int, c: int) -> int:
        return int(self.pool_capacity[cohort, c] - self.pool_usage[cohort, c])

    def ceiling(self, q: int, c: int) -> int:
        """The most queue q could ever hold of chip c: its nominal quota, plus what it may borrow
        from its cohort within its borrowing limit."""
        cohort = int(self.cohort_of[q])
        if cohort < 0:
            return int(self.nominal[q, c])
        borrowable = int(self.guaranteed[q, c] + self.pool_capacity[cohort, c])
        return min(int(self.nominal[q, c] + self.borrowing_limit[q, c]), borrowable)

    def share(self, q: int, weight: float) -> float:
        return float(self.queue_total[q]) / max(weight, 1e-9)

    def check(self, q: int, c: int, gpus: int) -> QuotaCheck:
        name, chip = self.queue_names[q], self.chip_names[c]
        g = self.gpus
        used, nominal = int(self.usage[q, c]), int(self.nominal[q, c])
        after = used + gpus
        cohort = int(self.cohort_of[q])
        if cohort < 0:
            if after <= nominal:
                return QuotaCheck(True)
            return self._refused(
                q,
                c,
                gpus,
                f"quota of queue {name} exhausted for {chip}: {g(used)} of {g(nominal)} in use, "
                f"needs {g(gpus)}; the queue is in no cohort, so it cannot borrow",
                "nominal",
            )
        if after - nominal > self.borrowing_limit[q, c]:
            return self._refused(
                q,
                c,
                gpus,
                f"queue {name} would borrow {g(after - nominal)} {chip} GPUs, above its borrowing "
                f"limit of {g(self.borrowing_limit[q, c])}",
                "borrowing_limit",
            )
        old_draw = max(0, used - int(self.guaranteed[q, c]))
        new_draw = max(0, after - int(self.guaranteed[q, c]))
        available = self.cohort_available(cohort, c)
        if new_draw - old_draw <= available:
            return QuotaCheck(True)
        cohort_name = self.cohort_names[cohort]
        if after <= nominal:
            return self._refused(
                q,
                c,
                gpus,
                f"queue {name}'s nominal {chip} quota ({g(nominal)}) is lent to other queues of "
                f"cohort {cohort_name}; {g(used)} in use, needs {g(gpus)}: reclaim by preemption",
                "cohort",
            )
        return self._refused(
            q,
            c,
            gpus,
            f"quota of queue {name} exhausted for {chip} ({g(used)} of nominal {g(nominal)} in "
            f"use, needs {g(gpus)}) and cohort {cohort_name} has {g(max(available, 0))} to lend",
            "cohort",
        )

    def _refused(self, q: int, c: int, gpus: int, text: str, what: str) -> QuotaCheck:
        unit = self.unit  # the facts in GPUs (0.25: a quarter of one)
        facts = {"queue": self.queue_names[q], "chip": self.chip_names[c], "ran_out": what}
        facts.update(
            in_use=int(self.usage[q, c]) / unit, nominal=int(self.nominal[q, c]) / unit, needs=gpus / unit
        )
        return QuotaCheck(False, Reason(text, "quota", facts), what)

    # --- updates -------------------------------------------------------------------------
    def add(self, q: int, c: int, gpus: int) -> None:
        cohort = self.cohort_of[q]
        if cohort >= 0:
            old = max(0, int(self.usage[q, c] - self.guaranteed[q, c]))
            new = max(0, int(self.usage[q, c] + gpus - self.guaranteed[q, c]))
            self.pool_usage[cohort, c] += new - old
        self.usage[q, c] += gpus
        self.queue_total[q] += gpus

    def remove(self, q: int, c: int, gpus: int) -> None:
        self.add(q, c, -gpus)

    def violations(self) -> list[str]:
        """Quota rules broken by the current usage (the invariant checker reports these)."""
        problems = []
        for q, name in enumerate(self.queue_names):
            for c, chip in enumerate(self.chip_names):
                over = int(self.usage[q, c] - self.nominal[q, c])
                if self.cohort_of[q] < 0 and over > 0:
                    problems.append(
                        f"queue {name} uses {self.gpus(over)} {chip} GPUs above nominal without a cohort"
                    )
                elif over > self.borrowing_limit[q, c]:
                    problems.append(
                        f"queue {name} borrows {self.gpus(over)} {chip} GPUs, above its borrowing limit"
                    )
        for k, cohort in enumerate(self.cohort_names):
            for c, chip in enumerate(self.chip_names):
                if self.pool_usage[k, c] > self.pool_capacity[k, c]:
                    problems.append(
                        f"cohort {cohort} lends {self.gpus(self.pool_usage[k, c])} {chip} GPUs of "
                        f"{self.gpus(self.pool_capacity[k, c])} lendable"
                    )
        return problems


def charge(usage: dict[tuple[str, str], int], job: RunningJob) -> None:
    """Add what a running job uses, in thousandths of a GPU per (queue, chip type), to ``usage``."""
    for chip, amount in job.demand_by_chip():
        usage[job.queue, chip] = usage.get((job.queue, chip), 0) + amount


def build_quota_book(
    queues: list[QueueSpec],
    chip_names,
    running: list[RunningJob],
    usage_by: dict[tuple[str, str], int] | None = None,
    unit: int = MILLI,
) -> QuotaBook:
    """Quota book for the queues, in ``unit``s per GPU (default thousandths); usage from running
    jobs (charged their share of each GPU), or from {(queue, chip): amount in units}."""
    chips = {name: i for i, name in enumerate(chip_names)}
    cohorts = sorted({q.cohort for q in queues if q.cohort})
    cohort_index = {name: i for i, name in enumerate(cohorts)}
    shape = (len(queues), len(chips))
    nominal = np.zeros(shape, dtype=np.int64)
    borrowing = np.full(shape, UNLIMITED, dtype=np.int64)
    lending = np.full(shape, UNLIMITED, dtype=np.int64)
    for qi, q in enumerate(queues):
        for chip, value in q.nominal.items():
            if chip in chips:
                nominal[qi, chips[chip]] = value * unit
        for chip, value in q.borrowing_limit.items():
            if chip in chips and value is not None:
                borrowing[qi, chips[chip]] = value * unit
        for chip, value in q.lending_limit.items():
            if chip in chips and value is not None:
                lending[qi, chips[chip]] = value * unit
    usage = np.zeros(shape, dtype=np.int64)
    queue_index = {q.name: i for i, q in enumerate(queues)}
    totals: dict[tuple[str, str], int] = {}  # summed in Python ints: one NumPy write per cell
    for job in running:
        charge(totals, job)
    for (queue, chip), amount in totals.items():
        if queue in queue_index and chip in chips:
            usage[queue_index[queue], chips[chip]] += amount * unit // MILLI
    for (queue, chip), gpus in (usage_by or {}).items():
        if queue in queue_index and chip in chips:
            usage[queue_index[queue], chips[chip]] += gpus
    return QuotaBook(
        [q.name for q in queues],
        list(chip_names),
        [cohort_index[q.cohort] if q.cohort else -1 for q in queues],
        cohorts,
        nominal,
        borrowing,
        lending,
        usage,
        unit,
    )
