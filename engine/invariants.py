"""Invariants that must hold after every scheduling cycle. Tests and the simulator run them.

- no GPU is held by two jobs, except fractions of a shared GPU that add up to at most 1000
  thousandths (a whole-GPU job never shares);
- every admitted gang is whole (exactly the GPUs it asked for, or for an elastic job one of its
  sizes), on one chip type it allows,
  within the topology domain it allows, on GPUs that were free and schedulable;
- no job of a stopped queue is admitted;
- quotas, borrowing and lending limits hold (no rule broken that was not already broken before);
- a job is either admitted or pending with a reason, never both; victims were running;
- a resized job was running, keeps its chip type and stays within its size range.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.arrays import running_counts
from engine.placement import Layout, level_limit
from engine.quota import build_quota_book
from engine.reasons import PENDING_KINDS
from engine.workload import MILLI, CycleResult, PendingJob, QueueSpec, RunningJob


class InvariantViolation(AssertionError):
    pass


def running_after(running: list[RunningJob], result: CycleResult, pending: list[PendingJob], now: float):
    """The running set after applying a cycle's decisions."""
    victims = {p.job_id for p in result.preemptions}
    resized = {r.job_id: r.held for r in result.resizes}
    by_id = {j.id: j for j in pending}
    after = [replace(j, held=resized.get(j.id, j.held)) for j in running if j.id not in victims]
    for a in result.admissions:
        after.append(by_id[a.job_id].started(a.held, a.chip, now, a.parts))
    return after


@dataclass
class _Context:
    """What the checks of one cycle share: the snapshot's masks and the GPUs in use before it."""

    layout: Layout
    queues: dict[str, QueueSpec]
    schedulable: np.ndarray
    usable: np.ndarray
    used_before: np.ndarray  # thousandths of each GPU held before the cycle by jobs that stay
    freed_by_shrink: np.ndarray

    @property
    def topo(self):
        return self.layout.topo


def check_cycle(
    layout: Layout,
    queues: list[QueueSpec],
    running: list[RunningJob],
    pending: list[PendingJob],
    result: CycleResult,
    now: float = 0.0,
) -> list[RunningJob]:
    """Raise InvariantViolation listing every broken rule; return the running set after the cycle."""
    topo = layout.topo
    problems = _decision_problems(running, pending, result)
    victims = {p.job_id for p in result.preemptions}
    used_before = np.zeros(topo.num_gpus, dtype=np.int32)
    for j in running:
        if j.id not in victims:
            np.add.at(used_before, j.held, j.share)
    ctx = _Context(
        layout,
        {q.name: q for q in queues},
        topo.schedulable(),
        topo.usable(),
        used_before,
        np.zeros(topo.num_gpus, dtype=bool),
    )
    by_running = {j.id: j for j in running}
    for r in result.resizes:
        problems += _resize_problems(ctx, r, by_running.get(r.job_id), victims)
    by_id = {j.id: j for j in pending}
    for a in result.admissions:
        job = by_id.get(a.job_id)
        if job is None:
            problems.append(f"admitted job {a.job_id} was not pending")
            continue
        problems += _admission_problems(ctx, a, job)

    after = running_after(running, result, pending, now)
    used = np.zeros(topo.num_gpus, dtype=np.int32)
    for j in after:
        np.add.at(used, j.held, j.share)
    if (used > MILLI).any():
        problems.append(f"{int((used > MILLI).sum())} GPUs are held beyond their capacity")
    before_violations = set(build_quota_book(queues, topo.chip_names, running).violations())
    new_violations = set(build_quota_book(queues, topo.chip_names, after).violations()) - before_violations
    problems.extend(sorted(new_violations))
    problems += _array_problems(running, pending, after, by_id, result)
    if problems:
        raise InvariantViolation("; ".join(problems))
    return after


def _array_problems(running, pending, after, by_id, result: CycleResult) -> list[str]:
    """No admission takes an array past its running limit (an array already past it, after its
    limit was lowered, may stay there but gains nothing)."""
    limits = {j.array: j.array_limit for j in pending if j.array is not None and j.array_limit is not None}
    before, now = running_counts(running), running_counts(after)
    grew = {by_id[a.job_id].array for a in result.admissions if a.job_id in by_id}
    return [
        f"array {array} runs {now.get(array, 0)} jobs, over its limit of {limit}"
        for array, limit in sorted(limits.items())
        if array in grew and now.get(array, 0) > max(limit, before.get(array, 0))
    ]


