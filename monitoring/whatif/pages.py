"""What-if simulation pages: start a run (operators), follow the runs, open a report."""

from __future__ import annotations

import json

from django.core.paginator import Paginator
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render

from cluster.pages import PAGE_SIZE, flat_errors, viewer_page
from engine.presets import PRESETS
from monitoring.api.serializers import SimulationSerializer
from monitoring.models import Simulation
from monitoring.tasks import run_simulation_task


@viewer_page
def simulations(request):
    """Start a what-if simulation (operators), follow the runs, open their reports."""
    errors = []
    form = {
        "cluster": "10k",
        "days": "7",
        "seed": "0",
        "jobs": "",
        "elastic_share": "0",
        "configurations": "",
    }
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form} | {
            "name": request.POST.get("name", "").strip()
        }
        payload = {k: v for k, v in form.items() if v != "" and k != "configurations"}
        payload["configurations"] = [c.strip() for c in form["configurations"].split(",") if c.strip()]
        serializer = SimulationSerializer(data=payload)
        if serializer.is_valid():
            sim = serializer.save(created_by=request.user.username)
            transaction.on_commit(lambda: run_simulation_task.delay(sim.pk))
            return redirect("simulation-page", pk=sim.pk)
        errors = flat_errors(serializer.errors)
    page = Paginator(Simulation.objects.all(), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "monitoring/simulations.html",
        {"page": page, "form": form, "errors": errors, "presets": list(PRESETS) + ["inventory"]},
    )


@viewer_page
def simulation_detail(request, pk: int):
    sim = get_object_or_404(Simulation, pk=pk)
    return render(
        request, "monitoring/simulation_detail.html", {"sim": sim, "summary": json.dumps(sim.summary)}
    )
