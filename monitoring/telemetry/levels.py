"""The live frame a level at a time (engine.levels over the inventory): the cells of one level
inside one domain, each with the chosen aggregate of a metric, its GPU count and its GPUs not
healthy. A frame's aggregates are computed once per process for every level and kept until a
newer frame comes, so any number of viewers costs one pass over the frame."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from datetime import timedelta

import numpy as np
from django.utils import timezone

from cluster.models import GPU, Node, Rack
from cluster.snapshot import topology_cache
from engine.frames import FRAME_METRICS, decode_frame
from engine.levels import AGGREGATES, LEVELS, Hierarchy, aggregate_all
from engine.states import NODE_STATE_CODE
from monitoring.faults.drain_preview import held_gpus, where_it_fits
from monitoring.models import FaultEvent
from monitoring.telemetry import domains, fabric_view
from monitoring.telemetry.domains import LevelQueryError, UnknownDomain
from monitoring.telemetry.livestore import FRAME_KEY, NETWORK_KEY, live_store
from scheduling.ettr import job_ettr
from scheduling.models import AllocatedGPU, Job

_lock = threading.Lock()
_aggregates: OrderedDict = OrderedDict()  # (id(snapshot), seq, metric, how, threshold) -> arrays
KEEP = 32  # aggregates kept per process (a few frames x the metrics and aggregates viewers chose)
MARKS_S = 2.0  # node states, lemons and open faults are read again after this many seconds
_marks: dict = {}  # "at", "snap", "nodes": {mark: node mask}
NODE_STATE_MARKS = ("cordoned", "draining", "drained", "down", "repairing")
MARKS = (*NODE_STATE_MARKS, "spare", "lemon", "open_faults", "faults_24h")
# the view's aggregates: a frame metric's (engine.levels), or the faults of the last 24 hours
VIEW_AGGREGATES = (*AGGREGATES, "faults")


def _node_marks(snap) -> dict[str, np.ndarray]:
    """Per node: its state when not ready, spare, lemon, and its open faults (a count)."""
    now = time.monotonic()
    if _marks.get("snap") is snap and now - _marks["at"] < MARKS_S:
        return _marks["nodes"]

    nodes = {state: snap.node_state == NODE_STATE_CODE[state] for state in NODE_STATE_MARKS}
    nodes["spare"] = np.asarray(snap.node_spare, dtype=bool)
    index = {int(n): i for i, n in enumerate(snap.node_id)}
    lemons = np.zeros(len(snap.node_id), dtype=bool)
    lemons[
        [index[n] for n in Node.objects.filter(is_lemon=True).values_list("id", flat=True) if n in index]
    ] = True
    nodes["lemon"] = lemons

    def per_node(faults) -> np.ndarray:  # faults per node
        count = np.zeros(len(snap.node_id), dtype=np.int64)
        for node, gpu_node in faults.values_list("node_id", "gpu__node_id"):
            at = index.get(node if node is not None else gpu_node)
            if at is not None:
                count[at] += 1
        return count

    nodes["open_faults"] = per_node(FaultEvent.objects.filter(cleared_at__isnull=True))
    day_ago = timezone.now() - timedelta(hours=24)
    recent = FaultEvent.objects.filter(at__gte=day_ago).values_list("node_id", "gpu__node_id", "at")
    hourly = [
        (index.get(n if n is not None else g), int((at - day_ago).total_seconds() // 3600))
        for n, g, at in recent
    ]
    hourly = np.array([(n, min(h, 23)) for n, h in hourly if n is not None], dtype=np.int64).reshape(-1, 2)
    nodes["faults_24h"] = np.bincount(hourly[:, 0], minlength=len(snap.node_id))
    _marks["hourly"] = hourly  # (node, hour from 24 h ago) of each fault of the last day
    _marks.update(at=now, snap=snap, nodes=nodes)
    return nodes


def _job_overlay(snap, hierarchy: Hierarchy, level: str, job_id: int) -> tuple[dict, np.ndarray]:
    """The job's summary and how many of its GPUs each cell of ``level`` holds."""

    job = Job.objects.select_related("queue").filter(pk=job_id).first()
    if job is None:
        raise UnknownDomain("job", f"there is no job {job_id}")
    held = np.array(
        AllocatedGPU.objects.filter(job=job, active=True).values_list("gpu_id", flat=True), dtype=np.int64
    )
    gpus = topology_cache.gpu_indices(held)  # the cached order of the snapshot's GPU ids
    summary = {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "queue": job.queue.name,
        "gpus": job.gpus,
        "allocated_gpus": int(len(gpus)),
        "placement": job.placement,
        "pending_reason": job.pending_reason,
        "pending_kind": job.pending_kind,
        "ettr": job_ettr([job]).get(job.pk),
    }
    if job.state == "pending":  # where it could run now, or why not
        summary["would_fit"] = where_it_fits(snap, job, snap.schedulable() & ~held_gpus(snap)[0])
    return summary, hierarchy.count(level, gpus, of="gpu")


