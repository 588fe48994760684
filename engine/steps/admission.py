"""Admit within quota and place a whole gang in the smallest domain that holds it.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

from engine.placement import LEVELS, FreePool
from engine.reasons import Reason, moment, placement_kind
from engine.steps.state import CycleState
from engine.workload import MILLI, Admission, PendingJob, RunningJob


def chip_options(s: CycleState, qi: int, job: PendingJob) -> list[int]:
    """The chip types a job may take, preferred first (the same for every job of a queue that
    lists the same ones: cached for the cycle)."""
    key = (qi, job.chip_types)
    options = s.options_cache.get(key)
    if options is None:
        options = s.options_cache[key] = chip_options_of(s, qi, job)
    return options


def chip_options_of(s: CycleState, qi: int, job: PendingJob) -> list[int]:
    if job.chip_types:
        return [s.chip_index[c] for c in job.chip_types if c in s.chip_index]
    q = s.queues[qi]
    # No preference: the chip types the queue has quota for, or can borrow, in catalogue order.
    options = [c for c, name in enumerate(s.topo.chip_names) if q.nominal.get(name, 0) > 0]
    if q.cohort:
        options += [
            c
            for c in range(len(s.topo.chip_names))
            if c not in options and s.quota.pool_capacity[s.quota.cohort_of[qi], c] > 0
        ]
    return options


# --- 2./3. admission and placement ----------------------------------------------------
def admit_placed(s: CycleState, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
    placed = s.pools.place(c, job.gpus, max_level)
    backfilled = False
    if placed is None and ends_before_horizon(s, job):
        placed = s.pools.place_backfill(c, job.gpus, max_level)
        backfilled = placed is not None
    if placed is None:
        return False
    gpus, level, domain = placed
    congested = level >= 1 and (s.pools.all if backfilled else s.pools.open).is_congested(level, domain)
    record_admission(s, qi, job, c, gpus, level, domain, backfilled=backfilled, congested=congested)
    return True


def admit_on_spares(s: CycleState, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
    """A job of a queue allowed to borrow spares, with no room elsewhere, goes on spare nodes
    (whole gang there); fault recovery may take them back, preempting it."""
    known = s.no_spare_room.get((c, max_level))
    if known is not None and job.gpus >= known:
        return False  # a job this large or smaller found no room on spares this cycle
    if s.spare_pool is None:
        if not s.spare_free.any():
            s.no_spare_room[(c, max_level)] = 0
            return False
        s.spare_pool = FreePool(s.layout, s.spare_free)
    placed = s.spare_pool.place(c, job.gpus, max_level)
    if placed is None:
        s.no_spare_room[(c, max_level)] = job.gpus if known is None else min(job.gpus, known)
        return False
    gpus, level, domain = placed
    record_admission(s, qi, job, c, gpus, level, domain, on_spares=True)
    return True


def ends_before_horizon(s: CycleState, job: PendingJob) -> bool:
    return job.estimated_duration_s is not None and s.now + job.estimated_duration_s <= s.horizon


def record_admission(
    s: CycleState,
    qi,
    job,
    c,
    gpus,
    level,
    domain,
    *,
    backfilled=False,
    preempted=(),
    parts=(),
    on_spares=False,
    congested=False,
    span_note="",
    link_loads=(),
    span_slowdown=0.0,
):
    """``parts``: (chip index, GPUs) per chip type of a mixed-chip gang (``c`` is the first)."""
    s.largest_blocks.clear()
    parts = parts or ((c, len(gpus)),)
    for pc, n in parts:
        s.quota.add(qi, pc, n * job.share)
    names = tuple((s.topo.chip_names[pc], n) for pc, n in parts) if len(parts) > 1 else ()
    chip = s.topo.chip_names[c]
    s.started.append(job.started(gpus, chip, s.now, names))
    s.result.admissions.append(
        Admission(
            job_id=job.id,
            chip=chip,
            held=gpus,
            domain=s.layout.domain_name(level, domain),
            borrowed=-(-sum(s.quota.borrowed(qi, pc) for pc, _ in parts) // MILLI),
            backfilled=backfilled,
            preempted=tuple(preempted),
            parts=names,
            on_spares=on_spares,
            congested=congested,
            span_note=span_note,
            link_loads=tuple(link_loads),
            span_slowdown=span_slowdown,
        )
    )


def placement_reason(s: CycleState, job: PendingJob, c: int, max_level: int) -> Reason:
    """Why the gang found no room: GPUs free only where a larger job has reserved them, or no
    domain of its level with room (the largest free block named; one reason per size, chip and
    level a cycle, as the largest blocks are read once a cycle)."""
    chip = s.topo.chip_names[c]
    level_name = LEVELS[max_level]
    block = s.largest_blocks.get((c, max_level))
    if block is None:
        size, level, domain = s.pools.open.largest_block(c, max_level)
        block = s.largest_blocks[(c, max_level)] = (size, s.layout.domain_name(level, domain))
    size, where = block
    if s.pools.free_only_if_reserved(c, job.gpus, max_level):
        starts_in = s.horizon - s.now
        why = "has no estimated duration" if job.estimated_duration_s is None else "would not end before it"
        facts = {
            "gpus": job.gpus,
            "chip": chip,
            "level": level_name,
            "reservation_starts_in_s": round(starts_in),
            "reservation_starts_at": s.horizon,
        }
        return Reason(
            f"{job.gpus} {chip} GPUs are free only on GPUs reserved for a larger job starting at "
            f"{moment(s.horizon)}; this job {why}",
            "reservation",
            facts,
        )
    reason = s.placement_reasons.get((c, max_level, job.gpus))
    if reason is None:
        facts = {
            "gpus": job.gpus,
            "chip": chip,
            "level": level_name,
            "largest_free": size,
            "largest_in": where,
        }
        reason = s.placement_reasons[(c, max_level, job.gpus)] = Reason(
            f"no {level_name} with {job.gpus} free {chip} GPUs (largest free block: {size} in {where})",
            placement_kind(level_name),
            facts,
        )
    return reason


def charge(s: CycleState, job: RunningJob, sign: int) -> None:
    """Add (+1) or take back (-1) a running job's quota, per chip type it holds."""
    qi = s.queue_index[job.queue]
    for chip, amount in job.demand_by_chip():
        s.quota.add(qi, s.chip_index[chip], sign * amount)
