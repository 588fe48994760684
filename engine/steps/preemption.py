"""Evict whole jobs, as the queues' policies allow, to admit and place a job.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from engine.reasons import Reason
from engine.steps.admission import charge, record_admission
from engine.steps.state import CycleState
from engine.workload import PendingJob, Preemption, Reclaim, RunningJob, WithinQueue

# --- 4. preemption -------------------------------------------------------------------
# why a candidate would go: it lends quota the job's queue reclaims; it is the queue's own
# lower-priority work; the same, with borrowed quota taken back first and not enough alone
RECLAIMED, OWN, OWN_AFTER_RECLAIM = 0, 1, 2


def victim_candidates(
    s: CycleState, qi: int, job: PendingJob, c: int, own: bool = True
) -> list[tuple[RunningJob, int]]:
    """Jobs ``job`` may evict on chip ``c``, with why (RECLAIMED, OWN, OWN_AFTER_RECLAIM), in the
    order they go (Kueue's rules): first jobs of queues borrowing from the cohort, when this
    queue reclaims its nominal quota; then, if ``own``, its own queue's lower-priority jobs;
    inside each group lowest priority first, then least work since the last checkpoint. A job
    that would still borrow after evicting its own queue's work preempts nothing unless its
    queue allows preempting while borrowing. The reasons are worded for the victims chosen only
    (``eviction_reason``): in a full cluster thousands of pending jobs weigh candidates each
    cycle and evict none."""
    queue = s.queues[qi]
    cohort = s.quota.cohort_of[qi]
    mine = []
    if own and queue.within_queue == WithinQueue.LOWER_PRIORITY:
        running = s.running_by_queue_chip.get((qi, c), [])
        if running and job.priority > lowest_priority(s, qi, c, running):
            mine = takeable(s, qi, c, below=job.priority)
    usage, nominal = s.quota.usage[qi, c], s.quota.nominal[qi, c]
    chip = s.topo.chip_names[c]
    freeable = sum(dict(v.demand_by_chip()).get(chip, 0) for v in mine)
    within_nominal = usage - freeable + job.demand <= nominal
    s.borrow_blocked = None
    if cohort >= 0 and not within_nominal:
        limit = queue.borrow_preempt_max_priority
        if limit is None:
            if mine:
                s.borrow_blocked = Reason(
                    f"job {job.id} would borrow {chip} quota even after preempting its queue's "
                    f"lower-priority work; queue {queue.name} does not preempt while borrowing",
                    "quota",
                    {"queue": queue.name, "chip": chip},
                )
            return []
        mine = [v for v in mine if v.priority <= limit]
    reclaiming = (
        queue.reclaim_within_cohort != Reclaim.NEVER and cohort >= 0 and usage < nominal and within_nominal
    )
    reclaimed: list[RunningJob] = []
    if reclaiming:
        below = None if queue.reclaim_within_cohort == Reclaim.ANY else job.priority
        for vq in borrowers(s, cohort, c):
            if vq != qi:
                reclaimed += takeable(s, vq, c, below)
        if len(reclaimed) > 1:  # several lenders: one order over them all
            reclaimed.sort(key=s.eviction_keys.__getitem__)
    mine_why = OWN_AFTER_RECLAIM if reclaiming else OWN
    return [(v, RECLAIMED) for v in reclaimed] + [(v, mine_why) for v in mine]


def eviction_order(s: CycleState, qi: int, c: int) -> tuple[list[RunningJob], list[int]]:
    """Queue ``qi``'s whole-GPU jobs on chip ``c`` (a shared GPU frees only when all its jobs
    leave) in the order they would be evicted: lowest priority, then least work since the last
    checkpoint, then the latest started; and their priorities. Sorted once a cycle (a list
    replaced by a resize is sorted again)."""
    running = s.running_by_queue_chip.get((qi, c), [])
    cached = s.eviction_order.get((qi, c))
    if cached is None or cached[0] is not running:
        whole = [v for v in running if not v.fractional]
        for v in whole:
            s.eviction_keys[v] = (v.priority, v.lost_work(s.now), -v.started_at)
        whole.sort(key=s.eviction_keys.__getitem__)
        cached = s.eviction_order[(qi, c)] = (running, (whole, [v.priority for v in whole]))
    return cached[1]


def takeable(s: CycleState, qi: int, c: int, below: float | None) -> list[RunningJob]:
    """Queue ``qi``'s jobs on chip ``c`` in eviction order that are neither victims already nor
    shrunk this cycle (a job shrunk for one job is not then evicted for another: its shrink and
    its eviction would be two changes to one job in one cycle) and, unless ``below`` is None, of
    a priority below ``below``."""
    order, priorities = eviction_order(s, qi, c)
    if below is not None:
        order = order[: bisect_left(priorities, below)]
    return [v for v in order if v.id not in s.victims and v.id not in s.resized]


def borrowers(s: CycleState, cohort: int, c: int) -> list[int]:
    """The queues of ``cohort`` using more of chip ``c`` than their nominal quota. Quota moves
    only with the cycle's admissions, evictions and resizes, so the answer is kept until one of
    those happens (a full cluster asks it for each of thousands of pending jobs)."""
    moved = (len(s.result.admissions), len(s.result.preemptions), len(s.result.resizes))
    cached = s.borrowers.get((cohort, c))
    if cached is None or cached[0] != moved:
        over = (s.quota.cohort_of == cohort) & (s.quota.usage[:, c] > s.quota.nominal[:, c])
        cached = s.borrowers[(cohort, c)] = (moved, np.flatnonzero(over).tolist())
    return cached[1]


def eviction_reason(s: CycleState, qi: int, job: PendingJob, c: int, victim: RunningJob, why: int) -> str:
    """The sentence a victim's eviction records, for ``why`` from ``victim_candidates``."""
    queue = s.queues[qi].name
    if why == RECLAIMED:
        return (
            f"preempted by job {job.id}: queue {queue} reclaims {s.topo.chip_names[c]} quota lent to "
            f"queue {victim.queue} (borrowed quota goes back first)"
        )
    text = f"preempted by higher-priority job {job.id} in queue {queue}"
    if why == OWN_AFTER_RECLAIM:
        text += " (its own lower-priority work, as borrowed quota alone was not enough)"
    return text


