"""Split a gang over several allowed chip types when no single type can hold it.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.mixedplan import mixed_plan
from engine.sites import DATACENTER_LEVEL, DEFAULT_MODEL, gradient_bytes, ring
from engine.steps.admission import record_admission
from engine.steps.elasticity import quota_headroom
from engine.steps.state import CycleState
from engine.steptime import MODELS, Fabric, NoFeasiblePlan
from engine.workload import PendingJob


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
        loads = _link_loads(s, job, parts, gpus, level)
        if loads is None:
            continue  # it would cross a link that has no room left
        s.pools.take(gpus)
        for pair, load in loads:
            s.links.add(pair, load)
        record_admission(s, qi, job, parts[0][0], gpus, level, domain, parts=parts, link_loads=loads)
        return True
    return False


def _link_loads(s: CycleState, job: PendingJob, parts, gpus: np.ndarray, level: int):
    """The share of each link between datacenters a mixed-chip gang on ``gpus`` takes, as any job
    crossing a link does (engine.sites): the bytes its mixed plan sends across per step (the
    gradients' all-reduce over a ring through the datacenters, or the activations at the cut of
    a pipeline split) over its step time, planned over the room the links have left. () inside one
    datacenter or without a site model; None when a link it would cross has no room left, or no
    mixed plan says what it would send."""
    if s.links is None:
        return ()
    lay = s.layout
    dcs = tuple(int(d) for d in np.unique(lay.node_domain[DATACENTER_LEVEL][lay.gpu_node[gpus]]))
    if len(dcs) < 2:
        return ()
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
    return tuple((p, min(sent / plan.step_s, room)) for p in pairs)
