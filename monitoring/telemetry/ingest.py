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

import contextlib
import time
from datetime import datetime, timedelta

import numpy as np
import orjson
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cluster.agents import UNKNOWN_CREDENTIAL, agent_node_ids
from cluster.fields import FieldError
from cluster.models import Node, NodeCredential
from cluster.snapshot import topology_cache
from engine.frames import FRAME_METRICS, decode_frame, encode_frame
from monitoring.faults import partitions
from monitoring.faults.services import report_fault
from monitoring.telemetry import congestion, efficiency, fabric, netreports
from monitoring.telemetry.identities import forget, revoked
from monitoring.telemetry.livestore import AGENT_REPORT_PREFIX, FRAME_KEY, live_store
from scheduling import launch
from scheduling.trigger import request_cycle

_UP_SINCE = timezone.now()  # nodes are judged silent only once this process has been up as long


def _accept(batch: list[tuple], now: datetime) -> set[int]:
    """The credentials whose report in ``batch`` ((identity, report) pairs, one per credential)
    became their newest: newer than the last accepted and the credential still live. One
    statement for the whole batch, so concurrent duplicates cannot both pass and a thousand
    reports a second cost a few statements, not a thousand."""
    table = NodeCredential._meta.db_table
    values = ", ".join(["(CAST(%s AS BIGINT), CAST(%s AS BIGINT), %s)"] * len(batch))
    sql = (
        f"WITH v(id, seq, version) AS (VALUES {values}) "
        f"UPDATE {table} SET last_seq = v.seq, reports_accepted = {table}.reports_accepted + 1, "
        f"last_used_at = %s, heartbeat_lost_at = NULL, agent_version = v.version FROM v "
        f"WHERE {table}.id = v.id AND {table}.revoked_at IS NULL AND {table}.last_seq < v.seq "
        f"RETURNING {table}.id"
    )
    params = [
        x
        for identity, report in batch
        for x in (identity.credential_id, report["seq"], report["agent_version"])
    ]
    params.append(connection.ops.adapt_datetimefield_value(now))
    connection.ensure_connection()
    if connection.vendor == "postgresql":  # the driver's own cursor: server-side parameters
        import psycopg

        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def _not_accepted(identity, report: dict) -> dict:
    row = (
        NodeCredential.objects.filter(pk=identity.credential_id).values_list("last_seq", "revoked_at").first()
    )
    if row is None:  # the node was removed from the inventory
        forget(identity)
        return {"detail": UNKNOWN_CREDENTIAL, "status": 401}
    last, revoked_at = row
    if revoked_at is not None:
        forget(identity)
        return revoked().payload | {"status": 401}
    return {"accepted": False, "seq": report["seq"], "reason": f"not newer than report {last}"}


def _entry(report: dict, now: datetime) -> bytes:
    return orjson.dumps(
        {
            "t": now.timestamp(),
            "seq": report["seq"],
            "gpus": report["gpus"],
            "progress": report.get("progress", []),
            "sent_at": report.get("sent_at") or now.timestamp(),
            "dropped": report["dropped"],
            "net": report["net"]["ports"] if report.get("net") else None,
            "fabric": netreports.fabric_row(report["net"]["ports"]) if report.get("net") else None,
        }
    )


def ingest(identity, report: dict, now: datetime | None = None) -> dict:
    """Apply one checked report; one with XIDs or process states is accepted in the same
    transaction as what they cause."""
    heavy = bool(report["xids"] or report["processes"] or (report.get("net") or {}).get("inventory"))
    with transaction.atomic() if heavy else contextlib.nullcontext():
        return ingest_many([(identity, report)], now)[0]


def ingest_many(batch: list[tuple], now: datetime | None = None) -> list[dict]:
    """Apply checked reports ((identity, report) pairs): one statement accepts them, one
    live-store round trip writes their readings and returns each node's previous ones; XIDs,
    process states and health changes since those readings (rare) are applied report by report.
    A duplicate or older sequence number changes nothing. Answers in the order given."""
    now = now or timezone.now()
    store = live_store()
    answers: list[dict | None] = [None] * len(batch)
    refused = _counters_backward(batch, store)
    for i, error in refused.items():
        answers[i] = {"status": 400, error.field: [error.message]}
    batch_all, batch = batch, [b if i not in refused else None for i, b in enumerate(batch)]
    newest: dict[int, int] = {}  # a credential twice in one batch: only its newest report can pass
    for i, item in enumerate(batch):
        if item is None:
            continue
        identity, report = item
        j = newest.get(identity.credential_id)
        if j is None or batch[j][1]["seq"] < report["seq"]:
            newest[identity.credential_id] = i
    accepted = _accept([batch[i] for i in newest.values()], now) if newest else set()
    passed = [i for i in newest.values() if batch[i][0].credential_id in accepted]
    previous = store.swap_many(
        [AGENT_REPORT_PREFIX + str(batch[i][0].node_id) for i in passed],
        [_entry(batch[i][1], now) for i in passed],
    )
    for i, old in zip(passed, previous, strict=True):
        identity, report = batch[i]
        previous_entry = orjson.loads(old) if old else None  # parsed once for both checks
        health = _health(report, previous_entry)
        faults = 0
        inventory = (report.get("net") or {}).get("inventory")
        ports = netreports.port_faults(identity.node_id, report, previous_entry, store)
        if health or report["xids"] or report["processes"] or inventory or ports:
            with transaction.atomic():
                if inventory is not None:
                    netreports.set_ports(identity.node_id, inventory)
                node = Node.objects.get(pk=identity.node_id)
                faults = _faults(node, report, health, now, ports)
                launch.record_processes(node, report["processes"], now)
        answers[i] = {"accepted": True, "seq": report["seq"], "faults": faults}
    for i, answer in enumerate(answers):
        if answer is None:
            answers[i] = _not_accepted(*batch_all[i])
    return answers