def lowest_priority(s: CycleState, qi: int, c: int, running: list[RunningJob]) -> float:
    """The lowest priority among the whole-GPU jobs of queue ``qi`` on chip ``c`` as the cycle
    read them: a pending job at or below it can evict none of them (thousands of pending jobs
    of one priority ask this in a cycle). Victims chosen later only raise the true lowest, so
    the value stays a safe bound; a list replaced (a job resized) is read again."""
    cached = s.lowest_cache.get((qi, c))
    if cached is None or cached[0] is not running:
        whole = [v.priority for v in running if not v.fractional]
        cached = s.lowest_cache[(qi, c)] = (running, min(whole, default=float("inf")))
    return cached[1]


def admit_by_preemption(
    s: CycleState, qi: int, job: PendingJob, c: int, max_level: int, own: bool = True
) -> bool:
    candidates = victim_candidates(s, qi, job, c, own)
    if not candidates:
        return False
    s.result.preemption_attempts += 1
    lay = s.layout
    gpu_chip = s.topo.gpu_chip
    usable = [
        v.held[s.schedulable[v.held] & ~s.reserved[v.held] & (gpu_chip[v.held] == c)] for v, _ in candidates
    ]
    for level in range(max_level + 1):
        base = s.pools.open.counts(level, c)
        victim_domains = [lay.node_domain[level][lay.gpu_node[g]] for g in usable]
        potential = base.copy()
        for doms in victim_domains:
            np.add.at(potential, doms, 1)
        domains = np.flatnonzero(potential >= job.gpus)
        if not domains.size:
            continue
        domains = domains[np.argsort(potential[domains], kind="stable")][: s.config.max_victim_domains]
        best = None
        for d in domains:
            chosen = victims_for_domain(s, qi, job, c, int(base[d]), d, victim_domains, candidates)
            if chosen is None:
                continue
            cost = (
                sum(1 for i in chosen if candidates[i][0].queue == job.queue),  # borrowers go first
                sum(candidates[i][0].lost_work(s.now) for i in chosen),
                sum(len(candidates[i][0].held) for i in chosen),
            )
            if best is None or cost < best[0]:
                best = (cost, int(d), chosen)
        if best is not None:
            return evict_and_place(
                s, qi, job, c, level, best[1], [candidates[i] for i in best[2]], usable, best[2], max_level
            )
    return False


