"""Server-rendered pages for jobs and inference services: what an operator reads about a job's
plan, size history and chip choice, and about a service's load and replicas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from cluster.audit import changes
from cluster.fields import FieldError
from cluster.models import AuditRecord, ChipType
from cluster.pages import PAGE_SIZE, flat_errors, operator_page, viewer_page
from cluster.roles import is_operator
from engine import tiers
from engine.checkpoint import CheckpointKind
from engine.inference import LoadProfile
from engine.lifecycle import operator_actions
from engine.policy import CheckpointPolicy as EnginePolicy
from scheduling import chargeback, history
from scheduling.api.queue_serializers import CheckpointPolicySerializer, QueueSerializer
from scheduling.api.serializers import JobDetailSerializer
from scheduling.checkpoints import REFERENCE_JOBS, default_mtbf, recommend_for
from scheduling.choices import ACTIVE_STATES, JobKind, JobState
from scheduling.ettr import BUCKETS as ETTR_BUCKETS
from scheduling.ettr import job_ettr
from scheduling.forecast_models import expected_start
from scheduling.forms import JobActionForm, queue_payload
from scheduling.inference import replicas_of
from scheduling.models import (
    ETTR_GOAL_DEFAULT,
    QUEUE_SETTINGS,
    AllocatedGPU,
    CheckpointPolicy,
    Cohort,
    InferenceService,
    Job,
    JobArray,
    Queue,
)
from scheduling.services import (
    POLICY_AUDITED,
    JobStateError,
    change_state,
    queue_audit_state,
    save_policy,
    save_queue,
)
from scheduling.timeline import segments
from scheduling.usage import queue_health, queue_usage


@viewer_page
def jobs(request):
    """Jobs, filtered and paginated on the server; by default only active ones."""
    state = request.GET.get("state", "active")
    queue = request.GET.get("queue", "")
    kind = request.GET.get("kind", "")
    qs = Job.objects.select_related("queue", "chip", "forecast").order_by("-submitted_at", "-id")
    if kind in JobKind.values:
        qs = qs.filter(kind=kind)
    if state == "active":
        qs = qs.filter(state__in=ACTIVE_STATES)
    elif state in JobState.values:
        qs = qs.filter(state=state)
    if queue:
        qs = qs.filter(queue__name=queue)
    asked = request.GET.get("array", "").strip()
    array = _array_of(asked)
    if asked:  # an array that does not exist has no jobs
        qs = qs.filter(array=array) if array is not None else qs.none()
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    for job in page:
        job.expected = expected_start(job)  # the API's rule: a pending job's, once played
    return render(
        request,
        "scheduling/jobs.html",
        {
            "page": page,
            "state": state,
            "queue": queue,
            "kind": kind,
            "array": array,
            "kinds": JobKind.values,
            "states": ["active", *JobState.values, "all"],
            "queues": Queue.objects.values_list("name", flat=True),
        },
    )


def _array_of(text: str) -> JobArray | None:
    """The job array an ``array`` filter names; none when it is empty or names no array."""
    if not text.isdigit():
        return None
    return JobArray.objects.select_related("queue").filter(pk=int(text)).first()


@viewer_page
def job_detail(request, pk: int):
    job = get_object_or_404(Job.objects.select_related("queue", "chip", "forecast", "array"), pk=pk)
    if request.method == "POST":
        form = JobActionForm(request.POST)
        action = request.POST.get("action", "")
        try:
            if not form.is_valid():
                raise JobStateError(f"action: unknown job action {action!r}")
            change_state(job.pk, action, actor=request.user.username, reason=form.cleaned_data["reason"])
        except JobStateError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{action} job {job.pk}: done")
        return redirect("job-page", pk=job.pk)
    data = JobDetailSerializer(job, context={"request": request}).data
    now = timezone.now()
    events = list(job.events.order_by("at", "id").values_list("at", "kind"))
    checkpoints = list(job.checkpoints.order_by("at").values_list("at", "stall_s"))
    timeline = [
        {"state": s["state"], "start": s["start"].isoformat(), "end": s["end"].isoformat()}
        for s in segments(events, checkpoints, now)
    ]
    ettr = job_ettr([job]).get(job.pk)
    losses = (
        [(k.replace("_", " "), ettr[f"{k}_s"], ettr[f"{k}_s"] / ettr["wall_s"] * 100) for k in ETTR_BUCKETS]
        if ettr
        else []
    )
    actions = operator_actions(job.state) if is_operator(request.user) else []
    return render(
        request,
        "scheduling/job_detail.html",
        {
            "job": job,
            "data": data,
            "timeline": json.dumps(timeline),
            "placement": _placement(job),
            "checkpoints": job.checkpoints.all()[:20],
            "faults": job.faults.select_related("node", "gpu__node")[:20],
            "ettr": ettr,
            "losses": losses,
            "actions": actions,
            "expected": expected_start(job),
        },
    )


def _placement(job: Job) -> list[dict]:
    """The job's GPUs by rack and node: where it runs, for the placement map."""
    rows = (
        AllocatedGPU.objects.filter(job=job, active=True)
        .values("node__rack_id", "node__rack__name", "node__rack__pod__name", "node__hostname")
        .annotate(n=Count("gpu_id"))
        .order_by("node__rack_id", "node__hostname")
    )
    racks: dict[int, dict] = {}
    for r in rows:
        rack = racks.setdefault(
            r["node__rack_id"],
            {
                "id": r["node__rack_id"],
                "name": r["node__rack__name"],
                "pod": r["node__rack__pod__name"],
                "nodes": [],
                "gpus": 0,
            },
        )
        rack["nodes"].append((r["node__hostname"], r["n"]))
        rack["gpus"] += r["n"]
    return list(racks.values())


