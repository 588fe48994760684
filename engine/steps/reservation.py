"""Reserve for a gang blocked by capacity the GPUs it will get first, as running jobs end.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.steps.state import CycleState, chips_of
from engine.workload import PendingJob, Reservation, RunningJob


# --- 5. reservation --------------------------------------------------------------------
def ending_jobs(s: CycleState, c: int) -> tuple[list[RunningJob], list[np.ndarray]]:
    """Running jobs of chip ``c`` with an estimated end, soonest first, and their GPUs of that
    chip (those not schedulable or reserved are dropped when given back)."""
    base = s.ending_cache.get(c)
    if base is None:
        c_of = s.topo.gpu_chip
        jobs = sorted(
            (j for j in s.running_by_chip.get(c, []) if not j.fractional and j.estimated_end is not None),
            key=lambda j: j.estimated_end,
        )
        gpus = [j.held[s.schedulable[j.held] & (c_of[j.held] == c)] if j.parts else j.held for j in jobs]
        base = s.ending_cache[c] = (jobs, gpus)
    chip = s.topo.chip_names[c]
    extra = [j for j in s.started if j.estimated_end is not None and not j.fractional and chip in chips_of(j)]
    pairs = [(j, g) for j, g in zip(*base, strict=True) if j.id not in s.victims]
    if extra:
        c_of = s.topo.gpu_chip
        pairs += [(j, j.held[c_of[j.held] == c]) for j in extra]
        pairs.sort(key=lambda p: p[0].estimated_end)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def returnable(s: CycleState) -> np.ndarray:
    """Per GPU, whether it comes back to the pool when its job ends: schedulable, not reserved, not
    free already (a cordoned node's GPUs do not come back)."""
    return s.schedulable & ~s.reserved & ~s.pools.open.free


def first_fit(s: CycleState, job, c: int, max_level: int, releasable, first: int) -> int | None:
    """The smallest k such that the GPUs of the first k+1 ending jobs make room for the gang, or
    None. A gang fits at ``max_level`` exactly when some domain of that level holds ``job.gpus``
    free GPUs of chip ``c`` (FreePool.find looks at counts only, and a domain of a lower level
    lies inside one of ``max_level``), so the search counts: releases are added per domain in
    chunks of doubling size (one bincount each, no pool copied), and in the chunk that made room
    each domain that reached the size names the job whose GPUs got it there."""
    lay = s.layout
    usable = returnable(s)
    domain_of = lay.node_domain[max_level]
    have = s.pools.open.counts(max_level, c).astype(np.int64)
    short = job.gpus - have  # GPUs each domain still lacks
    if (short <= 0).any():
        return first  # it fits now: the fewest ending jobs whose GPUs could make room at all
    i, j, step, n = 0, first + 1, 1, len(releasable)
    while i < n:
        parts = [g[usable[g]] for g in releasable[i:j]]
        gpus = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        domains = domain_of[lay.gpu_node[gpus]]
        added = np.bincount(domains, minlength=len(short))
        reached = np.flatnonzero(added >= short)
        if reached.size:
            owner = np.repeat(np.arange(i, j), [len(p) for p in parts])
            return min(int(owner[np.flatnonzero(domains == d)[max(short[d], 1) - 1]]) for d in reached)
        short -= added
        i, j, step = j, min(n, j + step), step * 2
    return None


def earliest(s: CycleState, job: PendingJob, c: int, max_level: int):
    """When and where the gang could start at the soonest as running jobs end by their
    estimates: (start time, the pool then, (level, domain)), or None. Changes nothing."""
    ending, releasable = ending_jobs(s, c)
    if not releasable:
        return None
    counts = np.cumsum([len(g) for g in releasable])
    need = job.gpus - s.pools.open.total(c)
    if counts[-1] < need:
        return None  # even when every running job with an estimate ends, it would not fit
    k = first_fit(s, job, c, max_level, releasable, int(np.searchsorted(counts, need)))
    if k is None:
        return None
    trial = s.pools.open.copy()
    gpus = np.concatenate(releasable[: k + 1])
    trial.give(gpus[(s.schedulable & ~s.reserved)[gpus]])
    where = trial.find(c, job.gpus, max_level)
    return max(ending[k].estimated_end, s.now), trial, where


def reserve(s: CycleState, job: PendingJob, c: int, max_level: int, found=None) -> Reservation | None:
    """The GPUs the gang will get first, as running jobs end by their estimates: the shortest
    prefix of ending jobs whose GPUs make a placement possible (``found``: ``earliest``'s answer,
    when the caller has it)."""
    s.reservation_attempts += 1
    found = found or earliest(s, job, c, max_level)
    if found is None:
        return None
    start, trial, where = found
    chosen = trial.choose(*where, c, job.gpus)
    return hold(s, job, s.topo.chip_names[c], chosen, start, s.layout.domain_name(*where))


def hold(
    s: CycleState, job: PendingJob, chip: str, chosen: np.ndarray, start: float, domain: str
) -> Reservation:
    """Reserve ``chosen`` for the gang from now until ``start``: nobody else may take them unless
    it ends before then (backfill)."""
    s.reserved[chosen] = True
    s.pools.reserve(chosen)
    s.largest_blocks.clear()
    s.horizon = min(s.horizon, start)
    reservation = Reservation(job.id, chip, chosen, start, domain)
    s.result.reservations.append(reservation)
    return reservation
