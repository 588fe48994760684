"""Split a gang over several allowed chip types when no single type can hold it.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result). A split that crosses datacenters takes its share of the links, and under
the site model it is decided as a single-type gang's span is (engine.steps.spanning): span now,
or wait for one datacenter to hold the gang on one chip type, whichever finishes sooner."""

from __future__ import annotations

import time
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
from engine.steps.spanning import one_datacenter_wait, span_choice
from engine.steps.state import CycleState
from engine.steptime import MODELS, Fabric, NoFeasiblePlan
from engine.workload import PendingJob


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
            choice = span_or_wait(s, qi, job, chips, crossing)
            if not choice.span:
                s.span_waits[job.id] = choice.note
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


def span_or_wait(s: CycleState, qi: int, job: PendingJob, chips: list[int], crossing: Crossing) -> SpanChoice:
    """Span now, or wait until one datacenter holds the gang on one of its chip types (the soonest
    by the running jobs' estimated ends, as a reservation would find it, on a type whose quota
    could hold it): engine.sites.decide over the mixed plan's step time across the link against
    the one-datacenter step time on the type it would wait for (its first type when it would
    wait for none)."""
    t0 = time.perf_counter()
    wait, wait_chip = None, chips[0]
    if s.config.span_policy == "pays":
        for c in chips:
            if s.quota.ceiling(qi, c) < job.demand:
                continue
            found = one_datacenter_wait(s, job, c)
            if found is not None and (wait is None or found[0] < wait[0]):
                wait, wait_chip = found, c
    chip = s.topo.chip_names[wait_chip]
    dcs = tuple(dc for dc, _ in crossing.per_dc)
    cost = SpanCost(
        dcs=dcs,
        one_step_s=one_site_step_s(job.model, chip, job.gpus) or crossing.step_s,
        span_step_s=crossing.step_s,
        loads=crossing.loads,
        stages=crossing.per_dc,
        plan=crossing.plan,
        cut="chips",
    )
    if wait is not None:
        wait = (wait[0], f"{wait[1]} on {chip}")
    return span_choice(s, job, cost, dcs, wait, t0)


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