def _counters_backward(batch: list[tuple], store) -> dict[int, FieldError]:
    """The reports in ``batch`` whose ports' counters fell below the node's previous report
    without a reset: refused before anything is written (one live-store read for the batch)."""
    with_net = [i for i, (_, report) in enumerate(batch) if report.get("net") and report["net"]["ports"]]
    if not with_net:
        return {}
    olds = store.get_many([AGENT_REPORT_PREFIX + str(batch[i][0].node_id) for i in with_net])
    refused = {}
    for i, old in zip(with_net, olds, strict=True):
        entry = orjson.loads(old) if old else {}
        if entry.get("seq", 0) >= batch[i][1]["seq"]:
            continue  # not newer: it changes nothing anyway
        previous = entry.get("net")
        try:
            netreports.check_counters(batch[i][1]["net"], {"ports": previous} if previous else None)
        except FieldError as exc:
            refused[i] = exc
    return refused


def _health(report: dict, previous: dict | None) -> list[tuple[int, str]]:
    """(GPU index, problem) for each health change since the node's last report."""
    before = {g["index"]: g for g in (previous or {}).get("gpus", [])}
    found = []
    for g in report["gpus"]:
        old = before.get(g["index"], {})
        ecc, old_ecc = g.get("ecc_uncorrected_volatile", 0), old.get("ecc_uncorrected_volatile")
        if g.get("lost") and not old.get("lost"):
            found.append((g["index"], "NVML lost the GPU (fallen off the bus or not responding)"))
        elif old_ecc is not None and ecc > old_ecc:
            found.append((g["index"], f"uncorrectable ECC errors rose from {old_ecc:.0f} to {ecc:.0f}"))
        elif g.get("remap_failure") and not old.get("remap_failure"):
            found.append((g["index"], "a row remap failed: the GPU needs a reset"))
    return found


def _faults(node: Node, report: dict, health: list, now: datetime, ports: list | None = None) -> int:
    """FaultEvents for the report's XIDs, health changes and NIC port faults (on the node), for
    the production fault task."""
    for source, at, text, port in ports or []:
        report_fault(
            node=node,
            at=launch.agent_time(at, now),
            detected_at=now,
            source=source,
            description=text[:255],
            data={"reported_by": f"node {node.hostname}", "seq": report["seq"], "agent": True, "port": port},
        )
    found = [
        ({"source": "xid", "xid": x["xid"]}, x["gpu"], launch.agent_time(x["at"], now), f"XID {x['xid']}")
        for x in report["xids"]
    ]
    found += [({"source": "health_check"}, index, now, problem) for index, problem in health]
    if not found:
        return len(ports or [])
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
    return len(found) + len(ports or [])


# --- the dashboard's frame and the heartbeat ---------------------------------------------------


def latest_reports(node_ids, store=None) -> dict[int, dict]:
    """Node id -> its newest report entry, for the nodes that have one."""
    store = store or live_store()
    ids = [int(n) for n in node_ids]
    out = {}
    for node_id, raw in zip(ids, store.get_many([AGENT_REPORT_PREFIX + str(n) for n in ids]), strict=True):
        if raw:
            try:
                out[node_id] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
    return out


def clear_reports() -> None:
    """Forget every node's newest report, its ports' flap history and recorded trace."""
    store = live_store()
    for prefix in (AGENT_REPORT_PREFIX, *netreports.PREFIXES):
        store.delete_prefix(prefix)