def _uplinks(snap, level: str, cells: np.ndarray, path: list[dict]) -> list[dict]:
    """The uplinks the view touches, each labelled by its pod or rack, in % of capacity (over
    100: congested): the pods' or racks' shown, and those of the pod and rack the view is inside.
    Empty until the fleet or the agents' collector has written the network figures."""
    import json

    raw = live_store().get(NETWORK_KEY)
    if raw is None:
        return []
    net = json.loads(raw)
    util = {
        "pod": dict(zip(net.get("pod_ids", []), net.get("pod_util", []), strict=False)),
        "rack": dict(zip(net.get("rack_ids", []), net.get("rack_util", []), strict=False)),
    }
    _, racks = domains.hierarchy(snap)
    out = [
        {
            "kind": p["level"],
            "id": p["id"],
            "name": p["name"],
            "util": round(100 * util[p["level"]][p["id"]], 1),
        }
        for p in path
        if p["level"] in util and p["id"] in util[p["level"]]
    ]
    if level in util:
        ids = domains.ids(snap, level)[cells]
        names = domains.names(snap, level, racks, cells)
        out += [
            {"kind": level, "id": int(i), "name": n, "util": round(100 * util[level][int(i)], 1)}
            for i, n in zip(ids, names, strict=True)
            if int(i) in util[level]
        ]
    return out


def parse(params) -> dict:
    """The query's parameters, checked; LevelQueryError names the one that is wrong."""
    level = params.get("level", "pod")
    if level not in LEVELS:
        raise LevelQueryError("level", f"must be one of {', '.join(LEVELS)}")
    metric = params.get("metric", "util")
    if metric not in FRAME_METRICS:
        raise LevelQueryError("metric", f"must be one of {', '.join(FRAME_METRICS)}")
    how = params.get("aggregate", "mean")
    if how not in VIEW_AGGREGATES:
        raise LevelQueryError("aggregate", f"must be one of {', '.join(VIEW_AGGREGATES)}")
    raw = params.get("threshold", "80")
    if not (0 < len(raw) <= 3 and raw.isascii() and raw.isdigit()) or int(raw) > 255:
        raise LevelQueryError("threshold", "must be a whole number from 0 to 255")
    within = params.get("within")
    parent = None
    if within:
        name, _, ident = within.partition(":")
        if name not in LEVELS or not domains.an_id(ident):
            raise LevelQueryError("within", "must be LEVEL:ID, as datacenter:3 or rack:120")
        if LEVELS.index(name) >= LEVELS.index(level):
            raise LevelQueryError("within", f"a {name} is not above the level {level}")
        parent = (name, int(ident))
    job = params.get("job") or None
    if job is not None and not domains.an_id(job):
        raise LevelQueryError("job", "must be a job id")
    return {
        "level": level,
        "metric": metric,
        "aggregate": how,
        "threshold": int(raw),
        "within": parent,
        "job": int(job) if job else None,
    }


