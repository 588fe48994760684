"""A node agent's report, from raw bytes to an answer: the credential, the body, every field
checked (a refused report writes nothing and names the field), then ``monitoring.telemetry.ingest``.

``handle_report`` is the endpoint's whole behaviour. The API view calls it, and the ASGI server
calls it directly (``monitoring.telemetry.agent_asgi``) so the hot path skips Django's request
cycle: the agents of a 100k-GPU cluster send 1,250 reports a second. Who the credential is comes
from ``monitoring.telemetry.identities``.
"""

from __future__ import annotations

import orjson
from django.conf import settings

from cluster.fields import FieldError, number, objects, whole
from monitoring.telemetry import netreports
from monitoring.telemetry.identities import Refused, identity_for
from monitoring.telemetry.ingest import ingest
from scheduling.choices import ProcessState
from scheduling.models import Job

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
    "nvlink_tx_bytes": (0, 1 << 63),
    "nvlink_rx_bytes": (0, 1 << 63),
    "nvlink_tx_gbps": (0, 100_000),
    "nvlink_rx_gbps": (0, 100_000),
}
_NUMBER_TYPES = (int, float)
FLAGS = ("retired_pages_pending", "remap_pending", "remap_failure", "lost")
MAX_XIDS = 256
MAX_PROCESSES = 64
MAX_RECENT_STEPS = 16


def _list(body: dict, name: str, limit: int) -> list:
    return objects(body.get(name, []), name, limit)


class NeedsDatabase(Exception):
    """Checking this report needs the database (the node's port list is not known here yet)."""


def parse_report(body, gpus_per_node: int, node_id: int | None = None, db: bool = True) -> dict:
    """The report, checked against the node; FieldError names the first bad field. With
    ``db=False`` NeedsDatabase when the check would read the database."""
    if not isinstance(body, dict):
        raise FieldError("body", "a report is a JSON object")
    unknown = set(body) - {
        "seq",
        "sent_at",
        "agent_version",
        "gpus",
        "xids",
        "processes",
        "progress",
        "dropped",
        "net",
    }
    if unknown:
        raise FieldError(sorted(unknown)[0], "unknown field")
    seq = whole(body.get("seq"), "seq", 1, (1 << 63) - 1)
    n = gpus_per_node
    gpus, seen = [], set()
    for i, g in enumerate(_list(body, "gpus", n)):
        index = whole(g.get("index"), f"gpus[{i}].index", 0, n - 1)
        if index in seen:
            raise FieldError(f"gpus[{i}].index", f"GPU {index} appears twice")
        seen.add(index)
        clean = True  # nearly always: the reading is kept as sent, no copy made
        for key, value in g.items():
            bounds = READINGS.get(key)
            if bounds is not None:
                # the common case without a call per reading (1,250 reports of 8 GPUs a second);
                # NaN and infinities fail the comparison and get the full check's message
                if type(value) in _NUMBER_TYPES and bounds[0] <= value <= bounds[1]:
                    continue
                if value is None:
                    clean = False
                else:
                    number(value, f"gpus[{i}].{key}", *bounds)
            elif key in FLAGS:
                clean = clean and type(value) is bool
            elif key == "uuid":
                clean = clean and type(value) is str and len(value) <= 64
            elif key != "index":
                raise FieldError(f"gpus[{i}].{key}", "unknown reading")
        gpus.append(g if clean else _normalized(g))
    xids = []
    for i, x in enumerate(_list(body, "xids", MAX_XIDS)):
        xids.append(
            {
                "gpu": whole(x.get("gpu"), f"xids[{i}].gpu", 0, n - 1),
                "xid": whole(x.get("xid"), f"xids[{i}].xid", 1, 100_000),
                "at": number(x.get("at"), f"xids[{i}].at", 0, 1e11),
            }
        )
    processes = [_process(p, i) for i, p in enumerate(_list(body, "processes", MAX_PROCESSES))]
    wanted = {p["job"] for p in processes}
    known = set(Job.objects.filter(pk__in=wanted).values_list("pk", flat=True)) if wanted else set()
    for i, p in enumerate(processes):
        if p["job"] not in known:
            raise FieldError(f"processes[{i}].job", f"no job {p['job']}")
    dropped = whole(body.get("dropped", 0), "dropped", 0, 1 << 62)
    net = None
    if body.get("net") is not None:
        net = _net(body["net"], node_id, db)
    return {
        "net": net,
        "seq": seq,
        "gpus": gpus,
        "xids": xids,
        "processes": processes,
        "progress": [_progress(p, i) for i, p in enumerate(_list(body, "progress", MAX_PROCESSES))],
        "sent_at": number(body.get("sent_at", 0), "sent_at", 0, 1e11),
        "dropped": dropped,
        "agent_version": str(body.get("agent_version", ""))[:32],
    }


def _net(value, node_id: int | None, db: bool) -> dict:
    def node_ports() -> frozenset[str]:
        if node_id is None:
            return frozenset()
        if not db:
            raise NeedsDatabase
        return netreports.read_ports(node_id)

    if not db and isinstance(value, dict) and "inventory" in value:
        raise NeedsDatabase  # the port list is written in the report's transaction
    known = netreports.known_ports(node_id) if node_id is not None else None
    return netreports.parse_net(value, known, node_ports)


