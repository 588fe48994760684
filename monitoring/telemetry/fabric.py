"""The fabric's link loads, every frame: from the agents' port summaries (and, with a simulated
fleet, its modelled ports), through ``engine.fabric.link_loads``, into one compact entry of the
live store (never a row per port per report). The fleet view's fabric level, the congestion
records, the metrics and placement read that entry.
"""

from __future__ import annotations

import time
from itertools import chain

import numpy as np
import orjson
from django.conf import settings

from engine.fabric import FabricSpec, PortLoads, congested_pods, link_loads
from monitoring.telemetry.netreports import FABRIC_COLUMNS

FABRIC_KEY = "myriad:network:fabric"


def spec() -> FabricSpec:
    return FabricSpec(
        congested_p99=float(settings.FABRIC_CONGESTED_P99),
        congested_cnp_per_s=float(settings.FABRIC_CONGESTED_CNP_PER_S),
    )


def ports_from_reports(snapshot, reports: dict[int, dict], stale_s: float) -> PortLoads:
    """The ports of the agents' newest reports (those fresher than ``stale_s``) as arrays, from
    the row ingest keeps with each report (netreports.fabric_row): one pass over the nodes."""
    if not reports:
        return PortLoads.empty()
    index = {int(n): i for i, n in enumerate(snapshot.node_id)}
    now = time.time()
    rows, nodes, counts = [], [], []
    width = len(FABRIC_COLUMNS)
    for node_id, entry in reports.items():
        row = entry.get("fabric")
        ni = index.get(node_id)
        if not row or ni is None or now - entry.get("t", 0) > stale_s:
            continue
        rows.append(row)
        nodes.append(ni)
        counts.append(len(row) // width)
    if not rows:
        return PortLoads.empty()
    values = np.fromiter(chain.from_iterable(rows), dtype=np.float64).reshape(-1, width)
    return PortLoads(
        node=np.repeat(np.array(nodes, np.int64), counts),
        rail=values[:, 0].astype(np.int64),
        rate_gbps=values[:, 1],
        tx_bytes_s=values[:, 2],
        rx_bytes_s=values[:, 3],
        p99=values[:, 4],
        cnp_per_s=values[:, 5],
        down=values[:, 6] > 0,
    )


def merge(a: PortLoads, b: PortLoads) -> PortLoads:
    """``a``'s ports, and ``b``'s on nodes ``a`` has none on (the agents' ports over modelled ones)."""
    if not len(a):
        return b
    keep = ~np.isin(b.node, np.unique(a.node))
    return PortLoads(
        *(np.concatenate([getattr(a, f), getattr(b, f)[keep]]) for f in PortLoads.__dataclass_fields__)
    )


def publish(snapshot, ports: PortLoads, source: str, store, seq: int = 0) -> dict:
    """Compute the link loads and write them as the fabric entry; returns what was written."""
    s = spec()
    loads = link_loads(snapshot, ports, s)
    pods = congested_pods(snapshot, loads, s)
    entry = {
        "t": time.time(),
        "seq": seq,
        "source": source,
        "design": s.design,
        "rails": s.rails,
        "ports": len(ports),
        "thresholds": {"p99": s.congested_p99, "cnp_per_s": s.congested_cnp_per_s},
        "pod_ids": snapshot.pod_id.tolist(),
        "congested_pods": np.nonzero(pods)[0].tolist(),
    }
    for level, t in loads.items():
        entry[level] = {
            "util": np.round(t["util"], 4).tolist(),
            "p99": np.round(t["p99"], 1).tolist(),
            "cnp_per_s": np.round(t["cnp_per_s"], 1).tolist(),
            "load_gbps": np.round(t["load"] * 8 / 1e9, 2).tolist(),
            "capacity_gbps": np.round(t["capacity"] * 8 / 1e9, 1).tolist(),
            "ports": t["ports"].tolist(),
            "down": t["down"].tolist(),
            "congested": np.nonzero(t["congested"])[0].tolist(),
        }
    store.put(FABRIC_KEY, orjson.dumps(entry))
    return entry


def newest(store) -> dict | None:
    raw = store.get(FABRIC_KEY)
    return orjson.loads(raw) if raw else None
