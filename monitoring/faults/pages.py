"""The faults page: faults per rack over time by cause, lemon nodes, open faults and stragglers."""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.paginator import Paginator
from django.db.models import Count
from django.shortcuts import render
from django.utils import timezone

from cluster.models import Node, Rack
from cluster.pages import PAGE_SIZE, viewer_page
from engine import lifecycle
from monitoring.faults.services import LEMON_WINDOW, node_fault_counts
from monitoring.models import FaultEvent
from scheduling.choices import EventKind
from scheduling.models import JobEvent

FAULT_WINDOWS = {
    "day": (timedelta(days=1), timedelta(hours=1)),
    "week": (timedelta(days=7), timedelta(hours=6)),
}


@viewer_page
def faults(request):
    """Faults per rack over time (by cause), lemon nodes, open faults with the recovery in progress."""
    window = request.GET.get("window", "week")
    if window not in FAULT_WINDOWS:
        window = "week"
    cause = request.GET.get("cause", "")
    span, step = FAULT_WINDOWS[window]
    now = timezone.now()
    since = now - span
    recent = FaultEvent.objects.filter(at__gte=since)
    by_cause = list(recent.values("cause").annotate(n=Count("id")).order_by("-n", "cause"))
    causes = sorted(r["cause"] for r in by_cause if r["cause"])
    if cause:
        recent = recent.filter(cause=cause)
    rows = list(recent.values_list("at", "node__rack_id", "gpu__node__rack_id"))
    buckets = int(span / step)
    per_rack: dict[int, list[int]] = {}
    for at, rack_a, rack_b in rows:
        rack = rack_a or rack_b
        if not rack:
            continue  # a link or pod fault names no rack
        b = min(int((at - since) / step), buckets - 1)
        per_rack.setdefault(rack, [0] * buckets)[b] += 1
    # rack names repeat across pods ("r01"): label each as datacenter-pod/rack
    labels = {
        r.pk: f"{r.pod.datacenter.name}-{r.pod.name}/{r.name}"
        for r in Rack.objects.filter(pk__in=per_rack).select_related("pod__datacenter")
    }
    order = sorted(per_rack, key=lambda r: (-sum(per_rack[r]), labels[r]))
    chart = {
        "racks": [labels[r] for r in order],
        "z": [per_rack[r] for r in order],
        "x": [(since + step * (i + 0.5)).isoformat() for i in range(buckets)],
    }
    table = [(labels[r], r, sum(per_rack[r]), max(per_rack[r])) for r in order[:PAGE_SIZE]]
    lemons = _lemons(now)
    open_faults = Paginator(
        FaultEvent.objects.filter(cleared_at__isnull=True).select_related(
            "node", "gpu__node", "job", "pod", "link"
        ),
        PAGE_SIZE,
    ).get_page(request.GET.get("page"))
    return render(
        request,
        "monitoring/faults.html",
        {
            "chart": json.dumps(chart),
            "table": table,
            "total": len(rows),
            "window": window,
            "windows": list(FAULT_WINDOWS),
            "cause": cause,
            "causes": causes,
            "by_cause": by_cause,
            "lemons": lemons,
            "lemon_rule": {"faults": lifecycle.LEMON_FAULTS, "days": LEMON_WINDOW.days},
            "open_faults": open_faults,
            "stragglers": JobEvent.objects.filter(kind=EventKind.STRAGGLER, at__gte=since)
            .select_related("job")
            .order_by("-at")[:PAGE_SIZE],
            "step_hours": int(step.total_seconds() // 3600),
        },
    )


def _lemons(now, limit: int = PAGE_SIZE) -> list[Node]:
    """Nodes marked lemon, or at the lemon rule's count of faults (engine.lifecycle) in its window."""
    counts = node_fault_counts(now - LEMON_WINDOW)
    ids = {k for k, v in counts.items() if lifecycle.is_lemon(v)} | set(
        Node.objects.filter(is_lemon=True).values_list("id", flat=True)
    )
    nodes = list(Node.objects.filter(pk__in=ids).select_related("rack"))
    for node in nodes:
        node.recent_faults = counts.get(node.pk, 0)
    return sorted(nodes, key=lambda n: (-n.recent_faults, n.hostname))[:limit]
