"""Split a gang over several allowed chip types when no single type can hold it.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result). A split that crosses datacenters takes its share of the links, and under
the site model it is decided as a single-type gang's span is (engine.steps.spanning): span now,
or wait for one datacenter to hold the gang, on one chip type or split over them, whichever
finishes sooner; a gang that waits for a split holds that room over its types."""

from __future__ import annotations

import time
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from engine.mixedplan import mixed_plan
from engine.sites import (
    DATACENTER_LEVEL,
    DEFAULT_MODEL,
    SpanChoice,
    SpanCost,
    gradient_bytes,
    one_site_step_s,
    ring,
)
from engine.steps.admission import record_admission
from engine.steps.elasticity import quota_headroom
from engine.steps.reservation import ending_jobs, hold, returnable
from engine.steps.spanning import datacenter_names, one_datacenter_wait, span_choice
from engine.steps.state import CycleState
from engine.steptime import MODELS, Fabric, NoFeasiblePlan
from engine.workload import MILLI, PendingJob, Reservation


class Crossing(NamedTuple):
    """What a mixed-chip split sends over the links between datacenters (nothing: ``loads`` empty,
    inside one datacenter or without a site model)."""

    per_dc: tuple[tuple[int, int], ...] = ()  # (datacenter, its GPUs) of each datacenter it spans
    loads: tuple = ()  # (link, bytes/s) it takes of each link it crosses
    step_s: float = 0.0  # its mixed plan's step time there
    plan: str = ""  # e.g. "24 H100-SXM + 24 H200, data-parallel split"


# --- mixed chips -----------------------------------------------------------------------
def admit_mixed(s: CycleState, qi: int, job: PendingJob, chips: list[int], max_level: int) -> bool:
    """Split the gang over several allowed chip types inside the smallest domain that holds it
    (preferred chip types first, each within its quota), when no single type can."""
    sizes = list(range(job.gpus, 0, -1))
    headroom = {c: quota_headroom(s, qi, c, sizes) for c in chips}
    if sum(headroom.values()) < job.gpus:
        return False
    for level in range(max_level + 1):
        usable = sum(np.minimum(s.pools.open.counts(level, c), headroom[c]) for c in chips)
        fits = np.flatnonzero(usable >= job.gpus)
        if not fits.size:
            continue
        domain = int(fits[np.argmin(usable[fits])])
        parts, remaining = [], job.gpus
        for c in chips:
            take = int(min(s.pools.open.counts(level, c)[domain], headroom[c], remaining))
            if take:
                parts.append((c, take))
                remaining -= take
            if not remaining:
                break
        if len(parts) < 2:
            return False  # one type would do: the homogeneous path already said why it did not
        gpus = np.concatenate([s.pools.open.choose(level, domain, c, n) for c, n in parts])
        crossing = _crossing(s, job, parts, gpus, level)
        if crossing is None:
            continue  # it would cross a link that has no room left
        note, slowdown = "", 0.0
        if crossing.loads:
            choice, inside = span_or_wait(s, qi, job, chips, crossing)
            if not choice.span:
                s.span_waits[job.id] = choice.note
                if inside is not None:  # it waits for a mixed split in one datacenter: hold it
                    s.span_reserved[job.id] = _reserve_inside(s, job, inside)
                return False
            note, slowdown = choice.note, max(0.0, choice.cost.slowdown)
        s.pools.take(gpus)
        for pair, load in crossing.loads:
            s.links.add(pair, load)
        record_admission(
            s,
            qi,
            job,
            parts[0][0],
            gpus,
            level,
            domain,
            parts=parts,
            link_loads=crossing.loads,
            span_note=note,
            span_slowdown=slowdown,
        )
        return True
    return False


class Inside(NamedTuple):
    """When and where the gang could start split over its types inside one datacenter."""

    start: float
    dc: int
    parts: tuple[tuple[int, int], ...]  # (chip index, GPUs) in that datacenter
    given: np.ndarray  # the GPUs the running jobs ending until then give back


