"""Congestion as an event: a fabric link (a pod's rail leaf or its uplink) congested for
MYRIAD_FABRIC_CONGESTION_MIN_S opens a CongestionRecord (from when it was first seen, with its
peaks and the jobs running across it); the record follows its peaks while it lasts and closes
the first frame the link is clear. How long each link has been congested before it is a record
is kept in the live store, so any process composing frames carries it on.
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from monitoring.models import CongestionRecord
from scheduling.models import Allocation

PEAK_STEP = 1.05
CONGESTING_KEY = "myriad:network:congesting"  # {"pod:rail": first seen (epoch s)}, not yet records


def congested_links(entry: dict) -> dict[tuple[int, int | None], tuple[float, float, float]]:
    """(pod id, rail or None for the uplink) -> (p99, CNPs/s, utilization) of each congested
    link of a fabric entry (monitoring.telemetry.fabric.publish)."""
    pod_ids, rails = entry["pod_ids"], entry["rails"]
    out = {}
    leaf = entry["leaf"]
    if entry.get("design", "rail") == "rail":
        for i in leaf["congested"]:
            key = (pod_ids[i // rails], i % rails)
            out[key] = (leaf["p99"][i], leaf["cnp_per_s"][i], leaf["util"][i])
    pod = entry["pod"]
    for i in pod["congested"]:
        out[(pod_ids[i], None)] = (pod["p99"][i], pod["cnp_per_s"][i], pod["util"][i])
    return out


def jobs_across(pod_id: int) -> list[int]:
    """Jobs holding GPUs in the pod on more than one node: their traffic goes through its fabric."""
    nodes: dict[int, set[int]] = {}
    rows = Allocation.objects.filter(active=True, node__rack__pod_id=pod_id).values_list("job_id", "node_id")
    for job, node in rows.distinct():
        nodes.setdefault(job, set()).add(node)
    return sorted(job for job, held in nodes.items() if len(held) > 1)


def follow(entry: dict, store, now: datetime | None = None) -> dict:
    """Open, update and close the congestion records for the newest fabric entry."""
    now = now or timezone.now()
    t = now.timestamp()
    links = congested_links(entry)
    waiting = orjson.loads(store.get(CONGESTING_KEY) or b"{}")
    still: dict[str, float] = {}
    opened = closed = 0
    with transaction.atomic():
        records = {(r.pod_id, r.rail): r for r in CongestionRecord.objects.filter(ended_at__isnull=True)}
        for key, (p99, cnp, util) in links.items():
            record = records.get(key)
            if record is not None:
                # a new peak is written when it is one: 5% above the last (not every frame's noise)
                if (
                    p99 > record.peak_p99 * PEAK_STEP
                    or cnp > record.peak_cnp_per_s * PEAK_STEP
                    or (util > record.peak_util * PEAK_STEP)
                ):
                    record.peak_p99 = max(record.peak_p99, p99)
                    record.peak_cnp_per_s = max(record.peak_cnp_per_s, cnp)
                    record.peak_util = max(record.peak_util, util)
                    record.save(update_fields=["peak_p99", "peak_cnp_per_s", "peak_util"])
                continue
            name = f"{key[0]}:{'' if key[1] is None else key[1]}"
            first = float(waiting.get(name, t))
            if t - first < settings.FABRIC_CONGESTION_MIN_S:
                still[name] = first
                continue
            try:
                with transaction.atomic():
                    CongestionRecord.objects.create(
                        pod_id=key[0],
                        rail=key[1],
                        started_at=datetime.fromtimestamp(first, tz=UTC),
                        peak_p99=p99,
                        peak_cnp_per_s=cnp,
                        peak_util=util,
                        jobs=jobs_across(key[0]),
                        source=entry.get("source", "agents"),
                    )
                opened += 1
            except IntegrityError:  # another process opened it in between
                continue
        for key, record in records.items():
            if key not in links:
                record.ended_at = now
                record.save(update_fields=["ended_at"])
                closed += 1
    store.put(CONGESTING_KEY, orjson.dumps(still))
    return {"opened": opened, "closed": closed, "open": len(records) - closed + opened}
