"""The live telemetry page: every GPU as one heatmap cell, fed by websocket frames."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from cluster.roles import is_viewer


@login_required
def live(request):
    if not is_viewer(request.user):
        raise PermissionDenied("Your account has no role; ask an administrator for viewer or operator.")
    return render(request, "monitoring/live.html")


@login_required
def overview_page(request):
    from monitoring.overview import BUCKETS, overview

    if not is_viewer(request.user):
        raise PermissionDenied("Your account has no role; ask an administrator for viewer or operator.")
    data = overview()
    labels = {
        "free": "free",
        "allocated": "allocated and busy",
        "allocated_idle": "allocated but idle",
        "cordoned": "cordoned or draining",
        "down": "down",
        "repairing": "in repair",
    }
    rows = [(labels[b], data["counts"][b], data["shares"][b] * 100) for b in BUCKETS]
    busy_pct = round(data["busy_share"] * 100, 1)
    return render(request, "monitoring/overview.html", {"data": data, "rows": rows, "busy_pct": busy_pct})