@viewer_page
def services(request):
    rows = []
    for service in InferenceService.objects.select_related("queue"):
        states = list(replicas_of(service).values_list("state", flat=True))
        rows.append((service, states.count("running"), states.count("pending")))
    return render(request, "scheduling/services.html", {"rows": rows})


@viewer_page
def service_detail(request, pk: int):
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


# --- queues -----------------------------------------------------------------------------------


@viewer_page
def usage_page(request):
    """Who used what: GPU-hours per day by queue (a Plotly chart), totals per queue and cohort with
    their cost, filters for the window, queue, cohort and chip type, and the CSV of the same."""
    errors: list[str] = []
    try:
        query = chargeback.window(request.GET)
        data = chargeback.report(**query)
    except FieldError as exc:
        errors = [f"{exc.field}: {exc.message}"]
        query = chargeback.window({})
        data = chargeback.report(**query)
    series: dict[str, dict[str, float]] = {"(used)": {}}  # allocated per queue and day; used in all
    for row in data["rows"]:
        for name, key in ((row["queue"], "allocated_gpu_hours"), ("(used)", "used_gpu_hours")):
            cell = series.setdefault(name, {})
            cell[row["day"]] = cell.get(row["day"], 0.0) + row[key]
    chart = {name: {"days": sorted(d), "hours": [d[k] for k in sorted(d)]} for name, d in series.items()}
    params = {k: str(v) for k, v in query.items() if v}
    return render(
        request,
        "scheduling/usage.html",
        {
            "data": data,
            "query": query,
            "errors": errors,
            "chart": json.dumps(chart),
            "csv_query": urlencode(params),
            "queue_names": Queue.objects.order_by("name").values_list("name", flat=True),
            "cohort_names": Cohort.objects.order_by("name").values_list("name", flat=True),
            "chip_names": ChipType.objects.order_by("name").values_list("name", flat=True),
        },
    )


@viewer_page
def queue_history_page(request):
    """The queues' history over a window: waits, admissions, preemptions, contention, borrowing,
    and the queues starving now."""
    errors: list[str] = []
    try:
        query = history.window(request.GET)
    except FieldError as exc:
        errors = [f"{exc.field}: {exc.message}"]
        query = history.window({})
    return render(
        request,
        "scheduling/queue_history.html",
        {
            "data": history.queue_history(**query),
            "query": query,
            "errors": errors,
            "queue_names": Queue.objects.order_by("name").values_list("name", flat=True),
        },
    )


@viewer_page
def queues(request):
    """Per queue and chip type: nominal, used, borrowed, lent, pending demand; policies and health."""

    usage = queue_usage()
    health = {h["name"]: h for h in queue_health(usage)}
    rows = [
        {"queue": q, "usage": usage.get(q.name, []), "health": health.get(q.name)}
        for q in Queue.objects.select_related("cohort", "default_checkpoint_policy").order_by(
            "-priority", "name"
        )
    ]
    audit = AuditRecord.objects.filter(object_type="queue")[:20]
    return render(request, "scheduling/queues.html", {"rows": rows, "audit": audit})


