"""The fleet's pages: overview, live heatmap and levels, topology drill-down, node page with
actions. Every list is scoped and paginated on the server; arrays come from the snapshot. The
faults page is in monitoring.faults.pages, efficiency in monitoring.telemetry.pages, what-if
simulations in monitoring.whatif.pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import orjson
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Q, Sum
from django.http import Http404, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from cluster.audit import record
from cluster.choices import COLOURS, NodeState
from cluster.models import GPU, AuditRecord, Datacenter, NicPort, Node, Pod, Rack
from cluster.pages import PAGE_SIZE, viewer_page
from cluster.roles import is_operator
from cluster.services import apply_node_action, operator_actions
from cluster.snapshot import topology_cache
from engine.frames import FRAME_METRICS, decode_frame
from engine.levels import AGGREGATES
from engine.states import InvalidTransition
from monitoring.faults.drain_preview import preview
from monitoring.forms import DRAIN_GRACE_CHOICES, NodeActionForm
from monitoring.models import FaultEvent
from monitoring.telemetry import netreports
from monitoring.telemetry.ingest import latest_reports
from monitoring.telemetry.livestore import live_store, newest_frame
from monitoring.telemetry.overview import BUCKETS, ettr_last_day, overview
from scheduling.models import AllocatedGPU, Job
from scheduling.usage import queue_health

BUCKET_LABELS = {
    "free": "free",
    "allocated": "allocated and busy",
    "allocated_idle": "allocated but idle",
    "cordoned": "cordoned or draining",
    "down": "down",
    "repairing": "in repair",
}


@viewer_page
def live(request):
    return render(request, "monitoring/live.html")


@viewer_page
def live_levels(request):
    """The fleet a level at a time: datacenters, pods, racks, nodes, GPUs (monitoring.telemetry.levels)."""

    return render(request, "monitoring/levels.html", {"metrics": FRAME_METRICS, "aggregates": AGGREGATES})


@viewer_page
def overview_page(request):

    data = overview()
    rows = [(BUCKET_LABELS[b], data["counts"][b], data["shares"][b] * 100) for b in BUCKETS]
    busy_pct = round(data["busy_share"] * 100, 1)
    ettr = ettr_last_day()
    losses = sorted(ettr["loss_share"].items(), key=lambda kv: -kv[1])
    return render(
        request,
        "monitoring/overview.html",
        {
            "data": data,
            "rows": rows,
            "busy_pct": busy_pct,
            "ettr": ettr,
            "ettr_pct": round(ettr["ettr"] * 100, 2) if ettr["ettr"] is not None else None,
            "losses": [(k.replace("_", " "), v * 100) for k, v in losses],
            "queues": queue_health(),
            "labels": json.dumps(BUCKET_LABELS),
        },
    )


# --- topology ---------------------------------------------------------------------------------

_LEVELS = {
    # level: (model, the Node path to it, the child level, the Node path to the child)
    None: (None, None, "datacenter", "rack__pod__datacenter"),
    "datacenter": (Datacenter, "rack__pod__datacenter", "pod", "rack__pod"),
    "pod": (Pod, "rack__pod", "rack", "rack"),
    "rack": (Rack, "rack", "node", None),
}


def _state_counts(nodes, group: str) -> dict[int, dict]:
    """Per child: nodes, GPUs, GPUs by node state, spares, lemons (one grouped query)."""
    per_state = {s: Sum("gpus_per_node", filter=Q(state=s)) for s in NodeState.values}
    rows = nodes.values(f"{group}_id").annotate(
        nodes=Count("id"),
        gpus=Sum("gpus_per_node"),
        spares=Count("id", filter=Q(is_spare=True)),
        lemons=Count("id", filter=Q(is_lemon=True)),
        **per_state,
    )
    return {r[f"{group}_id"]: r for r in rows}


def _held_counts(group: str) -> dict[int, int]:

    key = f"node__{group}_id"
    return {
        r[key]: r["n"]
        for r in AllocatedGPU.objects.filter(active=True)
        .values(key)
        .annotate(n=Count("gpu_id", distinct=True))
    }


def _breadcrumbs(obj) -> list[tuple[str, str]]:
    crumbs = []
    while obj is not None:
        if isinstance(obj, Rack):
            crumbs.append((f"rack {obj.name}", f"/topology/rack/{obj.pk}/"))
            obj = obj.pod
        elif isinstance(obj, Pod):
            crumbs.append((f"pod {obj.name}", f"/topology/pod/{obj.pk}/"))
            obj = obj.datacenter
        elif isinstance(obj, Datacenter):
            crumbs.append((f"datacenter {obj.name}", f"/topology/datacenter/{obj.pk}/"))
            crumbs.append((f"region {obj.region.name}", "/topology/"))
            obj = None
    return [("cluster", "/topology/"), *reversed(crumbs)]


@viewer_page
def topology(request, level: str | None = None, pk: int | None = None):
    """Region > datacenter > pod > rack > node, with GPUs by node state and GPUs held at each level."""
    if level not in _LEVELS:
        raise Http404(f"unknown topology level {level!r}")
    model, path, child, child_path = _LEVELS[level]
    obj = get_object_or_404(model, pk=pk) if model else None
    nodes = Node.objects.all() if obj is None else Node.objects.filter(**{path: obj})
    states = [(s, label, COLOURS[s]) for s, label in NodeState.choices]
    context = {"obj": obj, "level": level, "child": child, "states": states, "crumbs": _breadcrumbs(obj)}
    if child == "node":
        page = Paginator(
            nodes.select_related("chip_type")
            .order_by("hostname")
            .annotate(
                held=Count("gpus__allocations", filter=Q(gpus__allocations__active=True), distinct=True),
                open_faults=Count("faults", filter=Q(faults__cleared_at__isnull=True), distinct=True),
            ),
            PAGE_SIZE,
        ).get_page(request.GET.get("page"))
        context["page"] = page
        return render(request, "monitoring/topology.html", context)
    counts = _state_counts(nodes, child_path)
    held = _held_counts(child_path)
    children_model = {"datacenter": Datacenter, "pod": Pod, "rack": Rack}[child]
    children = children_model.objects.filter(pk__in=counts).order_by("pk")
    if child == "datacenter":
        children = children.select_related("region")
    page = Paginator(children, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = []
    for c in page:
        r = counts[c.pk]
        rows.append(
            {
                "obj": c,
                "name": f"{c.region.name} / {c.name}" if child == "datacenter" else c.name,
                "url": f"/topology/{child}/{c.pk}/",
                "nodes": r["nodes"],
                "gpus": r["gpus"] or 0,
                "held": held.get(c.pk, 0),
                "spares": r["spares"],
                "lemons": r["lemons"],
                "states": [(s, label, r[s] or 0, colour) for s, label, colour in states],
            }
        )
    if child == "datacenter":  # the cluster level: one line per region above its datacenters
        regions: dict[str, dict] = {}
        for dc in Datacenter.objects.filter(pk__in=counts).select_related("region"):
            r = regions.setdefault(
                dc.region.name, {"name": dc.region.name, "datacenters": 0, "gpus": 0, "held": 0}
            )
            r["datacenters"] += 1
            r["gpus"] += counts[dc.pk]["gpus"] or 0
            r["held"] += held.get(dc.pk, 0)
        context["regions"] = sorted(regions.values(), key=lambda r: r["name"])
    total = {s: sum((counts[k][s] or 0) for k in counts) for s in NodeState.values}
    context.update(
        page=page,
        rows=rows,
        totals=[(label, total[s], colour) for s, label, colour in states],
        gpus=sum((r["gpus"] or 0) for r in counts.values()),
    )
    return render(request, "monitoring/topology.html", context)


@viewer_page
def node_detail(request, hostname: str):

    node = get_object_or_404(
        Node.objects.select_related("rack__pod__datacenter__region", "chip_type"), hostname=hostname
    )
    if request.method == "POST" and request.POST.get("action") == "record_trace":
        if not is_operator(request.user):
            return HttpResponseForbidden("only operators may record a node's network trace")
        if not NicPort.objects.filter(node=node).exists():
            messages.error(request, f"record: node {node.hostname} has reported no network ports")
        else:
            netreports.ask_for_trace(node.pk, 60, request.user.username, live_store())
            record(request.user, "record network trace", "node", node, {}, "60 s")
            messages.success(request, "asked the agent for its last 60 s of 10 ms windows (sent within 20 s)")
        return redirect("node-page", hostname=node.hostname)
    if request.method == "POST":
        form = NodeActionForm(request.POST)
        action = request.POST.get("action", "")
        try:
            if not form.is_valid():
                raise InvalidTransition(f"action: unknown node action {action!r}")
            grace = form.cleaned_data.get("grace_s") or 0
            apply_node_action(
                [node],
                action,
                actor=request.user.username,
                reason=form.cleaned_data["reason"].strip(),
                deadline=timezone.now() + timedelta(seconds=grace) if action == "drain" and grace else None,
            )
        except InvalidTransition as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{action.replace('_', ' ')} {node.hostname}: done")
        return redirect("node-page", hostname=node.hostname)
    gpus = list(node.gpus.order_by("index"))
    holders = dict(AllocatedGPU.objects.filter(active=True, node=node).values_list("gpu_id", "job_id"))
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=set(holders.values())).select_related("queue")}
    telemetry = _node_telemetry(node)
    gpu_rows = [
        {
            "gpu": g,
            "job": jobs.get(holders.get(g.pk)),
            "telemetry": telemetry[i] if telemetry else None,
            "state_colour": COLOURS[g.state],
            "health_colour": COLOURS[g.health],
        }
        for i, g in enumerate(gpus)
    ]
    actions = operator_actions(node) if is_operator(request.user) else []
    return render(
        request,
        "monitoring/node.html",
        {
            "impact": _impact(node) if {"drain", "mark_down"} & set(actions) else None,
            "drain_grace_choices": DRAIN_GRACE_CHOICES,
            "node": node,
            "crumbs": _breadcrumbs(node.rack),
            "gpu_rows": gpu_rows,
            "jobs": sorted(jobs.values(), key=lambda j: j.pk),
            "faults": FaultEvent.objects.filter(Q(node=node) | Q(gpu__node=node)).select_related(
                "gpu", "job"
            )[:20],
            "audit": AuditRecord.objects.filter(object_type="node", object_id=node.pk)[:10],
            "actions": actions,
            "state_colour": COLOURS[node.state],
            "can_record": is_operator(request.user),
            **_node_ports(node),
        },
    )


def _node_ports(node: Node) -> dict:
    """The node's NIC ports with its newest report's summary of each, and its trace's state."""
    store = live_store()
    entry = latest_reports([node.pk], store).get(node.pk) or {}
    latest = {p["port"]: p for p in entry.get("net") or []}
    rows = []
    for port in NicPort.objects.filter(node=node):
        s = latest.get(port.name) or {}
        rows.append(
            {
                "port": port,
                "s": s,
                "errors": sum((s.get("errors") or {}).values()),
                "flaps": len(s.get("flaps") or []),
                "cnp": s.get("cnp_sent_per_s"),
            }
        )
    trace = netreports.newest_trace(node.pk, store)
    asked = netreports.trace_request(node.pk, store)
    when = lambda t: datetime.fromtimestamp(t, tz=UTC)  # noqa: E731
    recorded = orjson.loads(trace) if trace else None
    return {
        "ports": rows,
        "trace_requested": {**asked, "asked_at": when(asked["asked_at"])} if asked else None,
        "trace_received_at": when(recorded["received_at"]) if recorded else None,
        "trace_seconds": len(recorded["t_ms"]) * recorded["interval_ms"] / 1000 if recorded else None,
    }


