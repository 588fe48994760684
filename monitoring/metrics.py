"""Prometheus metrics: the control plane's (``/metrics``) and every GPU's with dcgm-exporter's
names and labels (``/metrics/gpus``), computed at scrape time from the shared state.

Every value comes from what all processes share, the database and the live store, never from a
process's own memory: any web process answers a scrape with the same figures, however many run
and on however many machines, and a restart loses nothing. So there is no multiprocess mode and no
exporter process to run. Totals come from the records themselves (job events, faults); the one
figure no record keeps, the scheduling cycle's duration, is a histogram of counters in the live
store (Redis' HINCRBYFLOAT, or a locked file on one machine) that every cycle adds to.

The control plane's families are prometheus-client's and its exposition ``generate_latest``. The
GPU families at 100k GPUs are 800,000 samples, which ``generate_latest`` writes at about 27 us
each (20 s): ``gpu_exposition`` writes the same text byte for byte (a test compares them) with
each GPU's label set built once per topology and shared by its eight samples, and each distinct
value formatted once (by prometheus-client's own ``floatToGoString``).
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

from cluster.models import GPU, ChipType, Rack
from cluster.snapshot import topology_cache
from engine.frames import decode_frame
from engine.reasons import PENDING_KINDS, pending_kind
from monitoring.livestore import CYCLE_COUNTS_KEY, FRAME_KEY, live_store
from monitoring.models import FaultEvent
from scheduling.choices import EventKind, JobState
from scheduling.models import Job, JobEvent, Queue

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


def _cycle_histogram() -> HistogramMetricFamily:
    counts = live_store().counts(CYCLE_COUNTS_KEY)
    h = HistogramMetricFamily(
        "myriad_cycle_duration_seconds", "Scheduling cycles that ran, by duration (read, decide, apply)"
    )
    buckets = [(floatToGoString(b), counts.get(f"le:{b}", 0.0)) for b in CYCLE_BUCKETS]
    buckets.append(("+Inf", counts.get("count", 0.0)))
    h.add_metric([], buckets, counts.get("sum", 0.0))
    return h


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


@dataclass
class _Totals:
    """Job-event totals by queue, kept per process and brought up to date at each scrape by the
    events added since (their ids only grow): every process converges on the same figures."""

    last_id: int = 0
    admitted: dict | None = None
    evicted: dict | None = None
    wait_buckets: dict | None = None  # queue -> [count per WAIT_BUCKETS..., +Inf], sum

    def reset(self) -> None:
        self.last_id, self.admitted, self.evicted, self.wait_buckets = 0, {}, {}, {}

    def update(self) -> None:
        if self.admitted is None:
            self.reset()
        kinds = [EventKind.ADMITTED, EventKind.PREEMPTED, EventKind.REQUEUED, EventKind.SUSPENDED]
        rows = list(
            JobEvent.objects.filter(id__gt=self.last_id, kind__in=kinds)
            .order_by("id")
            .values_list("id", "job_id", "kind", "at", "data", "job__queue__name", "job__submitted_at")[
                :200_000
            ]
        )
        if not rows:
            return
        # the wait of an admission counts from the job's last requeue, or its submission
        jobs = {r[1] for r in rows if r[2] == EventKind.ADMITTED}
        requeues: dict[int, list] = {}
        if jobs:
            for job_id, at in (
                JobEvent.objects.filter(job_id__in=jobs, kind=EventKind.REQUEUED)
                .order_by("at")
                .values_list("job_id", "at")
            ):
                requeues.setdefault(job_id, []).append(at)
        for _, job_id, kind, at, data, queue, submitted in rows:
            if kind == EventKind.ADMITTED:
                self.admitted[queue] = self.admitted.get(queue, 0) + 1
                since = max([submitted, *[t for t in requeues.get(job_id, ()) if t <= at]])
                wait = max(0.0, (at - since).total_seconds())
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
        self.last_id = rows[-1][0]


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
        yield _cycle_histogram()
        yield from self._health()

    def _jobs(self):
        pending = GaugeMetricFamily(
            "myriad_pending_jobs",
            "Jobs waiting, by queue and what keeps them waiting",
            labels=["queue", "reason"],
        )
        counts: dict[tuple[str, str], int] = {}
        for queue, reason, n in (
            Job.objects.filter(state=JobState.PENDING)
            .values_list("queue__name", "pending_reason")
            .annotate(n=Count("id"))
            .order_by()
        ):
            key = (queue, pending_kind(reason) if reason else "other")
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
        for (queue, reason), n in sorted(_totals.evicted.items()):
            evicted.add_metric([queue, reason], n)
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
        from scheduling.usage import queue_usage

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
        from monitoring.overview import BUCKETS, overview

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
        for cause, source, n in (
            FaultEvent.objects.values_list("cause", "source")
            .annotate(n=Count("id"))
            .order_by("cause", "source")
        ):
            faults.add_metric([cause or "unknown", source], n)
        yield faults
        h = HistogramMetricFamily(
            "myriad_recovery_seconds",
            "Time from a fault to its job running again, by cause (measured on real nodes)",
            labels=["cause"],
        )
        by_cause: dict[str, list[float]] = {}
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
        from monitoring.overview import ettr_last_day

        ettr = GaugeMetricFamily(
            "myriad_ettr_ratio", "Effective training time ratio of the last 24 h (GPU-weighted, 0 to 1)"
        )
        ettr.add_metric([], ettr_last_day()["ettr"] or 0.0)
        yield ettr
        age = GaugeMetricFamily(
            "myriad_live_frame_age_seconds", "Seconds since the newest telemetry frame was written"
        )
        data = live_store().get(FRAME_KEY)
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


# --- GPUs, with dcgm-exporter's names and labels ------------------------------------------------
GPU_METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."),
)
GPU_LABELS = ("Hostname", "UUID", "datacenter", "gpu", "modelName", "pod", "rack")  # sorted, as exposed


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass
class GPUTable:
    """What a GPU's samples share, in the topology snapshot's GPU order: its label set (built once
    per topology), its datacenter and node, its chip's memory and power limit."""

    key: tuple
    labels: list[str]
    datacenter: np.ndarray  # datacenter index per GPU
    node: np.ndarray  # node index per GPU
    memory_mib: np.ndarray
    tdp_w: np.ndarray