@operator_page
def queue_edit(request, pk: int):
    """Operators edit a queue's priority, weight, policies, stopped flag and quotas per chip type.
    Validation is the API's (the same serializer); errors name the field and change nothing."""

    queue = get_object_or_404(Queue, pk=pk)
    chips = list(ChipType.objects.order_by("name").values_list("name", flat=True))
    errors: list[str] = []
    if request.method == "POST":
        post = request.POST
        payload = queue_payload(post)
        serializer = QueueSerializer(queue, data=payload, partial=True)
        if serializer.is_valid():
            before = queue_audit_state(queue)
            saved = save_queue(serializer, actor=request.user, reason=post.get("reason", ""))
            diff = changes(before, queue_audit_state(saved))
            messages.success(
                request, f"queue {queue.name}: {len(diff)} change(s) saved" if diff else "no changes"
            )
            return redirect("queues")
        errors = flat_errors(serializer.errors)
        form = payload
    else:
        form = {f: getattr(queue, f) for f in QUEUE_SETTINGS}
        form["quotas"] = [
            {
                "chip_type": q.chip_type.name,
                "nominal": q.nominal,
                "borrowing_limit": q.borrowing_limit,
                "lending_limit": q.lending_limit,
            }
            for q in queue.quotas.select_related("chip_type").order_by("chip_type__name")
        ]
    quota_rows = [
        *form["quotas"],
        {"chip_type": "", "nominal": "", "borrowing_limit": "", "lending_limit": ""},
    ]
    return render(
        request,
        "scheduling/queue_edit.html",
        {
            "queue": queue,
            "form": form,
            "quota_rows": quota_rows,
            "chips": chips,
            "errors": errors,
            "reclaim_choices": Queue._meta.get_field("reclaim_within_cohort").choices,
            "within_choices": Queue._meta.get_field("within_queue").choices,
            "queueing_choices": Queue._meta.get_field("queueing_strategy").choices,
            "audit": AuditRecord.objects.filter(object_type="queue", object_id=queue.pk)[:20],
        },
    )


# --- checkpoint policies ----------------------------------------------------------------------


def _policy_rows():

    running = dict(
        Job.objects.filter(state=JobState.RUNNING, checkpoint_policy__isnull=False)
        .values("checkpoint_policy_id")
        .annotate(n=Count("id"))
        .values_list("checkpoint_policy_id", "n")
    )
    rows = []
    for p in CheckpointPolicy.objects.order_by("name"):
        refs = [
            (label, recommend_for(CheckpointKind(p.kind), p.interval_s, params, gpus, default_mtbf(gpus)))
            for label, params, gpus in REFERENCE_JOBS
        ]
        label, params, gpus = REFERENCE_JOBS[-1]
        cost = tiers.costs(p.recovery_tier, parameters=params, gpus=gpus, replica_groups=p.replica_groups)
        rows.append(
            {"policy": p, "refs": refs, "running": running.get(p.pk, 0), "cost": cost, "cost_for": label}
        )
    return rows


@viewer_page
def policies(request):
    """Checkpoint policies with the recommended interval next to the chosen one."""

    return render(
        request,
        "scheduling/policies.html",
        {
            "rows": _policy_rows(),
            "references": [label for label, _, _ in REFERENCE_JOBS],
            "audit": AuditRecord.objects.filter(object_type="checkpoint policy")[:20],
        },
    )


@operator_page
def policy_edit(request, pk: int | None = None):
    """Create (pk None) or edit a checkpoint policy; validation is the API's serializer."""

    policy = get_object_or_404(CheckpointPolicy, pk=pk) if pk else None
    fields = POLICY_AUDITED
    errors: list[str] = []
    if request.method == "POST":
        form = {f: request.POST.get(f, "").strip() for f in fields}
        form["cordon_stragglers"] = bool(request.POST.get("cordon_stragglers"))
        payload = {**form, "interval_s": form["interval_s"] or None}
        for optional in ("triggered_success", "replica_groups", "recovery_tier", "ettr_goal"):
            if payload[optional] == "":
                payload.pop(optional)
        serializer = CheckpointPolicySerializer(policy, data=payload)
        if serializer.is_valid():
            saved = save_policy(serializer, actor=request.user)
            messages.success(request, f"checkpoint policy {saved.name} saved")
            return redirect("policies")
        errors = flat_errors(serializer.errors)
    else:
        form = (
            {f: getattr(policy, f) for f in fields}
            if policy
            else {**CheckpointPolicy.fields_of(EnginePolicy()), "ettr_goal": ETTR_GOAL_DEFAULT}
        )
    return render(
        request,
        "scheduling/policy_edit.html",
        {
            "policy": policy,
            "form": form,
            "errors": errors,
            "kinds": CheckpointPolicy._meta.get_field("kind").choices,
            "tiers": CheckpointPolicy._meta.get_field("recovery_tier").choices,
        },
    )