def _impact(node: Node) -> list[dict]:
    """What draining or marking the node down would hit (monitoring.faults.drain_preview), per job: the
    drain's figures with the work a mark-down would lose beside them."""

    snap = topology_cache.current()
    drained = preview(snap, f"node:{node.pk}")["jobs"]
    down = {j["id"]: j["lost_s"] for j in preview(snap, f"node:{node.pk}", action="mark-down")["jobs"]}
    return [{**j, "lost_if_down_s": down.get(j["id"], j["lost_s"])} for j in drained]


def _node_telemetry(node: Node) -> list[dict] | None:
    """The node's GPUs in the newest telemetry frame, or None when there is none."""

    data = newest_frame()
    if not data:
        return None
    try:
        _, _, values = decode_frame(data)
    except ValueError:
        return None
    snap = topology_cache.current()
    idx = np.flatnonzero(snap.gpu_node == np.searchsorted(snap.node_id, node.pk))
    if not len(idx) or len(values["util"]) != snap.num_gpus:
        return None
    return [{m: int(values[m][i]) for m in ("util", "memory", "temperature", "power")} for i in idx]


@viewer_page
def gpu_redirect(request, pk: int):
    gpu = get_object_or_404(GPU.objects.select_related("node"), pk=pk)
    return redirect("node-page", hostname=gpu.node.hostname)
