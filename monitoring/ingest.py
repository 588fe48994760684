"""Node agents' reports: checked, then applied in one transaction.

A report carries the node's GPUs' newest readings, the XIDs NVML's event set delivered since the
last report, and the states of the job processes the agent runs. Readings go to the live store as
the node's latest values (one entry per node, never a row per GPU per sample); the telemetry frame
the dashboard reads takes them from there (``overlay``). XIDs and health changes (uncorrectable
ECC errors rising, a failed row remap, a GPU NVML lost) become FaultEvents for the production
fault task; process states move the jobs (scheduling.launch). Every report has a sequence number:
one not newer than the last accepted changes nothing. A node silent for AGENT_HEARTBEAT_TIMEOUT_S
gets a ``heartbeat_loss`` fault (``watch``).
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from cluster.models import Node, NodeCredential
from monitoring.livestore import AGENT_REPORTS_KEY, live_store
from monitoring.services import report_fault
from scheduling import launch
from scheduling.choices import ProcessState

# per-GPU readings: name -> (lowest, highest); all optional, numbers
READINGS = {
    "util": (0, 100),
    "memory_used_mib": (0, 1 << 24),
    "memory_total_mib": (0, 1 << 24),
    "temperature_c": (0, 200),
    "power_w": (0, 10_000),
    "power_limit_w": (0, 10_000),
    "sm_clock_mhz": (0, 10_000),
    "ecc_corrected_volatile": (0, 1 << 62),
    "ecc_uncorrected_volatile": (0, 1 << 62),
    "ecc_corrected_aggregate": (0, 1 << 62),
    "ecc_uncorrected_aggregate": (0, 1 << 62),
    "retired_pages": (0, 1 << 31),
    "remapped_rows_correctable": (0, 1 << 31),
    "remapped_rows_uncorrectable": (0, 1 << 31),
    "nvlink_crc_errors": (0, 1 << 62),
    "nvlink_replay_errors": (0, 1 << 62),
    "nvlink_recovery_errors": (0, 1 << 62),
    "pcie_replays": (0, 1 << 62),
}
FLAGS = ("retired_pages_pending", "remap_pending", "remap_failure", "lost")
MAX_XIDS = 256
MAX_PROCESSES = 64


class ReportError(ValueError):
    """A report refused as a whole; ``field`` names what is wrong (nothing was written)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def _number(value, where: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReportError(where, f"must be a number, not {value!r}"[:200])
    if not lo <= value <= hi:
        raise ReportError(where, f"{value} is outside {lo}..{hi}")
    return value


def _int(value, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(where, f"must be a whole number, not {value!r}"[:200])
    if not lo <= value <= hi:
        raise ReportError(where, f"{value} is outside {lo}..{hi}")
    return value


def _list(body: dict, name: str, limit: int) -> list:
    value = body.get(name, [])
    if not isinstance(value, list):
        raise ReportError(name, "must be a list")
    if len(value) > limit:
        raise ReportError(name, f"{len(value)} entries; at most {limit} in one report")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ReportError(f"{name}[{i}]", "must be an object")
    return value


def parse_report(body, node: Node) -> dict:
    """The report, checked against the node; ReportError names the first bad field."""
    if not isinstance(body, dict):
        raise ReportError("body", "a report is a JSON object")
    unknown = set(body) - {"seq", "sent_at", "agent_version", "gpus", "xids", "processes", "dropped"}
    if unknown:
        raise ReportError(sorted(unknown)[0], "unknown field")
    seq = _int(body.get("seq"), "seq", 1, (1 << 63) - 1)
    n = node.gpus_per_node
    gpus, seen = [], set()
    for i, g in enumerate(_list(body, "gpus", n)):
        index = _int(g.get("index"), f"gpus[{i}].index", 0, n - 1)
        if index in seen:
            raise ReportError(f"gpus[{i}].index", f"GPU {index} appears twice")
        seen.add(index)
        reading = {"index": index}
        for key, value in g.items():
            if key in READINGS:
                if value is not None:
                    reading[key] = _number(value, f"gpus[{i}].{key}", *READINGS[key])
            elif key in FLAGS:
                reading[key] = bool(value)
            elif key == "uuid":
                reading[key] = str(value)[:64]
            elif key != "index":
                raise ReportError(f"gpus[{i}].{key}", "unknown reading")
        gpus.append(reading)
    xids = []
    for i, x in enumerate(_list(body, "xids", MAX_XIDS)):
        xids.append(
            {
                "gpu": _int(x.get("gpu"), f"xids[{i}].gpu", 0, n - 1),
                "xid": _int(x.get("xid"), f"xids[{i}].xid", 1, 100_000),
                "at": _number(x.get("at"), f"xids[{i}].at", 0, 1e11),
            }
        )
    processes = [_process(p, i) for i, p in enumerate(_list(body, "processes", MAX_PROCESSES))]
    known = set(launch.Job.objects.filter(pk__in={p["job"] for p in processes}).values_list("pk", flat=True))
    for i, p in enumerate(processes):
        if p["job"] not in known:
            raise ReportError(f"processes[{i}].job", f"no job {p['job']}")
    dropped = _int(body.get("dropped", 0), "dropped", 0, 1 << 62)
    return {
        "seq": seq,
        "gpus": gpus,
        "xids": xids,
        "processes": processes,
        "dropped": dropped,
        "agent_version": str(body.get("agent_version", ""))[:32],
    }


def _process(p: dict, i: int) -> dict:
    where = f"processes[{i}]"
    state = p.get("state")
    if state not in ProcessState.values:
        raise ReportError(f"{where}.state", f"{state!r} is not one of {', '.join(ProcessState.values)}"[:200])
    generation = p.get("generation")
    if not isinstance(generation, str) or not 1 <= len(generation) <= 16:
        raise ReportError(f"{where}.generation", "must be the assignment's generation (1 to 16 characters)")
    out = {
        "job": _int(p.get("job"), f"{where}.job", 1, (1 << 63) - 1),
        "generation": generation,
        "state": state,
    }
    if p.get("pid") is not None:
        out["pid"] = _int(p["pid"], f"{where}.pid", 1, 1 << 31)
    if p.get("exit_code") is not None:
        out["exit_code"] = _int(p["exit_code"], f"{where}.exit_code", -255, 255)
    if state == ProcessState.EXITED and "exit_code" not in out:
        raise ReportError(f"{where}.exit_code", "an exited process needs its exit code")
    for key in ("started_at", "ended_at"):
        if p.get(key) is not None:
            out[key] = _number(p[key], f"{where}.{key}", 0, 1e11)
    if p.get("log_tail") is not None:
        if not isinstance(p["log_tail"], str):
            raise ReportError(f"{where}.log_tail", "must be text")
        out["log_tail"] = p["log_tail"]
    return out


def ingest(credential: NodeCredential, report: dict, now: datetime | None = None) -> dict:
    """Apply a checked report; a duplicate or older sequence number changes nothing."""
    now = now or timezone.now()
    node = credential.node
    store = live_store()
    with transaction.atomic():
        fresh = NodeCredential.objects.filter(
            pk=credential.pk, revoked_at__isnull=True, last_seq__lt=report["seq"]
        ).update(
            last_seq=report["seq"],
            reports_accepted=F("reports_accepted") + 1,
            last_used_at=now,
            heartbeat_lost_at=None,
            agent_version=report["agent_version"],
        )
        if not fresh:
            last = NodeCredential.objects.filter(pk=credential.pk).values_list("last_seq", flat=True).first()
            return {"accepted": False, "seq": report["seq"], "reason": f"not newer than report {last}"}
        previous = store.hget(AGENT_REPORTS_KEY, str(node.pk))
        faults = _faults(node, report, json.loads(previous) if previous else None, now)
        launch.record_processes(node, report["processes"], now)
        entry = json.dumps(
            {"t": now.timestamp(), "seq": report["seq"], "gpus": report["gpus"], "dropped": report["dropped"]}
        ).encode()
        transaction.on_commit(lambda: store.hset(AGENT_REPORTS_KEY, str(node.pk), entry))
    return {"accepted": True, "seq": report["seq"], "faults": faults}


def _faults(node: Node, report: dict, previous: dict | None, now: datetime) -> int:
    """FaultEvents for the report's XIDs and for health changes since the node's last report."""
    found = []
    for x in report["xids"]:
        found.append(({"source": "xid", "xid": x["xid"]}, x["gpu"], _at(x["at"], now), f"XID {x['xid']}"))
    before = {g["index"]: g for g in (previous or {}).get("gpus", [])}
    for g in report["gpus"]:
        old = before.get(g["index"], {})
        problem = None
        if g.get("lost") and not old.get("lost"):
            problem = "NVML lost the GPU (fallen off the bus or not responding)"
        elif g.get("ecc_uncorrected_volatile", 0) > old.get(
            "ecc_uncorrected_volatile", g.get("ecc_uncorrected_volatile", 0)
        ):
            problem = (
                f"uncorrectable ECC errors rose from {old['ecc_uncorrected_volatile']:.0f} "
                f"to {g['ecc_uncorrected_volatile']:.0f}"
            )
        elif g.get("remap_failure") and not old.get("remap_failure"):
            problem = "a row remap failed: the GPU needs a reset"
        if problem:
            found.append(({"source": "health_check"}, g["index"], now, problem))
    if not found:
        return 0
    gpu_ids = launch.gpu_ids_by_index(node)
    for fields, index, at, text in found:
        report_fault(
            gpu_id=gpu_ids[index],
            at=at,
            detected_at=now,
            description=text[:255],
            data={"reported_by": f"node {node.hostname}", "seq": report["seq"], "agent": True},
            **fields,
        )
    return len(found)


def _at(epoch: float, now: datetime) -> datetime:
    return min(datetime.fromtimestamp(epoch, tz=now.tzinfo), now)


# --- the dashboard's frame and the heartbeat ---------------------------------------------------


def latest_reports(store=None) -> dict[int, dict]:
    """Node id -> its newest report entry."""
    store = store or live_store()
    out = {}
    for key, raw in store.hgetall(AGENT_REPORTS_KEY).items():
        try:
            out[int(key)] = json.loads(raw)
        except (ValueError, TypeError):
            continue
    return out


def overlay(frame: dict[str, np.ndarray], snapshot, reports: dict[int, dict], stale_s: float) -> int:
    """Put the agents' newest readings into ``frame`` (arrays over the snapshot's GPUs); readings
    older than ``stale_s`` show as idle. Returns the GPUs written."""
    if not reports:
        return 0
    now = time.time()
    node_index = {int(n): i for i, n in enumerate(snapshot.node_id)}
    written = 0
    for node_id, entry in reports.items():
        ni = node_index.get(node_id)
        if ni is None:
            continue
        gpus = np.flatnonzero(snapshot.gpu_node == ni)
        slot = {int(snapshot.gpu_slot[g]): g for g in gpus}
        fresh = now - entry.get("t", 0) <= stale_s
        for g in entry.get("gpus", []):
            i = slot.get(g["index"])
            if i is None:
                continue
            total = g.get("memory_total_mib") or 0
            limit = g.get("power_limit_w") or 0
            frame["util"][i] = round(g.get("util", 0)) if fresh else 0
            frame["memory"][i] = round(100 * g.get("memory_used_mib", 0) / total) if fresh and total else 0
            frame["temperature"][i] = min(255, round(g.get("temperature_c", 0)))
            frame["power"][i] = min(100, round(100 * g.get("power_w", 0) / limit)) if fresh and limit else 0
            written += 1
    return written


def watch(now: datetime | None = None) -> dict:
    """Heartbeat loss for nodes whose agent went silent, and starts that did not reach every node.
    A node is judged only after this control plane has itself been up for the timeout, so an
    outage of the control plane is not blamed on the nodes."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S)
    cutoff = now - timeout
    lost = []
    if cutoff >= _UP_SINCE:
        silent = (
            NodeCredential.objects.filter(
                revoked_at__isnull=True, heartbeat_lost_at__isnull=True, created_at__lte=cutoff
            )
            .exclude(last_used_at__gt=cutoff)
            .select_related("node")
        )
        for credential in silent:
            with transaction.atomic():
                took = NodeCredential.objects.filter(pk=credential.pk, heartbeat_lost_at__isnull=True).update(
                    heartbeat_lost_at=now
                )
                if not took:
                    continue
                last = credential.last_used_at
                report_fault(
                    node=credential.node,
                    source="heartbeat_loss",
                    at=last or credential.created_at,
                    detected_at=now,
                    description=f"no report from the agent for {timeout.total_seconds():.0f} s",
                    data={"agent": True, "last_report": last.isoformat() if last else None},
                )
                lost.append(credential.node.hostname)
    stopped = launch.check_launches(now)
    return {"heartbeat_lost": lost, "starts_given_up": stopped}


_UP_SINCE = timezone.now()


def compose_frame() -> int:
    """Without a simulated fleet, the telemetry frame is the agents' readings (idle elsewhere),
    written every watch interval; returns the GPUs that have an agent's readings."""
    if settings.SIMULATED_FLEET:
        return 0  # the fleet's tick overlays the agents' readings on its own frame
    from cluster.snapshot import topology_cache
    from engine.frames import FRAME_METRICS, decode_frame, encode_frame
    from monitoring.fleet_driver import publish_frame
    from monitoring.livestore import FRAME_KEY

    store = live_store()
    reports = latest_reports(store)
    if not reports:
        return 0
    snapshot = topology_cache.current()
    frame = {m: np.zeros(snapshot.num_gpus, dtype=np.uint8) for m in FRAME_METRICS}
    frame["health"] = snapshot.gpu_health.astype(np.uint8)
    written = overlay(frame, snapshot, reports, stale_s=3 * settings.AGENT_HEARTBEAT_TIMEOUT_S)
    previous = store.get(FRAME_KEY)
    seq = 1
    if previous:
        try:
            seq = decode_frame(previous)[0] + 1
        except ValueError:
            previous = None
    encoded = encode_frame(seq, time.time(), frame)
    store.put(FRAME_KEY, encoded)
    publish_frame(previous, encoded)
    return written
