"""The efficiency page: jobs ranked by the GPU-hours their GPUs sat idle, and the GPUs wasted now."""

from __future__ import annotations

from django.conf import settings
from django.shortcuts import render

from cluster.fields import FieldError
from cluster.pages import viewer_page
from monitoring.telemetry import efficiency
from scheduling.models import Queue


@viewer_page
def efficiency_page(request):
    """Jobs ranked by the GPU-hours their GPUs sat idle, with their owners and the GPUs wasted now
    (held, idle for MYRIAD_IDLE_AFTER_S); ?state=all adds finished jobs, ?queue=NAME one queue."""
    state = request.GET.get("state", "running")
    queue = request.GET.get("queue", "")
    try:
        rows, errors = efficiency.ranking(state=state, queue=queue or None, limit=200), []
    except FieldError as exc:
        rows, errors = [], [str(exc)]  # "field: message"
    wasted = efficiency.wasted_by_queue()
    return render(
        request,
        "monitoring/efficiency.html",
        {
            "rows": rows,
            "state": state,
            "queue": queue,
            "errors": errors,
            "queues": Queue.objects.order_by("name").values_list("name", flat=True),
            "wasted": sorted(wasted.items(), key=lambda kv: (-kv[1], kv[0])),
            "wasted_total": sum(wasted.values()),
            "idle_pct": settings.IDLE_UTIL_PCT,
            "idle_after_min": settings.IDLE_AFTER_S / 60,
        },
    )
