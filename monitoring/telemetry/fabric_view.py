"""The fleet view's fabric: the switch links of what a level view shows, from the newest fabric
entry (monitoring.telemetry.fabric). At the pod level each pod's uplink; inside a pod its uplink
and every rail leaf; each with its worst port's p99 window, load over capacity, CNPs per
second, ports down, whether it is congested (and its open congestion record), and the pod's NIC
port faults: flaps in the last 24 hours, ports down still open."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from cluster.models import DatacenterLink
from monitoring.models import CongestionRecord, FaultEvent
from monitoring.telemetry import fabric
from monitoring.telemetry.livestore import live_store
from scheduling.sites import crossing_counts, load_of, running_loads, running_shares

MAX_PODS = 64  # uplinks listed at the pod level (the busiest first)
NIC_FAULTS = ("nic_link_flap", "nic_port_down")


def _link(kind: str, name: str, tier: dict, i: int, record) -> dict:
    return {
        "kind": kind,
        "name": name,
        "p99": tier["p99"][i],
        "util": round(100 * tier["util"][i], 1),
        "cnp_per_s": tier["cnp_per_s"][i],
        "down": tier["down"][i],
        "congested": i in tier["congested_set"],
        "congested_since": record.started_at.isoformat() if record is not None else None,
    }


def links(snap, level: str, cells, path: list[dict]) -> dict | None:
    """The fabric of the view (None before any fabric figures or outside a pod's reach)."""
    if level == "pod":
        pods = [int(c) for c in cells]
    else:
        inside = [p for p in path if p["level"] == "pod"]
        if not inside:
            return None
        pods = [list(snap.pod_id).index(inside[0]["id"])]
    entry = fabric.newest(live_store())
    if entry is None or not pods:
        return None
    for level_name in ("leaf", "pod"):
        entry[level_name]["congested_set"] = set(entry[level_name]["congested"])
    pod_ids = [int(snap.pod_id[p]) for p in pods]
    names = snap.names["pod"]
    records = {
        (r.pod_id, r.rail): r
        for r in CongestionRecord.objects.filter(ended_at__isnull=True, pod_id__in=pod_ids)
    }
    since = timezone.now() - timedelta(hours=24)
    nic = (
        FaultEvent.objects.filter(
            source__in=("nic_link_flap", "nic_port_down"), node__rack__pod_id__in=pod_ids
        )
        .values("node__rack__pod_id")
        .annotate(
            flaps=Count("id", filter=Q(source="nic_link_flap", at__gte=since)),
            down=Count("id", filter=Q(source="nic_port_down", cleared_at__isnull=True)),
        )
    )
    faults = {row["node__rack__pod_id"]: row for row in nic}
    order = sorted(pods, key=lambda p: -entry["pod"]["p99"][p])[:MAX_PODS] if level == "pod" else pods
    out = []
    rails = entry["rails"]
    for p in order:
        pod_id = int(snap.pod_id[p])
        marks = faults.get(pod_id, {})
        row = _link("pod uplink", names[p], entry["pod"], p, records.get((pod_id, None)))
        row.update(pod=pod_id, flaps_24h=marks.get("flaps", 0), ports_down_faults=marks.get("down", 0))
        out.append(row)
        if level != "pod" and entry.get("design", "rail") == "rail":
            for r in range(rails):
                out.append(
                    _link(f"rail {r} leaf", names[p], entry["leaf"], p * rails + r, records.get((pod_id, r)))
                )
    return {
        "source": entry["source"],
        "t": entry["t"],
        "thresholds": entry["thresholds"],
        "links": out,
    }


def site_links(snap, level: str, cells) -> list[dict]:
    """At the datacenter level (the sites): the links between the datacenters shown, each with its
    state, lanes, capacity now, the load of the jobs crossing it and how many cross it."""
    if level != "datacenter":
        return []
    shown = {int(snap.datacenter_id[int(c)]) for c in cells}
    shares = running_shares()  # one read for the loads and the counts
    loads, crossing = running_loads(shares=shares), crossing_counts(shares)
    out = []
    for link in DatacenterLink.objects.select_related("a", "b").filter(a_id__in=shown, b_id__in=shown):
        load, util = load_of(link, loads)
        out.append(
            {
                "id": link.pk,
                "name": f"{link.a.name} <-> {link.b.name}",
                "state": link.state,
                "lanes": f"{link.lanes - link.lanes_lost} of {link.lanes} x {link.lane_gbps:g} Gb/s",
                "capacity_gbps": link.capacity_gbps,
                "load_gbps": round(load, 1),
                "util": round(100 * util, 1) if util is not None and link.capacity_gbps else None,
                "jobs": crossing.get((link.a_id, link.b_id), 0),
                "latency_ms": link.latency_ms,
                "distance_km": link.distance_km,
                "reason": link.state_reason,
            }
        )
    return out