def victims_for_domain(s: CycleState, qi, job, c, free_here, d, victim_domains, candidates):
    """Victims inside the domain first (they free both GPUs and quota), then any others that
    only free quota, each group in preference order, until the gang fits and the quota allows
    it; then drop, in reverse, every victim that turns out not to be needed.

    Each victim's quota is taken back as it is chosen (and given back when it is dropped, and for
    all of them at the end), so asking whether the quota allows the job costs one check, not one
    charge per victim chosen so far: a gang of 8,192 GPUs choosing among 1,000 jobs of 8 spent
    25 s of a cycle charging and uncharging them (9.6 million charges)."""
    gains = [int(np.count_nonzero(doms == d)) for doms in victim_domains]
    order = [i for i, g in enumerate(gains) if g > 0] + [i for i, g in enumerate(gains) if g == 0]

    def satisfied(have: int) -> bool:
        return have >= job.gpus and quota_ok(s, qi, job, c)

    chosen: list[int] = []  # their quota taken back until the end, but for the dropped
    dropped: set[int] = set()
    have = free_here
    try:
        for i in order:
            if satisfied(have):
                break
            victim = candidates[i][0]
            vq = s.queue_index.get(victim.queue, -1)
            # a borrower gives back what it borrowed, never its own nominal quota (its usage
            # already lacks what its victims chosen so far free)
            if vq != qi and s.quota.usage[vq, c] <= s.quota.nominal[vq, c]:
                continue
            chosen.append(i)
            charge(s, victim, -1)
            have += gains[i]
        if not chosen or not satisfied(have):
            return None
        for i in reversed(chosen):
            charge(s, candidates[i][0], +1)  # without this one: still enough?
            if satisfied(have - gains[i]):
                dropped.add(i)
                have -= gains[i]
            else:
                charge(s, candidates[i][0], -1)
        return [i for i in chosen if i not in dropped]
    finally:
        for i in chosen:
            if i not in dropped:
                charge(s, candidates[i][0], +1)


def quota_ok(s: CycleState, qi, job, c) -> bool:
    """Whether ``job`` fits the quota as it stands; in a cohort it must fit within its queue's
    nominal quota unless the queue allows preempting while borrowing."""
    ok = s.quota.check(qi, c, job.demand).ok
    if ok and s.quota.cohort_of[qi] >= 0 and s.queues[qi].borrow_preempt_max_priority is None:
        ok = s.quota.usage[qi, c] + job.demand <= s.quota.nominal[qi, c]
    return ok


def evict_and_place(s: CycleState, qi, job, c, level, domain, victims, usable, chosen_idx, max_level) -> bool:
    freed = [usable[i] for i in chosen_idx]
    s.no_room.clear()
    s.largest_blocks.clear()
    for (victim, _), gpus in zip(victims, freed, strict=True):
        s.pools.give(gpus)
        charge(s, victim, -1)
    placed = s.pools.place(c, job.gpus, max_level, within=(level, domain))
    if placed is None:  # cannot happen when counts are right; undo and report
        for (victim, _), gpus in zip(victims, freed, strict=True):
            s.pools.take_back(gpus)
            charge(s, victim, +1)
        return False
    gpus, lvl, dom = placed
    for victim, why in victims:
        s.victims.add(victim.id)
        because = eviction_reason(s, qi, job, c, victim, why)
        s.result.preemptions.append(Preemption(victim.id, job.id, because))
    record_admission(s, qi, job, c, gpus, lvl, dom, preempted=[v.id for v, _ in victims])
    return True