def _scope(snap, hierarchy: Hierarchy, racks, query: dict) -> tuple[np.ndarray, list[dict]]:
    """(the cells of the level shown, the path from the datacenter down to ``within``)."""
    level = query["level"]
    if query["within"] is None:
        return np.arange(hierarchy.size(level)), []
    name, ident = query["within"]
    found = np.flatnonzero(domains.ids(snap, name) == ident)
    if not len(found):
        raise UnknownDomain("within", f"there is no {name} with id {ident}")
    path = [
        {"level": lv, "id": int(domains.ids(snap, lv)[c]), "name": domains.names(snap, lv, racks, [c])[0]}
        for lv, c in hierarchy.ancestors(name, int(found[0]))
    ]
    return hierarchy.within(level, name, int(found[0])), path


def _figures(snap, hierarchy: Hierarchy, seq: int, values: dict, query: dict) -> tuple[dict, dict]:
    """Every level's aggregate of the metric and GPUs not healthy for this frame, made once."""
    key = (id(snap), seq, query["metric"], query["aggregate"], query["threshold"])
    with _lock:
        figures = _aggregates.get(key)
        if figures is None:
            health = values["health"]
            how = "unhealthy" if query["aggregate"] == "faults" else query["aggregate"]  # faults: below
            metric = values[query["metric"]]
            figures = _aggregates[key] = (
                aggregate_all(hierarchy, metric, how, threshold=query["threshold"], health=health),
                aggregate_all(hierarchy, health, "unhealthy", health=health),
            )
            while len(_aggregates) > KEEP:
                _aggregates.popitem(last=False)
    return figures


def _cell_marks(snap, hierarchy: Hierarchy, level: str, cells: np.ndarray) -> dict[str, np.ndarray]:
    """Per cell shown, the count of each mark (a GPU carries its node's)."""
    node_marks = _node_marks(snap)
    if level == "gpu":
        return {m: v[snap.gpu_node][cells] for m, v in node_marks.items()}
    return {
        m: hierarchy.count(level, v if v.dtype == bool else np.repeat(np.arange(len(v)), v))[cells]
        for m, v in node_marks.items()
    }


def _faults_by_hour(snap, hierarchy: Hierarchy, level: str, cells: np.ndarray) -> np.ndarray:
    """Per cell shown, its faults in each hour of the last day, oldest first (a GPU: its node's)."""
    hourly = _marks["hourly"]
    if level == "gpu":
        by_node = np.zeros((len(snap.node_id), 24), dtype=np.int64)
        np.add.at(by_node, (hourly[:, 0], hourly[:, 1]), 1)
        return by_node[snap.gpu_node][cells]
    grid = np.zeros((hierarchy.size(level), 24), dtype=np.int64)
    if len(hourly):
        np.add.at(grid, (hierarchy.up(level, hourly[:, 0]), hourly[:, 1]), 1)
    return grid[cells]


def level_view(snap, frame: bytes, query: dict) -> dict:
    """The cells of ``query['level']`` (inside ``query['within']``) with their figures."""
    hierarchy, racks = domains.hierarchy(snap)
    seq, t, values = decode_frame(frame)
    if len(values["util"]) != hierarchy.num_gpus:
        gpus = len(values["util"])
        raise LevelQueryError("frame", f"the frame has {gpus} GPUs, the inventory {hierarchy.num_gpus}")
    level = query["level"]
    cells, path = _scope(snap, hierarchy, racks, query)
    figures = _figures(snap, hierarchy, seq, values, query)
    value, unhealthy, gpus = figures[0][level][cells], figures[1][level][cells], hierarchy.gpus(level)[cells]
    ids, names = domains.ids(snap, level)[cells], domains.names(snap, level, racks, cells)
    counts = _cell_marks(snap, hierarchy, level, cells)
    hours = None
    if query["aggregate"] == "faults":  # faults of the last 24 hours, from the database, hour by hour
        value = counts["faults_24h"].astype(np.float32)
        hours = _faults_by_hour(snap, hierarchy, level, cells)
    job, held = None, None
    if query["job"] is not None:
        job, held = _job_overlay(snap, hierarchy, level, query["job"])
        held = held[cells]
    answer = {
        "frame": seq,
        "t": t,
        "level": level,
        "metric": query["metric"],
        "aggregate": query["aggregate"],
        "threshold": query["threshold"],
        "path": path,
        "cells": [
            {
                "id": int(ids[i]),
                "name": names[i],
                "gpus": int(gpus[i]),
                "value": None if np.isnan(value[i]) else round(float(value[i]), 1),
                "unhealthy": 0 if np.isnan(unhealthy[i]) else int(unhealthy[i]),
                # the overlays: nodes not ready, spares, lemons, open faults (only those present)
                "marks": {m: int(c[i]) for m, c in counts.items() if c[i]},
                **({"job_gpus": int(held[i])} if held is not None else {}),
                **({"faults_by_hour": hours[i].tolist()} if hours is not None else {}),
            }
            for i in range(len(cells))
        ],
        "uplinks": _uplinks(snap, level, cells, path),
    }
    sites = fabric_view.site_links(snap, level, cells)
    if sites:
        answer["sites"] = sites
    network = fabric_view.links(snap, level, cells, path)
    if network is not None:
        answer["fabric"] = network
    if job is not None:
        answer["job"] = job
    return answer