def gpu_grid(snapshot) -> tuple[dict[int, int], np.ndarray]:
    """{node id: node index} and the (node index, slot) -> GPU index array (-1: no such GPU), to
    place a node's reported GPUs by their index on the node."""
    node_index = {int(n): i for i, n in enumerate(snapshot.node_id)}
    slots = int(snapshot.gpu_slot.max()) + 1 if snapshot.num_gpus else 0
    where = np.full((len(snapshot.node_id), slots), -1, dtype=np.int64)
    where[snapshot.gpu_node, snapshot.gpu_slot] = np.arange(snapshot.num_gpus)
    return node_index, where


def overlay(frame: dict[str, np.ndarray], snapshot, reports: dict[int, dict], stale_s: float) -> int:
    """Put the agents' newest readings into ``frame`` (arrays over the snapshot's GPUs); readings
    older than ``stale_s`` show as idle. One pass over the readings, then array writes: a
    100k-GPU frame never loops over the snapshot per node. Returns the GPUs written."""
    if not reports:
        return 0
    now = time.time()
    node_index, where = gpu_grid(snapshot)
    slots = where.shape[1]
    at, util, memory, temperature, power = [], [], [], [], []
    for node_id, entry in reports.items():
        ni = node_index.get(node_id)
        if ni is None:
            continue
        fresh = now - entry.get("t", 0) <= stale_s
        for g in entry.get("gpus", []):
            if g["index"] >= slots:
                continue
            total = g.get("memory_total_mib") or 0
            limit = g.get("power_limit_w") or 0
            at.append((ni, g["index"]))
            util.append(round(g.get("util", 0)) if fresh else 0)
            memory.append(round(100 * g.get("memory_used_mib", 0) / total) if fresh and total else 0)
            temperature.append(min(255, round(g.get("temperature_c", 0))))
            power.append(min(100, round(100 * g.get("power_w", 0) / limit)) if fresh and limit else 0)
    if not at:
        return 0
    pairs = np.array(at, dtype=np.int64)
    gpus = where[pairs[:, 0], pairs[:, 1]]
    known = gpus >= 0
    for name, values in (("util", util), ("memory", memory), ("temperature", temperature), ("power", power)):
        frame[name][gpus[known]] = np.asarray(values, dtype=np.uint8)[known]
    return int(known.sum())


def overlay_agents(frame: dict[str, np.ndarray], snapshot, store=None, reports=None) -> int:
    """The readings of every node with an agent put into ``frame`` (the simulated fleet's tick
    and ``compose_frame`` both write frames this way); ``reports``: those already read."""
    reports = latest_reports(agent_node_ids(), store) if reports is None else reports
    return overlay(frame, snapshot, reports, stale_s=stale_s())


def stale_s() -> float:
    """Readings older than this show as idle (three missed heartbeats)."""
    return 3 * settings.AGENT_HEARTBEAT_TIMEOUT_S


def watch(now: datetime | None = None) -> dict:
    """Heartbeat loss for nodes whose agent went silent (a whole datacenter silent: a partition),
    and starts that did not reach every node.
    A node is judged only after this control plane has itself been up for the timeout, so an
    outage of the control plane is not blamed on the nodes."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S)
    cutoff = now - timeout
    lost, opened, closed = [], [], []
    if cutoff >= _UP_SINCE:
        # a whole datacenter silent is one partition, not a fault per node (monitoring.faults.partitions)
        hold, opened, closed = partitions.follow(now, timeout)
        if opened or closed:
            request_cycle()
        silent = (
            NodeCredential.objects.filter(
                revoked_at__isnull=True, heartbeat_lost_at__isnull=True, created_at__lte=cutoff
            )
            .exclude(last_used_at__gt=cutoff)
            .exclude(node__rack__pod__datacenter_id__in=hold)
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
    return {
        "heartbeat_lost": lost,
        "starts_given_up": stopped,
        "partitions_opened": opened,
        "partitions_closed": closed,
    }


def compose_frame() -> int:
    """Without a simulated fleet, the telemetry frame is the agents' readings (idle elsewhere),
    written every watch interval; returns the GPUs that have an agent's readings."""
    if settings.SIMULATED_FLEET:
        return 0  # the fleet's tick overlays the agents' readings on its own frame

    store = live_store()
    snapshot = topology_cache.current()
    frame = {m: np.zeros(snapshot.num_gpus, dtype=np.uint8) for m in FRAME_METRICS}
    frame["health"] = snapshot.gpu_health.astype(np.uint8)
    reports = latest_reports(agent_node_ids(), store)
    written = overlay_agents(frame, snapshot, store, reports)
    ports = fabric.ports_from_reports(snapshot, reports, stale_s())
    if len(ports):
        congestion.follow(fabric.publish(snapshot, ports, "agents", store), store)
    if not written:
        return 0
    previous = store.get(FRAME_KEY)
    seq = 1
    if previous:
        try:
            seq = decode_frame(previous)[0] + 1
        except ValueError:
            previous = None
    t = time.time()
    efficiency.record_frame(store, previous, encode_frame(seq, t, frame), frame, t)
    return written
