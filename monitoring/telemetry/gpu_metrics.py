"""Every GPU's metrics with dcgm-exporter's names and labels (``/metrics/gpus``), read at scrape
time from the topology snapshot, the newest telemetry frame, the agents' newest readings and the
open XID faults: no row or sample is stored per GPU.

At 100k GPUs these are 800,000 samples, which prometheus-client's ``generate_latest`` writes at
about 27 us each (20 s). ``gpu_exposition`` writes the same text byte for byte (a test compares
it with ``generate_latest`` over ``gpu_families``): each GPU's label set is built once per
topology and shared by its eight samples, and each distinct value is formatted once, by
prometheus-client's own ``floatToGoString``; it is written in pieces that the response streams.
A scrape takes a shard (a contiguous range of nodes,
so a node's GPUs stay together) or one datacenter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from cluster.agents import agent_node_ids
from cluster.models import GPU, ChipType, Rack
from cluster.snapshot import topology_cache
from engine.frames import decode_frame
from monitoring.models import FaultEvent
from monitoring.telemetry.ingest import gpu_grid, latest_reports
from monitoring.telemetry.livestore import newest_frame

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

    snap = snap or topology_cache.current()
    n = snap.num_gpus
    util = np.zeros(n)
    temp = np.zeros(n)
    power_pct = np.zeros(n)
    memory_pct = np.zeros(n)
    data = newest_frame()
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

    reports = latest_reports(agent_node_ids())
    if reports:
        node_index, where = gpu_grid(snap)
        slots = where.shape[1]
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


CHUNK_GPUS = 8192  # GPUs per piece of a scrape: about 1.5 MB of text for one metric


def gpu_exposition(
    shard: int | None = None, of: int | None = None, datacenter: str | None = None
) -> Iterator[bytes]:
    """The GPU metrics of one shard in Prometheus' text format, as ``generate_latest`` writes it, in
    pieces of CHUNK_GPUS GPUs, for a response that streams them: at 100k GPUs the text is 145 MB,
    and built whole (the samples' strings, their join, its encoding) it took 750 MB of a web
    process. The values are read here, from the database and the live store; the pieces are only
    formatted as they are asked for."""
    table = gpu_table()
    chosen = select_gpus(table, shard, of, datacenter)
    return _pieces(table.labels, chosen, gpu_values(table))


def _pieces(labels: list[str], chosen: np.ndarray, values: dict[str, np.ndarray]) -> Iterator[bytes]:
    for name, documentation in GPU_METRICS:
        if _HEADERS[name] is None:
            _HEADERS[name] = _header(name, documentation)
        yield _HEADERS[name].encode()
        column = values[name]
        for start in range(0, len(chosen), CHUNK_GPUS):
            part = chosen[start : start + CHUNK_GPUS]
            yield _samples(name, [labels[i] for i in part.tolist()], column[part]).encode()


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