_table: GPUTable | None = None


def gpu_table() -> GPUTable:
    global _table
    snap = topology_cache.current()
    key = (topology_cache.key, snap.num_gpus)
    if _table is not None and _table.key == key:
        return _table
    uuids = dict(GPU.objects.values_list("id", "uuid"))
    racks = dict(Rack.objects.values_list("id", "name"))
    chips = {c.name: c for c in ChipType.objects.all()}
    models = [chips[name].model if name in chips else name for name in snap.chip_names]
    dc_names, pod_names = snap.names["datacenter"], snap.names["pod"]
    node_pod = snap.rack_pod[snap.node_rack]
    node_dc = snap.pod_datacenter[node_pod]
    host = [f'Hostname="{_escape(h)}"' for h in snap.node_hostname]
    rest = [
        (
            f'datacenter="{_escape(dc_names[node_dc[i]])}"',
            f'modelName="{_escape(models[snap.node_chip[i]])}",pod="{_escape(pod_names[node_pod[i]])}",'
            f'rack="{_escape(racks.get(int(snap.rack_id[snap.node_rack[i]]), ""))}"',
        )
        for i in range(len(snap.node_id))
    ]
    labels = [
        f'{host[n]},UUID="{_escape(uuids.get(g, ""))}",{rest[n][0]},gpu="{slot}",{rest[n][1]}'
        for g, n, slot in zip(
            snap.gpu_id.tolist(), snap.gpu_node.tolist(), snap.gpu_slot.tolist(), strict=True
        )
    ]
    chip_memory = np.array([chips[n].memory_gib * 1024 if n in chips else 0.0 for n in snap.chip_names])
    chip_tdp = np.array([float(chips[n].tdp_watts) if n in chips else 0.0 for n in snap.chip_names])
    gpu_chip = snap.node_chip[snap.gpu_node]
    _table = GPUTable(
        key=key,
        labels=labels,
        datacenter=node_dc[snap.gpu_node],
        node=snap.gpu_node.astype(np.int64),
        memory_mib=chip_memory[gpu_chip] if len(chip_memory) else np.zeros(snap.num_gpus),
        tdp_w=chip_tdp[gpu_chip] if len(chip_tdp) else np.zeros(snap.num_gpus),
    )
    return _table


