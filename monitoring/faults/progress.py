"""Hung and slow nodes of jobs on real nodes, from the per-rank progress their agents report.

A launched job's ranks append their step counter to ``$MYRIAD_PROGRESS_FILE``; each node's agent
sends the newest with its report (monitoring.telemetry.reports), kept with the node's latest readings in the
live store. Every agent watch (``check_progress``) judges each running job whose every rank runs,
by engine.progress's rule, on the server's clock:

- a **hang** names the ranks behind (or silent) as a ``job_hang`` fault on their node, once per
  job, placement and step: the fault task then restarts the job as for any hang. A hang with no
  rank behind (a collective) is reported on the job's first node, saying so.
- a **straggler** is a ``straggler`` event on the job, once per node and placement, shown on the
  job and faults pages; when the job's checkpoint policy says so the node is cordoned (new work
  goes elsewhere; running work stays) with the reason in the audit.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cluster.models import Node
from cluster.outages import best_effort
from cluster.services import CONTROLLER, apply_node_action
from engine.progress import ProgressRule, Verdict, localize
from engine.states import InvalidTransition
from monitoring.faults.services import report_fault
from monitoring.models import FaultEvent
from monitoring.telemetry.ingest import latest_reports
from monitoring.telemetry.livestore import live_store
from monitoring.telemetry.netreports import ask_for_trace, evidence
from scheduling import launch
from scheduling.choices import EventKind, JobState
from scheduling.models import Job, JobEvent

WINDOW = 8


def rule() -> ProgressRule:
    return ProgressRule(
        hang_steps=settings.PROGRESS_HANG_STEPS,
        hang_floor_s=settings.PROGRESS_HANG_FLOOR_S,
        slow_share=settings.PROGRESS_STRAGGLER_SHARE,
    )


def _arrays(placement, reports: dict[int, dict]):
    """Per rank (node order): step, when it moved and when reported (server clock), compute times."""
    n = len(placement.nodes)
    step, step_at, reported_at = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    recent = np.full((n, WINDOW), np.nan)
    for i, node_id in enumerate(placement.nodes):
        entry = reports.get(node_id)
        if entry is None:
            continue
        mine = [
            p
            for p in entry.get("progress", [])
            if p["job"] == placement.job_id and p["generation"] == placement.generation
        ]
        if not mine:
            continue
        p, t = mine[0], entry["t"]
        skew = t - entry.get("sent_at", t)  # the node's clock against ours
        step[i], step_at[i], reported_at[i] = p["step"], min(p["step_at"] + skew, t), t
        times = p["recent"][-WINDOW:]
        if times:
            recent[i, -len(times) :] = times
    return step, step_at, reported_at, recent


def check_progress(now: datetime | None = None) -> dict:
    """Judge every running job on real nodes; returns the hangs and stragglers found."""
    now = now or timezone.now()
    jobs = {
        j.pk: j
        for j in Job.objects.filter(state=JobState.RUNNING)
        .exclude(command="")
        .exclude(launched_generation="")
        .select_related("checkpoint_policy", "queue__default_checkpoint_policy")
    }
    if not jobs:
        return {"hangs": [], "stragglers": []}
    found = {"hangs": [], "stragglers": []}
    current = launch.placements(jobs)
    reports = latest_reports({n for p in current.values() for n in p.nodes})
    for job_id, placement in current.items():
        job = jobs[job_id]
        if placement.generation != job.launched_generation:
            continue  # a placement still starting: not judged until every rank runs
        arrays = _arrays(placement, reports)
        verdict = localize(*arrays, now.timestamp(), rule())
        if verdict.hung:
            front = int(np.nanmax(arrays[0])) if np.isfinite(arrays[0]).any() else 0
            found["hangs"] += _hang(job, placement, verdict, front, now, reports)
        elif verdict.stragglers:
            found["stragglers"] += _stragglers(job, placement, verdict, now, reports)
    return found


def _hang(job: Job, placement, verdict: Verdict, front: int, now: datetime, reports=None) -> list[str]:
    """A hang fault on the ranks behind, with what their nodes' ports show when they show trouble;
    a hang with none behind (a collective) goes on the node of the job whose ports show the
    strongest network trouble when one does, else on rank 0."""
    already = FaultEvent.objects.filter(
        source="job_hang", data__job=job.pk, data__generation=placement.generation, data__step=front
    ).exists()
    if already:
        return []
    reports = reports or {}
    suspects = [placement.nodes[r] for r in verdict.culprits] or list(placement.nodes)
    network = evidence(suspects, reports)
    if verdict.culprits:
        ranks = verdict.culprits
    elif network is not None:
        ranks = (placement.nodes.index(network[0]),)
    else:
        ranks = (0,)
    nodes = {n.pk: n for n in Node.objects.filter(pk__in=[placement.nodes[r] for r in ranks])}
    names = []
    for r in ranks:
        node = nodes[placement.nodes[r]]
        if verdict.culprits:
            where = ""
        elif network is not None:
            where = f" (reported on {node}, whose network shows it)"
        else:
            where = f" (reported on rank 0, {node})"
        text = f"job {job.pk}: {verdict.reason}{where}"
        seen = evidence([node.pk], reports) if verdict.culprits else network
        if seen is not None:
            text += f"; network: {seen[1]}"
        report_fault(
            node=node,
            source="job_hang",
            at=now,
            detected_at=now,
            description=text[:255],
            data={
                "job": job.pk,
                "generation": placement.generation,
                "step": front,
                "rank": r,
                "localized": bool(verdict.culprits),
                "agent": True,
                "network_evidence": seen[1] if seen is not None else None,
            },
        )
        # the node's last minute of 10 ms windows, kept for whoever looks at the hang
        best_effort(
            "asking for the hung node's trace",
            ask_for_trace,
            node.pk,
            60,
            f"hang of job {job.pk}",
            live_store(),
        )
        names.append(node.hostname)
    return names


def _stragglers(job: Job, placement, verdict: Verdict, now: datetime, reports=None) -> list[str]:
    policy = job.effective_checkpoint_policy
    cordon = bool(policy and policy.cordon_stragglers)
    known = set(
        JobEvent.objects.filter(
            job=job, kind=EventKind.STRAGGLER, data__generation=placement.generation
        ).values_list("data__node_id", flat=True)
    )
    names = []
    for r in verdict.stragglers:
        node_id = placement.nodes[r]
        if node_id in known:
            continue
        node = Node.objects.get(pk=node_id)
        slow = verdict.slowdown[r]
        reason = f"straggler in job {job.pk}: compute {slow:.2f}x the job's median over its last steps"
        seen = evidence([node_id], reports or {})
        if seen is not None:
            reason += f"; network: {seen[1]}"
        with transaction.atomic():
            cordoned = False
            if cordon:
                try:
                    apply_node_action([node], "cordon", actor=CONTROLLER, reason=reason)
                    cordoned = True
                except InvalidTransition:
                    pass  # already out of service or cordoned
            JobEvent.objects.create(
                job=job,
                kind=EventKind.STRAGGLER,
                at=now,
                reason=f"{node.hostname} (rank {r}): compute {slow:.2f}x the median"
                + (", cordoned" if cordoned else "")
                + (f"; network: {seen[1]}" if seen is not None else ""),
                data={
                    "network_evidence": seen[1] if seen is not None else None,
                    "node": node.hostname,
                    "node_id": node.pk,
                    "rank": r,
                    "generation": placement.generation,
                    "slowdown": slow,
                    "step_s": round(verdict.step_s, 3),
                    "cordoned": cordoned,
                },
            )
        names.append(node.hostname)
    return names
