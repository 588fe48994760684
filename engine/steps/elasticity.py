"""Elastic jobs: admitted at the largest size allowed, shrunk to make room, grown into GPUs nobody could use.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.placement import LEVELS, level_limit
from engine.steps.admission import admit_placed, record_admission
from engine.steps.preemption import eviction_reason, victim_candidates
from engine.steps.spanning import admit_elastic_or_span, spans
from engine.steps.state import CycleState
from engine.workload import MILLI, PendingJob, Resize, RunningJob


# --- elastic sizes ------------------------------------------------------------------
def quota_headroom(s: CycleState, qi: int, c: int, sizes: list[int]) -> int:
    """The largest of ``sizes`` (descending) the quota allows now, or 0."""
    lo, hi = 0, len(sizes)  # quota checks are monotone in size: binary search
    while lo < hi:
        mid = (lo + hi) // 2
        if s.quota.check(qi, c, sizes[mid] * MILLI).ok:
            hi = mid
        else:
            lo = mid + 1
    return sizes[lo] if lo < len(sizes) else 0


def admit_elastic(s: CycleState, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
    sizes = list(job.sizes())
    allowed = quota_headroom(s, qi, c, sizes)
    if not allowed:
        return False
    if spans(s, max_level):
        return admit_elastic_or_span(s, qi, job, c, max_level, sizes, allowed)
    block, _, _ = s.pools.open.largest_block(c, max_level)
    size = next((x for x in sizes if x <= min(allowed, block)), 0)
    if not size:
        return False
    return admit_placed(s, qi, replace(job, gpus=size, min_gpus=None), c, max_level)


def admit_by_shrinking(
    s: CycleState, qi: int, job: PendingJob, c: int, max_level: int, own: bool = True
) -> bool:
    """Make room by shrinking elastic jobs the policies would let this job evict."""
    if s.any_shrinkable is None:  # no job becomes shrinkable within a cycle: asked once
        s.any_shrinkable = any(j.shrinkable for j in s.running)
    if not s.any_shrinkable:
        return False
    candidates = [(v, why) for v, why in victim_candidates(s, qi, job, c, own) if v.shrinkable]
    if not candidates:
        return False
    candidates.sort(key=lambda vc: (vc[0].priority, -len(vc[0].held)))
    trial = s.pools.open.copy()
    chosen: list[tuple[RunningJob, int, np.ndarray]] = []

    def deficit() -> int:
        quota_short = job.gpus - (quota_headroom(s, qi, c, list(range(job.gpus, 0, -1))) or 0)
        if trial.find(c, job.gpus, max_level) is not None:
            return max(0, quota_short)
        block, _, _ = trial.largest_block(c, max_level)
        return max(quota_short, job.gpus - block, 1)

    for victim, why in candidates:
        need = deficit()
        if need == 0:
            break
        step = victim.size_step
        count = min(victim.shrinkable, -(-need // step) * step)
        release = np.sort(victim.held)[len(victim.held) - count :]  # the tail: whole nodes first
        trial.give(release[s.schedulable[release] & ~s.reserved[release]])
        s.quota.remove(s.queue_index[victim.queue], c, count * MILLI)
        chosen.append((victim, why, release))
    if deficit() != 0:
        for victim, _, release in chosen:
            s.quota.add(s.queue_index[victim.queue], c, len(release) * MILLI)
        return False
    s.no_room.clear()
    s.largest_blocks.clear()
    for victim, why, release in chosen:
        usable = release[s.schedulable[release] & ~s.reserved[release]]
        s.pools.give(usable)
        keep = np.setdiff1d(victim.held, release)
        replace_running(s, victim, replace(victim, held=keep))
        because = eviction_reason(s, qi, job, c, victim, why)
        reason = f"shrunk from {len(victim.held)} to {len(keep)} GPUs for job {job.id} ({because})"
        s.result.resizes.append(
            Resize(victim.id, len(victim.held), keep, np.empty(0, np.int64), release, reason, job.id)
        )
    placed = s.pools.place(c, job.gpus, max_level)
    if placed is None:
        raise AssertionError("a shrink simulated to make room did not")  # counts are exact
    gpus, level, domain = placed
    record_admission(s, qi, job, c, gpus, level, domain)
    return True


def replace_running(s: CycleState, old: RunningJob, new: RunningJob) -> None:
    s.resized.add(old.id)
    s.running = [new if j.id == old.id else j for j in s.running]
    key = (s.queue_index.get(old.queue, -1), s.chip_index.get(old.chip, -1))
    s.running_by_queue_chip[key] = [new if j.id == old.id else j for j in s.running_by_queue_chip[key]]


def grow(s: CycleState) -> None:
    """Elastic jobs below their maximum take GPUs no pending job could use this cycle."""
    growing = [j for j in s.running if j.growable and j.id not in s.victims and j.id not in s.resized]
    growing.sort(key=lambda j: (-j.priority, j.started_at, j.id))
    for job in growing:
        qi, c = s.queue_index.get(job.queue, -1), s.chip_index.get(job.chip, -1)
        if qi < 0 or c < 0 or s.queues[qi].stopped or c in s.capacity_blocked_chips:
            continue
        level = level_limit(job.topology)
        domain = int(s.layout.node_domain[level][s.layout.gpu_node[job.held[0]]])
        room = int(s.pools.open.counts(level, c)[domain])
        step = job.size_step
        sizes = list(range(min(job.growable, room - room % step), 0, -step))
        add = quota_headroom(s, qi, c, sizes) if sizes else 0
        if not add:
            continue
        placed = s.pools.place(c, add, level, within=(level, domain))
        if placed is None:
            continue
        s.quota.add(qi, c, add * MILLI)
        gpus = np.sort(np.concatenate([job.held, placed[0]]))
        replace_running(s, job, replace(job, held=gpus))
        s.result.resizes.append(
            Resize(
                job.id,
                len(job.held),
                gpus,
                placed[0],
                np.empty(0, np.int64),
                f"grew from {len(job.held)} to {len(gpus)} GPUs: free {job.chip} GPUs in its {LEVELS[level]}",
            )
        )
