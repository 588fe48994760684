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