_views: OrderedDict = OrderedDict()  # (frame seq, query) -> the view as JSON text
_frame: dict = {}  # "newest": (seq, bytes) of the newest frame this process read, one tuple swapped whole


def view_json(seq: int | None = None, query: dict | None = None) -> str | None:
    """The view ``query`` asks for on frame ``seq`` (None: the newest) as JSON text, made once per
    frame and query in this process however many websocket clients watch it; None without a
    frame. A bad query raises LevelQueryError."""
    import json

    key = (seq, tuple(sorted((k, str(v)) for k, v in query.items())))
    with _lock:
        if seq is not None and key in _views:
            return _views[key]
    newest = _frame.get("newest")
    if seq is None or newest is None or newest[0] != seq:
        data = live_store().get(FRAME_KEY)
        if data is None:
            return None
        newest = _frame["newest"] = (decode_frame(data)[0], data)
    text = json.dumps(level_view(topology_cache.structure(), newest[1], query), separators=(",", ":"))
    with _lock:
        _views[(newest[0], key[1])] = text
        while len(_views) > KEEP:
            _views.popitem(last=False)
    return text


def find(snap, text: str, limit: int = 20) -> list[dict]:
    """Where ``text`` names something in the cluster: a datacenter, pod or rack by name, a node by
    hostname, a GPU by UUID, a job by id or name; each with the view (level, within) that shows
    it, and for a job its id for the overlay."""

    text = text.strip()
    if not text:
        return []
    low, out = text.lower(), []
    for level, child in (("datacenter", "pod"), ("pod", "rack")):
        for i, name in enumerate(snap.names[level]):
            if low in name.lower():
                out.append(_hit(level, name, child, f"{level}:{int(domains.ids(snap, level)[i])}"))
    pods = dict(zip(snap.pod_id.tolist(), snap.names["pod"], strict=True))
    for rack, name, pod in Rack.objects.filter(name__icontains=text).values_list("id", "name", "pod_id")[
        :limit
    ]:
        out.append(_hit("rack", f"{pods.get(pod, pod)}/{name}", "node", f"rack:{rack}"))
    nodes = Node.objects.filter(hostname__icontains=text).values_list("id", "hostname")
    for node, hostname in nodes[:limit]:
        out.append(_hit("node", hostname, "gpu", f"node:{node}"))
    gpus = GPU.objects.filter(uuid__istartswith=text).values_list(
        "uuid", "index", "node_id", "node__hostname"
    )
    for uuid, index, node, hostname in gpus[:limit]:
        out.append(_hit("gpu", f"{hostname} GPU {index} ({uuid})", "gpu", f"node:{node}"))
    by_id = domains.an_id(text)
    jobs = Job.objects.filter(pk=int(text)) if by_id else Job.objects.filter(name__icontains=text)
    for job, name, state in jobs.order_by("-id").values_list("id", "name", "state")[:limit]:
        out.append({**_hit("job", f"job {job} {name} ({state})".replace("  ", " "), "pod", ""), "job": job})
    return out[:limit]


def _hit(kind: str, label: str, level: str, within: str) -> dict:
    return {"kind": kind, "label": label, "level": level, "within": within}