def span_or_wait(
    s: CycleState, qi: int, job: PendingJob, chips: list[int], crossing: Crossing
) -> tuple[SpanChoice, Inside | None]:
    """Span now, or wait until one datacenter holds the gang, on one of its chip types or split
    over them (the soonest by the running jobs' estimated ends, as a reservation finds it, each
    type within what its queue could ever hold): engine.sites.decide over the mixed plan's step
    time across the link against the step time in one datacenter of what it would wait for (its
    first type when it would wait for nothing). Returns the choice and, when the wait weighed is
    for a split in one datacenter, that split (to reserve)."""
    t0 = time.perf_counter()
    model = job.model or MODELS[DEFAULT_MODEL]
    wait, one_step, inside = None, None, None
    if s.config.span_policy == "pays":
        for c in chips:
            if s.quota.ceiling(qi, c) < job.demand:
                continue
            found = one_datacenter_wait(s, job, c)
            if found is not None and (wait is None or found[0] < wait[0]):
                chip = s.topo.chip_names[c]
                wait, one_step = (
                    (found[0], f"{found[1]} on {chip}"),
                    one_site_step_s(job.model, chip, job.gpus),
                )
        split = _inside_start(s, qi, job, chips)
        if split is not None and len(split.parts) > 1 and (wait is None or split.start - s.now < wait[0]):
            by_chip = tuple((s.topo.chip_names[c], n) for c, n in split.parts)
            step = _inside_step_s(model, by_chip)
            if step is not None:
                name = datacenter_names(s, [split.dc])[split.dc]
                kinds = " + ".join(f"{n} {chip}" for chip, n in by_chip)
                wait, one_step, inside = (split.start - s.now, f"{name} as {kinds}"), step, split
    if wait is None:  # against its first type in one datacenter
        one_step = one_site_step_s(job.model, s.topo.chip_names[chips[0]], job.gpus)
    dcs = tuple(dc for dc, _ in crossing.per_dc)
    cost = SpanCost(
        dcs=dcs,
        one_step_s=one_step or crossing.step_s,
        span_step_s=crossing.step_s,
        loads=crossing.loads,
        stages=crossing.per_dc,
        plan=crossing.plan,
        cut="chips",
    )
    return span_choice(s, job, cost, dcs, wait, t0), inside


@lru_cache(maxsize=1024)
def _inside_step_s(model, by_chip: tuple[tuple[str, int], ...]) -> float | None:
    """The step time of a mixed plan over ``by_chip`` inside one datacenter (None: no plan fits);
    kept, as the same gang is weighed again each cycle it waits."""
    try:
        return mixed_plan(model, dict(by_chip), span_level=DATACENTER_LEVEL).step_s
    except (NoFeasiblePlan, KeyError, ValueError):
        return None


