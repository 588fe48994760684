"""The control plane's families that docs/alerts pages on and no other family says: XIDs with their
action and meaning, agents gone silent, lemon nodes, running jobs below their ETTR goal, wasted
GPUs, the cycle's budget. Read at scrape time like the rest (monitoring.telemetry.metrics)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cluster.models import Datacenter, Node, NodeCredential
from cluster.outages import best_effort
from engine.faults import CATALOGUE_XIDS, Action, xid_meaning
from monitoring.models import FaultEvent
from monitoring.telemetry import efficiency
from scheduling.choices import JobState
from scheduling.ettr import job_ettr
from scheduling.models import ETTR_GOAL_DEFAULT, Job, Queue


def paging_families():
    """What docs/alerts pages on that no other family says, each bounded: XID codes (a few
    dozen), agents' two states, datacenters, queues; never a series per job or per node."""
    xid = CounterMetricFamily(
        "myriad_xid_faults",
        "XID faults recorded, by code, the action taken and what the code means",
        labels=["xid", "action", "meaning"],
    )
    # the catalogue's codes with the actions that take a GPU down are there at zero before their
    # first fault, so that first fault is an increase Prometheus sees (a series born at 1 is not)
    counts = {(code, action): 0 for code in CATALOGUE_XIDS for action in DOWN_ACTIONS}
    for code, action, n in (
        FaultEvent.objects.filter(source="xid", xid__isnull=False)
        .values_list("xid", "action")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts[(code, action or "none")] = n
    for (code, action), n in sorted(counts.items()):
        xid.add_metric([str(code), action, xid_meaning(code)], n)
    yield xid
    agents = GaugeMetricFamily(
        "myriad_agents",
        "Enrolled node agents, by state: reporting, or silent (their heartbeat lost)",
        labels=["state"],
    )
    enrolled = NodeCredential.objects.filter(revoked_at__isnull=True)
    silent = enrolled.filter(heartbeat_lost_at__isnull=False).count()
    agents.add_metric(["reporting"], enrolled.count() - silent)
    agents.add_metric(["silent"], silent)
    yield agents
    lemons = GaugeMetricFamily(
        "myriad_lemon_nodes",
        "Nodes quarantined as lemons (faults repeating on them), by datacenter",
        labels=["datacenter"],
    )
    by_dc = dict(
        Node.objects.filter(is_lemon=True)
        .values_list("rack__pod__datacenter__name")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("rack__pod__datacenter__name", "n")
    )
    for name in Datacenter.objects.order_by("name").values_list("name", flat=True).distinct():
        lemons.add_metric([name], by_dc.get(name, 0))
    yield lemons
    below = GaugeMetricFamily(
        "myriad_jobs_below_ettr_goal",
        f"Running jobs (past their first {ETTR_MIN_WALL_S / 3600:g} h) whose ETTR is below "
        "their checkpoint policy's goal, by queue",
        labels=["queue"],
    )
    counts = jobs_below_ettr_goal()
    for queue in Queue.objects.order_by("name").values_list("name", flat=True):
        below.add_metric([queue], counts.get(queue, 0))
    yield below
    wasted = GaugeMetricFamily(
        "myriad_wasted_gpus",
        "GPUs held by running jobs and idle (below MYRIAD_IDLE_UTIL_PCT for MYRIAD_IDLE_AFTER_S), by queue",
        labels=["queue"],
    )
    by_queue = best_effort("reading the idle GPUs", efficiency.wasted_by_queue)
    if by_queue is not None:
        for queue in Queue.objects.order_by("name").values_list("name", flat=True):
            wasted.add_metric([queue], by_queue.get(queue, 0))
        yield wasted
    budget = GaugeMetricFamily(
        "myriad_cycle_budget_seconds", "The time a scheduling cycle may take (MYRIAD_CYCLE_BUDGET_S)"
    )
    budget.add_metric([], settings.CYCLE_BUDGET_S)
    yield budget


DOWN_ACTIONS = (Action.RESET_GPU.value, Action.REBOOT_NODE.value, Action.REPAIR_NODE.value)
ETTR_MIN_WALL_S = 3600.0  # a job's ETTR is judged once it has run this long: a restart early on is noise


def jobs_below_ettr_goal() -> dict[str, int]:
    """{queue: running jobs whose ETTR since their first start is below their policy's goal (their
    own policy, else their queue's default, else ETTR_GOAL_DEFAULT)}."""
    # a job first admitted an hour ago was submitted before that: the others need no ETTR yet
    cutoff = timezone.now() - timedelta(seconds=ETTR_MIN_WALL_S)
    running = list(
        Job.objects.filter(state=JobState.RUNNING, submitted_at__lte=cutoff).select_related(
            "queue__default_checkpoint_policy", "checkpoint_policy"
        )
    )
    rows = job_ettr(running)
    out: dict[str, int] = {}
    for job in running:
        row = rows.get(job.pk)
        if row is None or row["wall_s"] < ETTR_MIN_WALL_S:
            continue
        policy = job.effective_checkpoint_policy
        goal = policy.ettr_goal if policy is not None else ETTR_GOAL_DEFAULT
        if row["ettr"] < goal:
            out[job.queue.name] = out.get(job.queue.name, 0) + 1
    return out
