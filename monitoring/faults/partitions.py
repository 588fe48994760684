"""Site partitions: a datacenter the control plane cannot reach is one event, not a fault per node.

When every agent of a datacenter (at least MYRIAD_PARTITION_MIN_NODES of them) is silent at once,
the datacenter is partitioned from the control plane: a ``SitePartition`` opens, its nodes get no
heartbeat-loss faults (their jobs are not requeued: the agents keep them running), and the
scheduling cycle places nothing new there. An operator may declare one too (the path to the site
marked down). It closes when an agent there reports again (or the operator ends it); the agents'
reports then reconcile against assignments that never changed, so no job runs twice and no GPU is
held twice. A node that goes silent while others of its datacenter still report is an ordinary
heartbeat loss; one whose datacenter has heard from nobody for half the timeout waits, as the
silence may be the whole site's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from cluster.audit import record
from cluster.models import NodeCredential
from monitoring.models import SitePartition


def open_datacenters() -> set[int]:
    """Datacenter ids with an open partition."""
    return set(SitePartition.objects.filter(ended_at__isnull=True).values_list("datacenter_id", flat=True))


def _agents_by_datacenter(cutoff: datetime) -> dict[int, list[datetime | None]]:
    """Each datacenter's agents' last reports; an agent enrolled within the timeout counts as
    just heard (it cannot have been silent that long)."""
    rows = NodeCredential.objects.filter(revoked_at__isnull=True).values_list(
        "node__rack__pod__datacenter_id", "last_used_at", "created_at"
    )
    out: dict[int, list[datetime | None]] = {}
    for dc, last, created in rows:
        if created > cutoff:
            last = max(last or created, created)
        out.setdefault(dc, []).append(last)
    return out


def follow(now: datetime, timeout: timedelta) -> tuple[set[int], list[int], list[int]]:
    """Open and close partitions from the agents' last reports. Returns the datacenters whose
    silent nodes must not be judged one by one now (partitioned, or quiet for half the timeout),
    and the partitions opened and closed."""
    cutoff = now - timeout
    agents = _agents_by_datacenter(cutoff)
    current = {p.datacenter_id: p for p in SitePartition.objects.filter(ended_at__isnull=True)}
    hold, opened, closed = set(), [], []
    for dc, lasts in agents.items():
        heard = [t for t in lasts if t is not None]
        newest = max(heard, default=None)
        partition = current.get(dc)
        if partition is not None:
            if partition.source == "agents_silent" and newest is not None and newest > partition.started_at:
                partition.ended_at, partition.ended_reason = now, "an agent there reported again"
                partition.save(update_fields=["ended_at", "ended_reason"])
                closed.append(partition.pk)
            else:
                hold.add(dc)
            continue
        if newest is not None and newest > cutoff:
            if newest <= now - timeout / 2:
                hold.add(dc)  # nobody there reported lately: the whole site may be going silent
            continue
        if len(lasts) < settings.PARTITION_MIN_NODES:
            continue
        try:
            with transaction.atomic():
                partition = SitePartition.objects.create(
                    datacenter_id=dc,
                    started_at=newest or cutoff,
                    detected_at=now,
                    source="agents_silent",
                    nodes=len(lasts),
                    reason=f"all {len(lasts)} agents silent for {timeout.total_seconds():.0f} s",
                )
        except IntegrityError:
            continue  # another watcher opened it first
        opened.append(partition.pk)
        hold.add(dc)
    return hold, opened, closed


def declare(datacenter, reason: str, actor, now: datetime) -> SitePartition:
    """An operator marks the path to a datacenter down: one open partition (the same one when it
    is already partitioned)."""
    with transaction.atomic():
        existing = (
            SitePartition.objects.select_for_update()
            .filter(datacenter=datacenter, ended_at__isnull=True)
            .first()
        )
        if existing is not None:
            return existing
        nodes = NodeCredential.objects.filter(
            revoked_at__isnull=True, node__rack__pod__datacenter=datacenter
        ).count()
        last = NodeCredential.objects.filter(node__rack__pod__datacenter=datacenter).aggregate(
            t=Max("last_used_at")
        )["t"]
        partition = SitePartition.objects.create(
            datacenter=datacenter,
            started_at=min(last or now, now),
            detected_at=now,
            source="operator",
            nodes=nodes,
            reason=reason[:255],
        )
        record(actor, "partition", "datacenter", datacenter, {"partitioned": [False, True]}, reason)
    return partition


def end(partition: SitePartition, reason: str, actor, now: datetime) -> SitePartition:
    with transaction.atomic():
        partition = SitePartition.objects.select_for_update().get(pk=partition.pk)
        if partition.ended_at is None:
            partition.ended_at, partition.ended_reason = max(now, partition.started_at), reason[:255]
            partition.save(update_fields=["ended_at", "ended_reason"])
            record(
                actor,
                "end_partition",
                "datacenter",
                partition.datacenter,
                {"partitioned": [True, False]},
                reason,
            )
    return partition
