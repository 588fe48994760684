"""Place a gang across datacenters only when it pays, within the links' capacity (engine.sites).

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result, links). A gang allowed to span datacenters goes into one datacenter when
one holds it now. Otherwise the placement across datacenters is found (nothing taken yet), its
slowdown is modelled over the bandwidth the links have left, the wait until one datacenter could
hold it is estimated as a reservation would be, and the policy decides: span (the admission says
why, and the job takes its share of each link it crosses) or wait (the job reserves inside one
datacenter, and its pending reason says why it did not span). An elastic gang compares instead
the largest size one datacenter holds now with a larger one across datacenters."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from engine.sites import (
    DATACENTER_LEVEL,
    DEFAULT_MODEL,
    SpanChoice,
    SpanCost,
    decide,
    fastest,
    one_site_step_s,
    replica_sizes,
    replica_split,
    shrink_or_span,
    span_cost,
    why_not,
)
from engine.stagecut import stage_quanta
from engine.steps.admission import admit_placed, record_admission
from engine.steps.reservation import earliest
from engine.steps.state import CycleState
from engine.steptime import MODELS
from engine.workload import PendingJob


def spans(s: CycleState, max_level: int) -> bool:
    """Whether the site model decides for a gang with this level limit."""
    return s.links is not None and max_level > DATACENTER_LEVEL


def _datacenters_in(s: CycleState, where) -> np.ndarray:
    """The datacenters inside domain ``where`` (a region, or the whole cluster)."""
    if where[0] == DATACENTER_LEVEL + 1:
        return s.layout.children_of(*where)
    return np.arange(s.layout.domain_count[DATACENTER_LEVEL])


def _splits(s: CycleState, job: PendingJob, c: int, chip: str, where):
    """GPUs per datacenter of domain ``where`` for the gang, counted only (the GPUs are picked when
    it spans), with their cost: each datacenter holding whole model replicas (the first replica
    size of the job's best plans that splits, engine.sites.replica_split) or whole pipeline
    stages of every replica (the first stage size that splits, engine.stagecut), chosen as
    engine.sites.fastest does. None without such a split."""
    counts = s.pools.open.counts(DATACENTER_LEVEL, c)
    free = {int(d): int(counts[d]) for d in _datacenters_in(s, where) if counts[d]}
    found = []
    model = job.model or MODELS[DEFAULT_MODEL]
    for quanta in (replica_sizes(model, chip, job.gpus), stage_quanta(model, chip, job.gpus)):
        for quantum in quanta:
            split = replica_split(free, job.gpus, quantum)
            if split is not None and len(split) >= 2:
                used = {d: n - n % quantum for d, n in split.items()}
                found.append((split, span_cost(job.model, chip, used, s.links), used))
                break
    if not found:
        return None
    costed = [f for f in found if f[1] is not None]
    if not costed:
        return found[0]
    return fastest(costed, lambda f: f[1].span_step_s, lambda f: sum(load for _, load in f[1].loads))


class Across(NamedTuple):
    """A gang's placement across datacenters, nothing taken yet, and what it costs there."""

    where: tuple[int, int]  # the domain (a region, or the cluster) it spans inside
    take: dict[int, int]  # GPUs it takes per datacenter
    replicas: dict[int, int]  # GPUs per datacenter the plan runs on (whole replicas or whole stages)
    chosen: np.ndarray | None  # its GPUs, or None: picked per datacenter only when it spans
    cost: SpanCost | None  # None: no link has room, or no plan keeps whole replicas or stages


def _across(s: CycleState, job: PendingJob, c: int, max_level: int) -> Across | None:
    """The gang's placement across datacenters, or None without room across. Without a split
    keeping whole replicas in each datacenter, the plain best-fit choice, the replicas as it
    falls."""
    where = s.pools.open.find(c, job.gpus, max_level)
    if where is None or where[0] <= DATACENTER_LEVEL:
        return None
    chip = s.topo.chip_names[c]
    found = _splits(s, job, c, chip, where)
    if found is not None:
        take, cost, used = found
        return Across(where, take, used, None, cost)
    chosen = s.pools.open.choose(*where, c, job.gpus)
    lay = s.layout
    dcs, n = np.unique(lay.node_domain[DATACENTER_LEVEL][lay.gpu_node[chosen]], return_counts=True)
    split = {int(d): int(k) for d, k in zip(dcs, n, strict=True)}
    return Across(where, split, split, chosen, span_cost(job.model, chip, split, s.links))


def datacenter_names(s: CycleState, dcs) -> dict[int, str]:
    """Short names of datacenters ("bj1"), by index."""
    return {d: s.layout.domain_name(DATACENTER_LEVEL, d).removeprefix("datacenter ") for d in dcs}


def one_datacenter_wait(s: CycleState, job: PendingJob, c: int) -> tuple[float, str] | None:
    """How long until one datacenter could hold the gang on chip ``c`` by the running jobs'
    estimated ends (as a reservation finds it), and which one; None without an estimate."""
    soonest = earliest(s, job, c, DATACENTER_LEVEL)
    if soonest is None:
        return None
    return soonest[0] - s.now, s.layout.domain_name(*soonest[2]).removeprefix("datacenter ")


def span_choice(
    s: CycleState,
    job: PendingJob,
    cost: SpanCost | None,
    dcs,
    wait: tuple[float, str] | None,
    t0: float,
    why_none: str | None = None,
) -> SpanChoice:
    """engine.sites.decide for the gang under the cycle's policy and margin: spanning ``dcs`` at
    ``cost`` against ``wait`` (seconds, where; None: no estimate); the decision timed from ``t0``."""
    wait_s, wait_in = wait if wait is not None else (None, "one datacenter")
    more = (why_none,) if why_none else ()
    policy, margin = s.config.span_policy, s.config.span_margin
    names = datacenter_names(s, dcs)
    choice = decide(cost, names, wait_s, wait_in, job.estimated_duration_s, policy, margin, s.links, *more)
    s.result.span_decisions_s.append(time.perf_counter() - t0)
    return choice


def _span(s: CycleState, qi: int, job: PendingJob, c: int, found: Across, note: str) -> None:
    """Admit the gang across datacenters: it takes its GPUs and its share of each link."""
    chosen, cost = found.chosen, found.cost
    if chosen is None:
        pick = s.pools.open.choose
        chosen = np.concatenate([pick(DATACENTER_LEVEL, d, c, n) for d, n in found.take.items()])
    s.pools.take(chosen)
    for pair, load in cost.loads:
        s.links.add(pair, load)
    level, domain = found.where
    record_admission(
        s,
        qi,
        job,
        c,
        chosen,
        level,
        domain,
        span_note=note,
        link_loads=cost.loads,
        span_slowdown=cost.slowdown,
    )


def admit_placed_or_span(s: CycleState, qi: int, job: PendingJob, c: int, max_level: int) -> bool:
    """Admit the gang inside one datacenter, or across several where the policy says so."""
    if not spans(s, max_level):
        return admit_placed(s, qi, job, c, max_level)
    if admit_placed(s, qi, job, c, DATACENTER_LEVEL):
        return True
    if s.config.span_policy == "never":
        return False
    t0 = time.perf_counter()
    found = _across(s, job, c, max_level)
    if found is None:
        return False
    cost = found.cost
    wait = one_datacenter_wait(s, job, c) if s.config.span_policy == "pays" and cost is not None else None
    choice = span_choice(s, job, cost, found.replicas, wait, t0, why_not(found.replicas, s.links))
    if not choice.span:
        s.span_waits[job.id] = choice.note
        return False
    _span(s, qi, job, c, found, choice.note)
    return True


def admit_elastic_or_span(
    s: CycleState, qi: int, job: PendingJob, c: int, max_level: int, sizes, allowed
) -> bool:
    """An elastic gang that may span: at the largest size one datacenter holds now, or at a
    larger size across datacenters when that runs faster (engine.sites.shrink_or_span)."""
    inside = min(allowed, s.pools.open.largest_block(c, DATACENTER_LEVEL)[0])
    across = (
        min(allowed, s.pools.open.largest_block(c, max_level)[0]) if s.config.span_policy != "never" else 0
    )
    small = next((x for x in sizes if x <= inside), 0)
    large = next((x for x in sizes if x <= across), 0)
    note = ""
    if large > small:
        t0 = time.perf_counter()
        big = replace(job, gpus=large, min_gpus=None)
        found = _across(s, big, c, max_level)
        if found is not None:
            chip = s.topo.chip_names[c]
            choice = shrink_or_span(
                found.cost,
                large,
                datacenter_names(s, found.replicas),
                one_site_step_s(job.model, chip, small) if small else None,
                small,
                s.config.span_policy,
                s.config.span_margin,
                s.links,
            )
            s.result.span_decisions_s.append(time.perf_counter() - t0)
            if choice.span:
                _span(s, qi, big, c, found, choice.note)
                return True
            note = choice.note
    if not small:
        return False
    one = replace(job, gpus=small, min_gpus=None)
    if not note:
        return admit_placed(s, qi, one, c, DATACENTER_LEVEL)
    placed = s.pools.place(c, small, DATACENTER_LEVEL)
    if placed is None:
        return False
    record_admission(s, qi, one, c, *placed, span_note=note)
    return True