def _normalized(g: dict) -> dict:
    """A checked reading with empty values left out, flags as booleans, the UUID as short text."""
    out = {}
    for key, value in g.items():
        if key in FLAGS:
            out[key] = bool(value)
        elif key == "uuid":
            out[key] = str(value)[:64]
        elif value is not None:
            out[key] = value
    return out


def _progress(p: dict, i: int) -> dict:
    """One rank's progress (engine.progress): a reading, kept with the node's latest report."""
    where = f"progress[{i}]"
    generation = p.get("generation")
    if not isinstance(generation, str) or not 1 <= len(generation) <= 16:
        raise FieldError(f"{where}.generation", "must be the assignment's generation (1 to 16 characters)")
    recent = p.get("recent", [])
    if not isinstance(recent, list) or len(recent) > MAX_RECENT_STEPS:
        raise FieldError(f"{where}.recent", f"must be a list of at most {MAX_RECENT_STEPS} compute times")
    return {
        "job": whole(p.get("job"), f"{where}.job", 1, (1 << 63) - 1),
        "generation": generation,
        "step": whole(p.get("step"), f"{where}.step", 0, 1 << 62),
        "step_at": number(p.get("step_at"), f"{where}.step_at", 0, 1e11),
        "recent": [number(v, f"{where}.recent[{j}]", 0, 1e6) for j, v in enumerate(recent)],
    }


def _process(p: dict, i: int) -> dict:
    where = f"processes[{i}]"
    state = p.get("state")
    if state not in ProcessState.values:
        raise FieldError(f"{where}.state", f"{state!r} is not one of {', '.join(ProcessState.values)}"[:200])
    generation = p.get("generation")
    if not isinstance(generation, str) or not 1 <= len(generation) <= 16:
        raise FieldError(f"{where}.generation", "must be the assignment's generation (1 to 16 characters)")
    out = {
        "job": whole(p.get("job"), f"{where}.job", 1, (1 << 63) - 1),
        "generation": generation,
        "state": state,
    }
    if p.get("pid") is not None:
        out["pid"] = whole(p["pid"], f"{where}.pid", 1, 1 << 31)
    if p.get("exit_code") is not None:
        out["exit_code"] = whole(p["exit_code"], f"{where}.exit_code", -255, 255)
    if state == ProcessState.EXITED and "exit_code" not in out:
        raise FieldError(f"{where}.exit_code", "an exited process needs its exit code")
    for key in ("started_at", "ended_at"):
        if p.get(key) is not None:
            out[key] = number(p[key], f"{where}.{key}", 0, 1e11)
    adopted = p.get("adopted_from")
    if adopted is not None:
        if not isinstance(adopted, str) or not 1 <= len(adopted) <= 16:
            raise FieldError(f"{where}.adopted_from", "must be the generation the process ran under")
        out["adopted_from"] = adopted
    if p.get("log_tail") is not None:
        if not isinstance(p["log_tail"], str):
            raise FieldError(f"{where}.log_tail", "must be text")
        out["log_tail"] = p["log_tail"]
    return out


def decode_body(raw: bytes) -> dict:
    if len(raw) > settings.AGENT_REPORT_MAX_BYTES:
        raise Refused(
            413, {"body": [f"the report is {len(raw)} bytes; the limit is {settings.AGENT_REPORT_MAX_BYTES}"]}
        )
    try:
        return orjson.loads(raw or b"null")
    except orjson.JSONDecodeError as exc:
        raise Refused(400, {"body": [f"not JSON ({exc})"]}) from exc


def handle_report(authorization: str, raw: bytes) -> tuple[int, dict]:
    """(status, answer) for one report: 200 with whether it was accepted, or the refusal."""

    step = prepare(authorization, raw)
    if step[0] == "answer":
        return step[1], step[2]
    return answer(ingest(step[1], step[2]))


def prepare(authorization: str, raw: bytes, db: bool = True) -> tuple:
    """A report checked: ("answer", status, body) when it is refused or (``db``) applied whole,
    ("readings", identity, report) when it carries readings only, for ``ingest_many``. With
    ``db=False`` (the server's event loop) None when going on would need the database."""

    try:
        identity = identity_for(authorization, db)
        if identity is None:
            return None
        body = decode_body(raw)
        if not db and isinstance(body, dict) and (body.get("xids") or body.get("processes")):
            return None
        try:
            report = parse_report(body, identity.gpus_per_node, identity.node_id, db)
        except NeedsDatabase:
            return None
        if report["xids"] or report["processes"] or (report["net"] and report["net"]["inventory"]):
            return ("answer", *answer(ingest(identity, report)))
        return ("readings", identity, report)
    except FieldError as exc:
        return ("answer", 400, {exc.field: [exc.message]})
    except Refused as exc:
        return ("answer", exc.status, exc.payload)


def answer(result: dict) -> tuple[int, dict]:
    """(status, body) for an ingest result: a credential revoked since it was read is a 401."""
    status = result.pop("status", 200)
    return status, result
