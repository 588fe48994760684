"""Prometheus metrics: the control plane's (``/metrics``) and every GPU's with dcgm-exporter's
names and labels (``/metrics/gpus``), computed at scrape time from the shared state.

Every value comes from what all processes share, the database and the live store, never from a
process's own memory: any web process answers a scrape with the same figures, however many run
and on however many machines, and a restart loses nothing. So there is no multiprocess mode and no
exporter process to run. Totals come from the records themselves (job events, faults); the one
figure no record keeps, the scheduling cycle's duration, is a histogram of counters in the live
store (Redis' HINCRBYFLOAT, or a locked file on one machine) that every cycle adds to.

The control plane's families are prometheus-client's and its exposition ``generate_latest``; the
GPUs' are in ``monitoring.telemetry.gpu_metrics``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString

from cluster.models import DatacenterLink, NicPort, Pod
from cluster.outages import best_effort
from engine.faults import SOURCE_TABLE, XID_TABLE
from engine.frames import decode_frame
from engine.reasons import PENDING_KINDS
from engine.sites import LINK_STATES
from monitoring.models import CongestionRecord, FaultEvent
from monitoring.telemetry import fabric
from monitoring.telemetry.alert_metrics import paging_families
from monitoring.telemetry.livestore import CYCLE_COUNTS_KEY, live_store, newest_frame
from monitoring.telemetry.overview import BUCKETS, ettr_last_day, overview
from scheduling.choices import EventKind, JobState
from scheduling.history import admission_wait
from scheduling.models import Job, JobEvent, Queue
from scheduling.sites import load_of, running_loads
from scheduling.usage import queue_usage

log = logging.getLogger("myriad.metrics")

CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)
RECOVERY_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


# --- the scheduling cycle's duration (the only figure no record keeps) -----------------------
def record_cycle(seconds: float) -> None:
    """One cycle that ran: add it to the shared histogram (cumulative buckets, as exposed)."""
    amounts = {f"le:{b}": 1.0 for b in CYCLE_BUCKETS if seconds <= b}
    amounts["count"] = 1.0
    amounts["sum"] = seconds
    try:
        live_store().add_counts(CYCLE_COUNTS_KEY, amounts)
    except Exception:  # noqa: BLE001 - a metric must never fail the cycle it measures
        log.exception("the cycle duration was not recorded")


def _cycle_histogram():
    """The cycles' histogram; nothing while the live store does not answer (a histogram of zeros
    would read as a counter reset)."""
    counts = best_effort("reading the cycle histogram", live_store().counts, CYCLE_COUNTS_KEY)
    if counts is None:
        return
    h = HistogramMetricFamily(
        "myriad_cycle_duration_seconds", "Scheduling cycles that ran, by duration (read, decide, apply)"
    )
    buckets = [(floatToGoString(b), counts.get(f"le:{b}", 0.0)) for b in CYCLE_BUCKETS]
    buckets.append(("+Inf", counts.get("count", 0.0)))
    h.add_metric([], buckets, counts.get("sum", 0.0))
    yield h


# --- totals from the records, read incrementally ------------------------------------------------
def eviction_reason(kind: str, data: dict) -> str | None:
    """Why a job left its GPUs without finishing, as Kueue names evictions; None: not an eviction
    (the requeue that follows a preemption is the same eviction)."""
    if kind == EventKind.PREEMPTED:
        return "preempted" if data.get("by_job") is not None else "drained"
    if kind == EventKind.REQUEUED:
        if "fault" in data:
            return "fault"
        if "nodes_not_started" in data:
            return "start_timeout"
        return None
    if kind == EventKind.SUSPENDED:
        return "suspended"
    return None


EVICTION_REASONS = ("preempted", "drained", "fault", "start_timeout", "suspended")


@dataclass
class _Totals:
    """Job-event totals by queue, kept per process and brought up to date at each scrape by the
    events added since (their ids only grow): every process converges on the same figures."""

    BATCH = 20_000  # events read at a time
    last_id: int = 0
    admitted: dict | None = None
    evicted: dict | None = None
    wait_buckets: dict | None = None  # queue -> [count per WAIT_BUCKETS..., +Inf], sum

    def reset(self) -> None:
        self.last_id, self.admitted, self.evicted, self.wait_buckets = 0, {}, {}, {}

    def update(self) -> None:
        """Count the events added since the last update, BATCH at a time: a process's first scrape
        catches up on the whole history (hundreds of thousands of events at 100k GPUs), which read
        at once took 160 MB."""
        if self.admitted is None:
            self.reset()
        while self._count(self._since_last()) == self.BATCH:
            pass

    def _since_last(self) -> list[tuple]:
        kinds = [EventKind.ADMITTED, EventKind.PREEMPTED, EventKind.REQUEUED, EventKind.SUSPENDED]
        return list(
            JobEvent.objects.filter(id__gt=self.last_id, kind__in=kinds)
            .order_by("id")
            .values_list("id", "kind", "at", "data", "job__queue__name", "job__submitted_at")[: self.BATCH]
        )

    def _count(self, rows: list[tuple]) -> int:
        """Add ``rows`` (events in id order) to the totals; returns how many there were."""
        for _, kind, at, data, queue, submitted in rows:
            if kind == EventKind.ADMITTED:
                self.admitted[queue] = self.admitted.get(queue, 0) + 1
                wait = admission_wait(data, at, submitted)
                counts, total = self.wait_buckets.get(queue, ([0] * (len(WAIT_BUCKETS) + 1), 0.0))
                for i, b in enumerate(WAIT_BUCKETS):
                    if wait <= b:
                        counts[i] += 1
                counts[-1] += 1
                self.wait_buckets[queue] = (counts, total + wait)
            else:
                reason = eviction_reason(kind, data or {})
                if reason:
                    self.evicted[(queue, reason)] = self.evicted.get((queue, reason), 0) + 1
        if rows:
            self.last_id = rows[-1][0]
        return len(rows)


_totals = _Totals()


def reset_totals() -> None:
    """Forget what this process has counted (tests that roll the database back call this)."""
    _totals.reset()


# --- the control plane ---------------------------------------------------------------------
class ControlPlaneCollector:
    """The control plane's metrics, named in the spirit of Kueue's, each read at scrape time."""

    def collect(self):
        yield from self._jobs()
        yield from self._quota()
        yield from self._gpus()
        yield from self._faults()
        yield from _cycle_histogram()
        yield from self._health()
        yield from self._fabric()
        yield from self._links()
        yield from paging_families()

    def _jobs(self):
        pending = GaugeMetricFamily(
            "myriad_pending_jobs",
            "Jobs waiting, by queue and what keeps them waiting",
            labels=["queue", "reason"],
        )
        counts: dict[tuple[str, str], int] = {}
        for queue, kind, n in (  # the kind the scheduler gave (engine.reasons), never the sentence
            Job.objects.filter(state=JobState.PENDING)
            .values_list("queue__name", "pending_kind")
            .annotate(n=Count("id"))
            .order_by()
        ):
            key = (queue, kind or "other")
            counts[key] = counts.get(key, 0) + n
        queues = list(Queue.objects.order_by("name").values_list("name", flat=True))
        for queue in queues:
            for kind in PENDING_KINDS:
                pending.add_metric([queue, kind], counts.get((queue, kind), 0))
        yield pending
        running = GaugeMetricFamily("myriad_running_jobs", "Jobs holding GPUs, by queue", labels=["queue"])
        by_queue = dict(
            Job.objects.filter(state=JobState.RUNNING)
            .values_list("queue__name")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("queue__name", "n")
        )
        for queue in queues:
            running.add_metric([queue], by_queue.get(queue, 0))
        yield running

        _totals.update()
        admitted = CounterMetricFamily("myriad_admitted_jobs", "Admissions, by queue", labels=["queue"])
        for queue in queues:
            admitted.add_metric([queue], _totals.admitted.get(queue, 0))
        yield admitted
        evicted = CounterMetricFamily(
            "myriad_evicted_jobs",
            "Jobs that left their GPUs unfinished, by queue and reason (preempted, drained, fault, "
            "start_timeout, suspended)",
            labels=["queue", "reason"],
        )
        for queue in queues:
            for reason in EVICTION_REASONS:
                evicted.add_metric([queue, reason], _totals.evicted.get((queue, reason), 0))
        yield evicted
        wait = HistogramMetricFamily(
            "myriad_admission_wait_seconds",
            "Time from submission (or the last requeue) to admission, by queue",
            labels=["queue"],
        )
        for queue in queues:
            counts_, total = _totals.wait_buckets.get(queue, ([0] * (len(WAIT_BUCKETS) + 1), 0.0))
            buckets = [(floatToGoString(b), c) for b, c in zip(WAIT_BUCKETS, counts_, strict=False)]
            buckets.append(("+Inf", counts_[-1]))
            wait.add_metric([queue], buckets, total)
        yield wait

    def _quota(self):

        families = {
            key: GaugeMetricFamily(
                f"myriad_quota_{key}_gpus",
                f"Quota {key} in GPUs, by queue and chip type",
                labels=["queue", "chip"],
            )
            for key in ("nominal", "used", "borrowed", "lent")
        }
        for queue, rows in sorted(queue_usage().items()):
            for row in rows:
                if row["chip_type"] == "any":
                    continue
                for key, family in families.items():
                    family.add_metric([queue, row["chip_type"]], row[key])
        yield from families.values()

    def _gpus(self):

        data = overview()
        gpus = GaugeMetricFamily(
            "myriad_gpus",
            "GPUs by state (free, allocated, allocated_idle, cordoned, down, repairing)",
            labels=["state"],
        )
        for bucket in BUCKETS:
            gpus.add_metric([bucket], data["counts"][bucket])
        yield gpus

    def _faults(self):
        faults = CounterMetricFamily(
            "myriad_faults", "Faults recorded, by cause and source", labels=["cause", "source"]
        )
        counts = list(
            FaultEvent.objects.values_list("cause", "source")
            .annotate(n=Count("id"))
            .order_by("cause", "source")
        )
        # every source's documented cause is there at zero before its first fault, so the alerts'
        # increase() sees that first fault (a series born at 1 is no increase to Prometheus)
        totals = {(c.cause, source): 0 for source, c in SOURCE_TABLE.items()}
        totals.update({(c.cause, "xid"): 0 for c in XID_TABLE.values()})
        for cause, source, n in counts:
            totals[(cause or "unknown", source)] = n
        for (cause, source), n in sorted(totals.items()):
            faults.add_metric([cause, source], n)
        yield faults
        h = HistogramMetricFamily(
            "myriad_recovery_seconds",
            "Time from a fault to its job running again, by cause (measured on real nodes)",
            labels=["cause"],
        )
        by_cause: dict[str, list[float]] = {cause or "unknown": [] for cause, _, _ in counts}
        for cause, seconds in FaultEvent.objects.filter(recovery_s__isnull=False).values_list(
            "cause", "recovery_s"
        ):
            by_cause.setdefault(cause or "unknown", []).append(seconds)
        for cause, seconds in sorted(by_cause.items()):
            values = np.array(seconds, dtype=float)
            buckets = [(floatToGoString(b), int((values <= b).sum())) for b in RECOVERY_BUCKETS]
            buckets.append(("+Inf", len(values)))
            h.add_metric([cause], buckets, float(values.sum()))
        yield h

    def _health(self):

        ettr = GaugeMetricFamily(
            "myriad_ettr_ratio", "Effective training time ratio of the last 24 h (GPU-weighted, 0 to 1)"
        )
        ettr.add_metric([], ettr_last_day()["ettr"] or 0.0)
        yield ettr
        age = GaugeMetricFamily(
            "myriad_live_frame_age_seconds", "Seconds since the newest telemetry frame was written"
        )
        data = newest_frame()
        if data:
            with contextlib.suppress(ValueError):
                age.add_metric([], max(0.0, time.time() - decode_frame(data)[1]))
        yield age
        lengths = GaugeMetricFamily(
            "myriad_celery_queue_length", "Tasks waiting in each Celery queue", labels=["queue"]
        )
        for queue, n in celery_queue_lengths().items():
            lengths.add_metric([queue], n)
        yield lengths

    def _fabric(self):
        """Per switch link (a pod's rail leaf, a pod's uplink), never per port or per job: at
        100k GPUs 800 leaves and 100 pods, four families, ~3,600 series; the NIC ports as counts
        by kind and state."""
        entry = best_effort("reading the fabric figures", fabric.newest, live_store())
        families = {
            "util": GaugeMetricFamily(
                "myriad_fabric_link_utilization",
                "A switch link's load (its ports' sum) over its capacity; above 1 oversubscribed",
                labels=["level", "pod", "rail"],
            ),
            "p99": GaugeMetricFamily(
                "myriad_fabric_link_p99_percent",
                "The worst p99 of its ports' 10 ms windows' utilization, percent",
                labels=["level", "pod", "rail"],
            ),
            "cnp_per_s": GaugeMetricFamily(
                "myriad_fabric_link_cnp_per_second",
                "Congestion notifications its ports' NICs sent per second",
                labels=["level", "pod", "rail"],
            ),
            "congested": GaugeMetricFamily(
                "myriad_fabric_link_congested",
                "1 while the link is at its congestion threshold (p99 or CNP rate)",
                labels=["level", "pod", "rail"],
            ),
        }
        if entry:
            names = dict(Pod.objects.values_list("id", "name"))
            pods = [names.get(p, str(p)) for p in entry["pod_ids"]]
            rails = entry["rails"]
            for level in ("leaf", "pod"):
                tier = entry[level]
                hot = set(tier["congested"])
                for i in range(len(tier["util"])):
                    if level == "leaf" and entry.get("design", "rail") == "rail":
                        labels = [level, pods[i // rails], str(i % rails)]
                    elif level == "leaf":
                        labels = [level, f"rack {i}", ""]
                    else:
                        labels = [level, pods[i], ""]
                    for key in ("util", "p99", "cnp_per_s"):
                        families[key].add_metric(labels, tier[key][i])
                    families["congested"].add_metric(labels, 1.0 if i in hot else 0.0)
        yield from families.values()
        ports = GaugeMetricFamily(
            "myriad_nic_ports", "Nodes' NIC ports in the inventory, by kind", labels=["kind"]
        )
        for kind, n in NicPort.objects.values_list("kind").annotate(n=Count("id")).order_by("kind"):
            ports.add_metric([kind], n)
        yield ports
        records = GaugeMetricFamily("myriad_congestion_open", "Fabric links with an open congestion record")
        records.add_metric([], CongestionRecord.objects.filter(ended_at__isnull=True).count())
        yield records

    def _links(self):
        """Per datacenter link (a handful): the running jobs' shares over its capacity now, its
        state one-hot, its capacity."""
        util = GaugeMetricFamily(
            "myriad_link_utilization_ratio",
            "A datacenter link's load (the shares of the jobs crossing it) over its capacity now",
            labels=["link"],
        )
        state = GaugeMetricFamily(
            "myriad_link_state",
            "1 for the state a datacenter link is in (up, degraded, down)",
            labels=["link", "state"],
        )
        capacity = GaugeMetricFamily(
            "myriad_link_capacity_gbps",
            "What a datacenter link carries now: the lanes left, 0 when down",
            labels=["link"],
        )
        loads = running_loads()
        for link in DatacenterLink.objects.select_related("a", "b"):
            name = f"{link.a.name}<->{link.b.name}"
            used = load_of(link, loads)[1]
            util.add_metric([name], used if link.capacity_gbps else 0.0)
            for s in LINK_STATES:
                state.add_metric([name, s], 1.0 if link.state == s else 0.0)
            capacity.add_metric([name], link.capacity_gbps)
        yield util
        yield state
        yield capacity


def celery_queue_lengths() -> dict[str, int]:
    """Tasks waiting per Celery queue: the broker's list lengths (Redis), or the message files of
    the embedded file-system broker."""
    names = list(settings.CELERY_QUEUE_NAMES)
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(name)
        return dict(zip(names, pipe.execute(), strict=True))
    folder = settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]
    out = dict.fromkeys(names, 0)
    for entry in os.listdir(folder):
        if entry.endswith(".msg"):
            queue = entry.rsplit(".", 2)[-2]
            if queue in out:
                out[queue] += 1
    return out


def control_plane_exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlPlaneCollector())
    return generate_latest(registry)


def series_count(text: bytes) -> int:
    return sum(1 for line in text.split(b"\n") if line and not line.startswith(b"#"))