def _inside_start(s: CycleState, qi: int, job: PendingJob, chips: list[int]) -> Inside | None:
    """When one datacenter could first hold the gang over its types (each up to what its queue
    could ever hold) as running jobs end by their estimates, and its parts there; None if never.
    Counted at once for every ending job: what each gives back per type and datacenter, summed in
    order of their ends."""
    lay = s.layout
    n = lay.domain_count[DATACENTER_LEVEL]
    cap = np.array([s.quota.ceiling(qi, c) // MILLI for c in chips], dtype=np.int64)[:, None]
    have = np.stack([s.pools.open.counts(DATACENTER_LEVEL, c) for c in chips]).astype(np.int64)
    usable = returnable(s)
    ends, types, gpus = [], [], []
    for t, c in enumerate(chips):
        ending, held = ending_jobs(s, c)
        ends += [j.estimated_end for j in ending]
        types += [t] * len(ending)
        gpus += held
    if not ends:
        return None
    order = np.argsort(ends, kind="stable")
    gpus = [gpus[k] for k in order]
    event = np.repeat(np.arange(len(gpus)), [len(g) for g in gpus])  # its ending job, per GPU
    given = np.concatenate(gpus)
    kept = usable[given]
    given, event = given[kept], event[kept]
    width = len(chips) * n
    column = np.asarray(types)[order][event] * n + lay.node_domain[DATACENTER_LEVEL][lay.gpu_node[given]]
    added = np.bincount(event * width + column, minlength=len(gpus) * width).reshape(len(gpus), width)
    have = have[None] + np.cumsum(added, axis=0).reshape(len(gpus), len(chips), n)
    room = np.minimum(have, cap[None])  # (ending job, type, datacenter)
    holds = room.sum(axis=1) >= job.gpus
    first = np.flatnonzero(holds.any(axis=1))
    if not first.size:
        return None
    k = int(first[0])
    dcs = np.flatnonzero(holds[k])
    d = int(dcs[np.argmax(room[k][:, dcs].sum(axis=0))])  # the one with the most room
    parts, remaining = [], job.gpus
    for i, c in enumerate(chips):
        take = int(min(room[k, i, d], remaining))
        if take:
            parts.append((c, take))
            remaining -= take
    start = max(float(np.asarray(ends)[order][k]), s.now)
    return Inside(start, d, tuple(parts), given[event <= k])


def _reserve_inside(s: CycleState, job: PendingJob, inside: Inside) -> Reservation:
    """Reserve the split the gang waits for in one datacenter (engine.steps.reservation.hold)."""
    trial = s.pools.open.copy()
    trial.give(inside.given)
    chosen = np.concatenate([trial.choose(DATACENTER_LEVEL, inside.dc, c, n) for c, n in inside.parts])
    names = "+".join(s.topo.chip_names[c] for c, _ in inside.parts)
    return hold(s, job, names, chosen, inside.start, s.layout.domain_name(DATACENTER_LEVEL, inside.dc))


def _crossing(s: CycleState, job: PendingJob, parts, gpus: np.ndarray, level: int) -> Crossing | None:
    """What a mixed-chip gang on ``gpus`` sends between datacenters and its share of each link it
    crosses, as any job crossing a link takes (engine.sites): the bytes its mixed plan sends
    across per step (the gradients' all-reduce over a ring through the datacenters, or the
    activations at the cut of a pipeline split) over its step time, planned over the room the
    links have left. Nothing inside one datacenter or without a site model; None when a link it
    would cross has no room left, or no mixed plan says what it would send."""
    if s.links is None:
        return Crossing()
    lay = s.layout
    where, counts = np.unique(lay.node_domain[DATACENTER_LEVEL][lay.gpu_node[gpus]], return_counts=True)
    if len(where) < 2:
        return Crossing()
    dcs = tuple(int(d) for d in where)
    pairs = ring(dcs)
    room = min(s.links.headroom(p) for p in pairs)
    if room <= 0:
        return None
    model = job.model or MODELS[DEFAULT_MODEL]
    by_chip = {s.topo.chip_names[c]: n for c, n in parts}
    try:
        plan = mixed_plan(
            model,
            by_chip,
            fabric=Fabric(datacenter_link_gbps=room / 1e9),
            span_level=level,
            datacenters=len(dcs),
        )
    except (NoFeasiblePlan, KeyError, ValueError):
        return None
    k = len(dcs)
    sent = (
        2.0 * model.batch_tokens * model.hidden
        if plan.layout == "pipeline split"
        else gradient_bytes(model, k)
    )
    kinds = " + ".join(f"{n} {chip}" for chip, n in by_chip.items())
    loads = tuple((p, min(sent / plan.step_s, room)) for p in pairs)
    per_dc = tuple((d, int(n)) for d, n in zip(dcs, counts, strict=True))
    return Crossing(per_dc, loads, plan.step_s, f"{kinds}, {plan.layout}")