def _decision_problems(running, pending, result: CycleResult) -> list[str]:
    """Every pending job is admitted once or given a reason; only running jobs are preempted."""
    problems = []
    admitted = [a.job_id for a in result.admissions]
    if len(admitted) != len(set(admitted)):
        problems.append("a job was admitted twice in one cycle")
    for job_id in set(admitted) & set(result.pending):
        problems.append(f"job {job_id} is both admitted and pending")
    for job in pending:
        if job.id not in result.pending and job.id not in admitted:
            problems.append(f"job {job.id} is neither admitted nor given a pending reason")
        reason = result.pending.get(job.id)
        if job.id in result.pending and not reason:
            problems.append(f"job {job.id} is pending with an empty reason")
        elif reason is not None and getattr(reason, "kind", None) not in PENDING_KINDS:
            problems.append(f"job {job.id} is pending for a reason of no kind: {reason}")
    running_ids = {j.id for j in running}
    for p in result.preemptions:
        if p.job_id not in running_ids:
            problems.append(f"preempted job {p.job_id} was not running")
    return problems


def _resize_problems(ctx: _Context, r, job: RunningJob | None, victims: set[int]) -> list[str]:
    """A resize stays within the job's range, on its chip type and schedulable GPUs."""
    if job is None:
        return [f"resized job {r.job_id} was not running"]
    problems, topo = [], ctx.topo
    if r.job_id in victims:
        problems.append(f"job {r.job_id} was both resized and preempted")
    low = job.min_gpus if job.min_gpus is not None else len(job.held)
    high = job.max_gpus if job.max_gpus is not None else len(job.held)
    if not low <= len(r.held) <= high:
        problems.append(f"job {r.job_id} resized to {len(r.held)} GPUs, outside {low}-{high}")
    if len(r.added):
        chips = {topo.chip_names[c] for c in np.unique(topo.gpu_chip[r.added])}
        if chips != {job.chip}:
            problems.append(f"job {r.job_id} grew onto chip types {sorted(chips)}, not {job.chip}")
        if not ctx.schedulable[r.added].all():
            problems.append(f"job {r.job_id} grew onto GPUs that are not schedulable")
    ctx.freed_by_shrink[r.released] = True
    return problems


def _admission_problems(ctx: _Context, a, job: PendingJob) -> list[str]:
    """An admission gets the GPUs it asked for, of its chip types, free, schedulable (or spares its
    queue may borrow), inside its topology domain, from a queue that is not stopped."""
    problems, topo, layout = [], ctx.topo, ctx.layout
    gpus = np.asarray(a.held)
    if len(np.unique(gpus)) != len(gpus) or len(gpus) not in job.sizes():
        problems.append(f"job {job.id} asked for {job.gpus} GPUs and got {len(np.unique(gpus))}")
    admitted_as = {chip for chip, _ in a.parts} if a.parts else {a.chip}
    if job.chip_types and not admitted_as <= set(job.chip_types):
        problems.append(f"job {job.id} placed on {sorted(admitted_as)}, not within {job.chip_types}")
    if len(admitted_as) > 1 and not job.mixed:
        problems.append(f"job {job.id} was split over chip types without allowing it")
    chips = {topo.chip_names[c] for c in np.unique(topo.gpu_chip[gpus])}
    if chips != admitted_as:
        problems.append(
            f"job {job.id} placed on chip types {sorted(chips)} but admitted as {sorted(admitted_as)}"
        )
    if a.parts:
        counts = {
            topo.chip_names[c]: int(n)
            for c, n in zip(*np.unique(topo.gpu_chip[gpus], return_counts=True), strict=True)
        }
        if counts != dict(a.parts):
            problems.append(f"job {job.id} admitted with parts {dict(a.parts)} but holds {counts}")
    queue = ctx.queues.get(job.queue)
    if a.on_spares:
        if queue is None or not queue.may_use_spares:
            problems.append(f"job {job.id} placed on spare nodes its queue may not borrow")
        if not (ctx.usable[gpus] & topo.node_spare[topo.gpu_node[gpus]]).all():
            problems.append(f"job {job.id} placed on spares that are not usable spare GPUs")
    elif not ctx.schedulable[gpus].all():
        problems.append(f"job {job.id} placed on GPUs that are not schedulable")
    busy = ctx.used_before[gpus] * ~ctx.freed_by_shrink[gpus] + job.share > MILLI
    if busy.any():
        problems.append(f"job {job.id} placed on {int(busy.sum())} GPUs held by running jobs")
    if job.fractional and len(gpus) != 1:
        problems.append(f"job {job.id} shares GPUs but was given {len(gpus)}")
    max_level = level_limit(job.topology)
    if max_level < len(layout.node_domain) - 1:
        domains = np.unique(layout.node_domain[max_level][topo.gpu_node[gpus]])
        if len(domains) > 1:
            problems.append(f"job {job.id} spans {len(domains)} domains at level {job.topology}")
    if queue is not None and queue.stopped:
        problems.append(f"job {job.id} admitted from stopped queue {job.queue}")
    return problems