class ShardError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def select_gpus(table: GPUTable, shard: int | None, of: int | None, datacenter: str | None) -> np.ndarray:
    """GPU indices of one shard: nodes split into ``of`` contiguous ranges (a node's GPUs stay in one
    shard), and/or one datacenter."""
    snap = topology_cache.current()
    keep = np.ones(len(table.labels), dtype=bool)
    if datacenter is not None:
        names = snap.names["datacenter"]
        if datacenter not in names:
            raise ShardError("datacenter", f"no datacenter named {datacenter!r}")
        keep &= table.datacenter == names.index(datacenter)
    if of is not None or shard is not None:
        if of is None or shard is None:
            raise ShardError("shard", "give both shard and of, e.g. shard=0&of=4")
        if not 1 <= of <= 1024:
            raise ShardError("of", f"{of} is outside 1..1024")
        if not 0 <= shard < of:
            raise ShardError("shard", f"{shard} is outside 0..{of - 1}")
        nodes = len(snap.node_id)
        lo, hi = shard * nodes // of, (shard + 1) * nodes // of
        keep &= (table.node >= lo) & (table.node < hi)
    return np.flatnonzero(keep)


def gpu_values(table: GPUTable, snap=None) -> dict[str, np.ndarray]:
    """Every GPU's values for the GPU_METRICS, from the newest telemetry frame, the agents'
    newest readings (exact, where a node has an agent) and the open XID faults."""
    from monitoring.ingest import latest_reports

    snap = snap or topology_cache.current()
    n = snap.num_gpus
    util = np.zeros(n)
    temp = np.zeros(n)
    power_pct = np.zeros(n)
    memory_pct = np.zeros(n)
    data = live_store().get(FRAME_KEY)
    if data:
        try:
            _, _, frame = decode_frame(data)
            if len(frame["util"]) == n:
                util, temp = frame["util"].astype(float), frame["temperature"].astype(float)
                power_pct, memory_pct = frame["power"].astype(float), frame["memory"].astype(float)
        except ValueError:
            pass
    values = {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_POWER_USAGE": np.round(power_pct * table.tdp_w / 100, 1),
        "DCGM_FI_DEV_FB_USED": np.round(memory_pct * table.memory_mib / 100),
    }
    values["DCGM_FI_DEV_FB_FREE"] = np.maximum(table.memory_mib - values["DCGM_FI_DEV_FB_USED"], 0)
    values["DCGM_FI_DEV_XID_ERRORS"] = np.zeros(n)
    values["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] = np.zeros(n)
    values["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = np.zeros(n)
    from cluster.agents import agent_node_ids

    reports = latest_reports(agent_node_ids())
    if reports:
        node_index = {int(x): i for i, x in enumerate(snap.node_id)}
        slots = int(snap.gpu_slot.max()) + 1
        where = np.full((len(snap.node_id), slots), -1, dtype=np.int64)
        where[snap.gpu_node, snap.gpu_slot] = np.arange(n)
        fields = (
            ("DCGM_FI_DEV_GPU_UTIL", "util"),
            ("DCGM_FI_DEV_GPU_TEMP", "temperature_c"),
            ("DCGM_FI_DEV_POWER_USAGE", "power_w"),
            ("DCGM_FI_DEV_FB_USED", "memory_used_mib"),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected_volatile"),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected_volatile"),
        )
        for node_id, entry in reports.items():
            ni = node_index.get(node_id)
            if ni is None:
                continue
            for g in entry.get("gpus", []):
                i = where[ni, g["index"]] if g["index"] < slots else -1
                if i < 0:
                    continue
                for metric, name in fields:
                    if name in g:
                        values[metric][i] = g[name]
                if "memory_total_mib" in g and "memory_used_mib" in g:
                    values["DCGM_FI_DEV_FB_FREE"][i] = max(g["memory_total_mib"] - g["memory_used_mib"], 0)
    # the last XID of each GPU with an open XID fault
    open_xids = (
        FaultEvent.objects.filter(xid__isnull=False, gpu__isnull=False, cleared_at__isnull=True)
        .order_by("at")
        .values_list("gpu_id", "xid")
    )
    pairs = list(open_xids)
    if pairs:
        idx = topology_cache.gpu_indices([p[0] for p in pairs])
        values["DCGM_FI_DEV_XID_ERRORS"][idx] = [p[1] for p in pairs]
    return values


def _samples(name: str, labels: list[str], values: np.ndarray) -> str:
    uniq, inverse = np.unique(values, return_inverse=True)
    texts = [floatToGoString(v) for v in uniq.tolist()]
    head = name + "{"
    return "".join([f"{head}{lab}}} {texts[k]}\n" for lab, k in zip(labels, inverse.tolist(), strict=True)])


def _header(name: str, documentation: str) -> str:
    registry = CollectorRegistry(auto_describe=False)

    class Empty:
        def collect(self):
            yield GaugeMetricFamily(name, documentation, labels=list(GPU_LABELS))

    registry.register(Empty())
    return generate_latest(registry).decode()


_HEADERS = {name: None for name, _ in GPU_METRICS}


def gpu_exposition(shard: int | None = None, of: int | None = None, datacenter: str | None = None) -> bytes:
    """The GPU metrics of one shard in Prometheus' text format, as ``generate_latest`` writes it."""
    table = gpu_table()
    chosen = select_gpus(table, shard, of, datacenter)
    values = gpu_values(table)
    labels = [table.labels[i] for i in chosen.tolist()]
    parts = []
    for name, documentation in GPU_METRICS:
        if _HEADERS[name] is None:
            _HEADERS[name] = _header(name, documentation)
        parts.append(_HEADERS[name])
        parts.append(_samples(name, labels, values[name][chosen]))
    return "".join(parts).encode()


def gpu_families(shard=None, of=None, datacenter=None) -> list[GaugeMetricFamily]:
    """The same GPU metrics as prometheus-client families (slow at 100k GPUs: for tests)."""
    table = gpu_table()
    chosen = select_gpus(table, shard, of, datacenter)
    values = gpu_values(table)
    snap = topology_cache.current()
    uuids = dict(GPU.objects.values_list("id", "uuid"))
    racks = dict(Rack.objects.values_list("id", "name"))
    chips = {c.name: c.model for c in ChipType.objects.all()}
    out = []
    for name, documentation in GPU_METRICS:
        family = GaugeMetricFamily(name, documentation, labels=list(GPU_LABELS))
        for i in chosen.tolist():
            node = snap.gpu_node[i]
            pod = snap.rack_pod[snap.node_rack[node]]
            family.add_metric(
                [
                    snap.node_hostname[node],
                    uuids[int(snap.gpu_id[i])],
                    snap.names["datacenter"][snap.pod_datacenter[pod]],
                    str(int(snap.gpu_slot[i])),
                    chips.get(snap.chip_names[snap.node_chip[node]], snap.chip_names[snap.node_chip[node]]),
                    snap.names["pod"][pod],
                    racks[int(snap.rack_id[snap.node_rack[node]])],
                ],
                float(values[name][i]),
            )
        out.append(family)
    return out


def series_count(text: bytes) -> int:
    return sum(1 for line in text.split(b"\n") if line and not line.startswith(b"#"))
