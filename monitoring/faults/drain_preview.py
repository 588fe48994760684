"""What draining or marking down a node, rack or pod would hit, shown before an operator does it:
the jobs with GPUs there, their GPUs there and in all, the work since each one's last checkpoint
and how much of it the action would lose (a drain lets a policy that saves on demand save first; a
node marked down stops its work at once: engine.lifecycle.stop, the rule both actions follow), and
where each job could run instead right now (free GPUs of its chip types in one domain its topology
allows, outside the domain; before quota and priority, which the next cycle applies). Then the
action itself, on every node of the domain it may take, with the operator's reason in the audit."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.utils import timezone

from cluster.models import Node
from cluster.services import apply_node_action
from cluster.snapshot import topology_cache
from engine import lifecycle
from engine.placement import LEVELS as PLACEMENT_LEVELS
from engine.placement import level_limit
from engine.states import NODE_ACTIONS, NODE_STATES
from monitoring.telemetry import domains
from monitoring.telemetry.domains import LevelQueryError, UnknownDomain
from scheduling.checkpoints import job_policy
from scheduling.models import Job
from scheduling.store import allocations, layouts

DRAINABLE = ("pod", "rack", "node")
ACTIONS = {"drain": "drain", "mark-down": "mark_down"}  # as the API spells them: engine.states' name


def _domain(snap, within: str) -> tuple[str, int, np.ndarray]:
    """(level, cell, node indices) of ``within`` (LEVEL:ID of a pod, rack or node)."""
    level, _, ident = (within or "").partition(":")
    if level not in DRAINABLE or not domains.an_id(ident):
        raise LevelQueryError("within", "must be pod:ID, rack:ID or node:ID")
    found = np.flatnonzero(domains.ids(snap, level) == int(ident))
    if not len(found):
        raise UnknownDomain("within", f"there is no {level} with id {ident}")
    hierarchy, _ = domains.hierarchy(snap)
    cell = int(found[0])
    nodes = np.array([cell]) if level == "node" else hierarchy.within("node", level, cell)
    return level, cell, nodes


def _place_name(snap, level: int, domain: int) -> str:
    name = PLACEMENT_LEVELS[level]
    if name == "node":
        return snap.node_hostname[domain]
    if name == "rack":
        _, racks = domains.hierarchy(snap)
        return f"{snap.names['pod'][snap.rack_pod[domain]]}/{racks[domain]}"
    if name in ("pod", "datacenter", "region"):
        return snap.names[name][domain]
    return "the cluster"


def held_gpus(snap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(GPUs held by a running job as a mask, and for each held GPU its index and its job)."""

    pairs = allocations.active_pairs()
    held = np.zeros(len(snap.gpu_id), dtype=bool)
    if not len(pairs):
        return held, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    gpu = topology_cache.gpu_indices(pairs[:, 1])  # the cached order of the snapshot's GPU ids
    held[gpu] = True
    return held, gpu, pairs[:, 0]


def where_it_fits(snap, job, free: np.ndarray) -> str:
    """Where ``job`` could run right now among the ``free`` GPUs: the domain of the widest level
    its topology allows with the most free GPUs of its chip types, if that is enough (before quota
    and priority, which the next cycle applies)."""

    layout = layouts.layout(snap)
    chips = [snap.chip_names.index(c) for c in job.chip_types if c in snap.chip_names]
    fits = free & (np.isin(snap.node_chip[snap.gpu_node], chips) if chips else True)
    limit = level_limit(job.topology)
    counts = np.bincount(layout.node_domain[limit][snap.gpu_node[fits]], minlength=layout.domain_count[limit])
    best = int(np.argmax(counts)) if len(counts) else 0
    room = int(counts[best]) if len(counts) else 0
    if room >= job.gpus:
        return f"room now in {_place_name(snap, limit, best)}: {room} free GPUs"
    return (
        f"no room now: at most {room} free GPUs in one {PLACEMENT_LEVELS[limit]}; "
        f"it waits in queue {job.queue.name}"
    )


def preview(snap, within: str, now=None, action: str = "drain") -> dict:

    if action not in ACTIONS:
        raise LevelQueryError("action", f"must be one of {', '.join(ACTIONS)}")
    now = now or timezone.now()
    level, cell, nodes = _domain(snap, within)
    _, racks = domains.hierarchy(snap)
    in_domain = np.isin(snap.gpu_node, nodes)
    held, gpu, job_ids = held_gpus(snap)
    totals = dict(zip(*np.unique(job_ids, return_counts=True), strict=True))
    jobs_here = dict(zip(*np.unique(job_ids[in_domain[gpu]], return_counts=True), strict=True))
    free = snap.schedulable() & ~held & ~in_domain
    jobs = []
    for job in Job.objects.filter(pk__in=[int(j) for j in jobs_here]).select_related("queue").order_by("id"):
        started = job.started_at.timestamp() if job.started_at else None
        last = job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else None
        t = now.timestamp()
        stop = lifecycle.stop(
            t,
            progress_s=job.progress_s,
            started_at=started,
            last_checkpoint_at=last,
            policy=_kind(job),
            graceful=action == "drain",
        )
        jobs.append(
            {
                "id": job.pk,
                "name": job.name,
                "queue": job.queue.name,
                "state": job.state,
                "gpus_here": int(jobs_here[job.pk]),
                "gpus": int(totals.get(job.pk, job.allocated_gpus)),
                "since_checkpoint_s": round(lifecycle.unsaved_s(t, started, last), 1),
                "saved_first": stop.saved,
                "lost_s": round(stop.lost_s, 1),
                "would_go": where_it_fits(snap, job, free),
            }
        )
    states = snap.node_state[nodes]
    drainable = [NODE_STATES[s] in NODE_ACTIONS[ACTIONS[action]][0] for s in states]
    return {
        "action": action,
        "domain": {
            "level": level,
            "id": int(domains.ids(snap, level)[cell]),
            "name": domains.names(snap, level, racks, [cell])[0],
        },
        "nodes": len(nodes),
        "nodes_drainable": int(sum(drainable)),
        "gpus": int(in_domain.sum()),
        "gpus_allocated": int((in_domain & held).sum()),
        "jobs": jobs,
        "lost_s": round(sum(j["lost_s"] for j in jobs), 1),
    }


def _kind(job):
    """The job's checkpoint kind (its policy's, else its queue's default): whether a drain saves first."""

    return job_policy(job).kind


def drain(snap, within: str, *, actor: str, reason: str, grace_s: int = 0, action: str = "drain") -> dict:
    """Drain (or mark down) every node of the domain the action may take (all of them or none), the
    reason in the audit; the nodes it may not take (already draining, down or in repair, say) are
    left as they are."""

    _, _, nodes = _domain(snap, within)
    ids = [int(snap.node_id[n]) for n in nodes]
    if action not in ACTIONS:
        raise LevelQueryError("action", f"must be one of {', '.join(ACTIONS)}")
    if grace_s and action != "drain":
        raise LevelQueryError("grace_s", "only a drain takes a grace period")
    allowed = NODE_ACTIONS[ACTIONS[action]][0]
    targets = list(Node.objects.filter(pk__in=ids, state__in=allowed).order_by("pk"))
    others = Node.objects.filter(pk__in=ids).exclude(state__in=allowed)
    skipped = dict(others.values_list("hostname", "state"))
    deadline = timezone.now() + timedelta(seconds=grace_s) if grace_s else None
    done = []
    if targets:
        done = apply_node_action(targets, ACTIONS[action], actor=actor, reason=reason, deadline=deadline)
    return {"action": action, "drained": [n.hostname for n in done], "skipped": skipped}
