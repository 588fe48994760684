"""Server-rendered pages for jobs and inference services: what an operator reads about a job's
plan, size history and chip choice, and about a service's load and replicas."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render

from cluster.roles import is_viewer
from engine.inference import LoadProfile
from scheduling.api.serializers import JobDetailSerializer
from scheduling.choices import ACTIVE_STATES, JobState
from scheduling.inference import replicas_of
from scheduling.models import InferenceService, Job, Queue

PAGE_SIZE = 50


def _viewer(request) -> None:
    if not is_viewer(request.user):
        raise PermissionDenied("Your account has no role; ask an administrator for viewer or operator.")


@login_required
def jobs(request):
    """Jobs, filtered and paginated on the server; by default only active ones."""
    _viewer(request)
    state = request.GET.get("state", "active")
    queue = request.GET.get("queue", "")
    qs = Job.objects.select_related("queue", "chip").order_by("-submitted_at", "-id")
    if state == "active":
        qs = qs.filter(state__in=ACTIVE_STATES)
    elif state in JobState.values:
        qs = qs.filter(state=state)
    if queue:
        qs = qs.filter(queue__name=queue)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "scheduling/jobs.html",
        {
            "page": page,
            "state": state,
            "queue": queue,
            "states": ["active", *JobState.values, "all"],
            "queues": Queue.objects.values_list("name", flat=True),
        },
    )


@login_required
def job_detail(request, pk: int):
    _viewer(request)
    job = get_object_or_404(Job.objects.select_related("queue", "chip"), pk=pk)
    data = JobDetailSerializer(job, context={"request": request}).data
    return render(request, "scheduling/job_detail.html", {"job": job, "data": data})


@login_required
def services(request):
    _viewer(request)
    rows = []
    for service in InferenceService.objects.select_related("queue"):
        states = list(replicas_of(service).values_list("state", flat=True))
        rows.append((service, states.count("running"), states.count("pending")))
    return render(request, "scheduling/services.html", {"rows": rows})


@login_required
def service_detail(request, pk: int):
    _viewer(request)
    service = get_object_or_404(InferenceService.objects.select_related("queue"), pk=pk)
    profile = LoadProfile.from_dict(service.load_profile)
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    minutes = list(range(0, 24 * 60, 5))
    load = [round(profile.rate(day + m * 60), 2) for m in minutes]
    chart = {
        "hours": [m / 60 for m in minutes],
        "load": load,
        "capacity_per_replica": service.capacity_rps,
        "headroom": service.headroom,
        "min_replicas": service.min_replicas,
        "max_replicas": service.max_replicas,
    }
    replicas = replicas_of(service).order_by("-submitted_at")[:PAGE_SIZE]
    return render(
        request,
        "scheduling/service_detail.html",
        {
            "service": service,
            "chart": json.dumps(chart),
            "replicas": replicas,
            "scales": service.scales.all()[:50],
        },
    )
