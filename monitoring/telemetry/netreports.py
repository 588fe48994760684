"""The network part of a node's report: its ports' summaries of 10 ms samples, and the port list.

The agent (``myriad_agent.network``) defines what a port's summary holds; this module checks one
against the node: every port named must be one of the node's (the list the agent sent at
enrolment or in this report's ``inventory``), every figure a number in its range, and no
cumulative counter may fall below the node's previous report unless the port says ``reset``.
A refused report names the field and writes nothing. The summaries are kept with the node's
newest report in the live store (never a row per port per report); the port list is the
inventory (``cluster.models.NicPort``).
"""

from __future__ import annotations

import time

import orjson
from django.conf import settings
from django.db import transaction

from cluster import ports
from cluster.fields import FieldError, number, objects, whole
from cluster.models import NicPort
from myriad_agent.nics import CONGESTION, ERROR_COUNTERS, ETH_COUNTERS, IB_COUNTERS, STATE_NAMES

MAX_FLAPS = 6000  # one per 10 ms window of a minute
COUNTERS = frozenset(name for name, *_ in IB_COUNTERS + ETH_COUNTERS)
ERRORS = frozenset(ERROR_COUNTERS)
STATES = frozenset(STATE_NAMES.values()) | {"unknown"}
UTIL = ("mean", "p50", "p99", "max")
WHOLE = ("tx_bytes", "rx_bytes", "windows", "bursts")
RATES = tuple(CONGESTION.values())
FIELDS = frozenset(
    {
        "port",
        "rail",
        "seconds",
        "state",
        "rate_gbps",
        "counters",
        "util",
        "xmit_wait_share",
        "errors",
        "flaps",
    }
    | {"reset"}
    | set(WHOLE)
    | set(RATES)
)
_TOP = (1 << 64) - 1


def _whole(value, where: str) -> int:
    return whole(value, where, 0, _TOP)


def parse_net(value, known: frozenset[str] | None, node_ports) -> dict:
    """The report's ``net`` object checked. ``known``: the node's port names (None: not read
    yet; ``node_ports()`` reads them, only when a name is not in ``known``)."""
    where = "net"
    if not isinstance(value, dict):
        raise FieldError(where, "must be an object with the ports' summaries")
    unknown = set(value) - {"ports", "inventory"}
    if unknown:
        raise FieldError(f"net.{sorted(unknown)[0]}", "unknown field")
    inventory = None
    if "inventory" in value:
        try:
            inventory = ports.parse_inventory(value["inventory"])
        except FieldError as exc:
            raise FieldError(exc.field.replace("ports", "net.inventory", 1), exc.message) from None
        known = frozenset(p["name"] for p in inventory)
    out, seen = [], set()
    for i, p in enumerate(objects(value.get("ports", []), "net.ports", ports.MAX_PORTS)):
        where = f"net.ports[{i}]"
        name = p.get("port")
        if not isinstance(name, str):
            raise FieldError(f"{where}.port", "must be the port's name")
        if known is None or name not in known:
            known = node_ports() if inventory is None else known
            if name not in known:
                listed = ", ".join(sorted(known)) or "none"
                raise FieldError(
                    f"{where}.port", f"the node has no port {name!r} (its ports: {listed})"[:200]
                )
        if name in seen:
            raise FieldError(f"{where}.port", f"port {name!r} appears twice")
        seen.add(name)
        out.append(_summary(p, where))
    return {"ports": out, "inventory": inventory}


# a summary's numbers: name -> (lowest, highest, whole number only)
NUMBERS = {
    **{key: (0, _TOP, True) for key in WHOLE},
    **{key: (0, 1e12, False) for key in RATES},
    "rate_gbps": (0, 10_000, False),
    "rail": (0, 255, True),
    "seconds": (0, 86_400, False),
    "xmit_wait_share": (0, 1, False),
}
_PLAIN = (int, float)


def _summary(p: dict, where: str) -> dict:
    """One port's summary checked. The common case costs a type test and a comparison per figure
    (1,250 reports of eight ports a second); anything else gets the full check and its message."""
    for key, value in p.items():
        bounds = NUMBERS.get(key)
        if bounds is not None:
            lo, hi, whole_only = bounds
            kind = type(value)
            if (kind is int or (kind is float and not whole_only)) and lo <= value <= hi:
                continue
            if whole_only:
                whole(value, f"{where}.{key}", lo, hi)
            else:
                number(value, f"{where}.{key}", lo, hi)
        elif key not in FIELDS:
            raise FieldError(f"{where}.{key}", "unknown field")
    if p.get("state", "unknown") not in STATES:
        raise FieldError(f"{where}.state", f"{p.get('state')!r} is not a port state"[:200])
    util = p.get("util")
    if util is not None:
        if not isinstance(util, dict) or set(util) - set(UTIL):
            raise FieldError(f"{where}.util", f"must be an object of {', '.join(UTIL)}")
        for key, v in util.items():
            if type(v) not in _PLAIN or not 0 <= v <= 100:
                number(v, f"{where}.util.{key}", 0, 100)
    for field, names in (("counters", COUNTERS), ("errors", ERRORS)):
        block = p.get(field, {})
        if not isinstance(block, dict):
            raise FieldError(f"{where}.{field}", "must be an object of counter values")
        for key, v in block.items():
            if type(v) is int and 0 <= v <= _TOP and key in names:
                continue
            if key not in names:
                raise FieldError(f"{where}.{field}.{key}", "unknown counter")
            _whole(v, f"{where}.{field}.{key}")
    flaps = p.get("flaps", [])
    if not isinstance(flaps, list) or len(flaps) > MAX_FLAPS:
        raise FieldError(f"{where}.flaps", f"must be a list of at most {MAX_FLAPS} times")
    for j, t in enumerate(flaps):
        if type(t) not in _PLAIN or not 0 <= t <= 1e11:
            number(t, f"{where}.flaps[{j}]", 0, 1e11)
    if type(p.get("reset", False)) is not bool:
        raise FieldError(f"{where}.reset", "must be true or false")
    return p


def check_counters(net: dict, previous: dict | None) -> None:
    """No cumulative counter of a port falls below the node's previous report unless the port
    says it was reset (or wrapped) in between."""
    if not previous:
        return
    before = {p["port"]: p.get("counters", {}) for p in previous.get("ports", [])}
    for i, p in enumerate(net["ports"]):
        old = before.get(p["port"])
        if not old or p.get("reset"):
            continue
        for key, value in p.get("counters", {}).items():
            if key in old and value < old[key]:
                raise FieldError(
                    f"net.ports[{i}].counters.{key}",
                    f"went back from {old[key]} to {value} without reset: true",
                )


# --- the port names a node has, as last read or written by this process -----------------------

_known: dict[int, frozenset[str]] = {}


def known_ports(node_id: int) -> frozenset[str] | None:
    return _known.get(node_id)


_loaded = {"all": False}


def read_ports(node_id: int) -> frozenset[str]:
    """The node's port names from the inventory. The first call in a process reads every node's
    at once (one query, not one per node as each agent's first report comes in after a restart)."""
    if not _loaded["all"]:
        ports: dict[int, set[str]] = {}
        for node, name in NicPort.objects.values_list("node_id", "name").iterator(chunk_size=20_000):
            ports.setdefault(node, set()).add(name)
        for node, names in ports.items():
            _known.setdefault(node, frozenset(names))
        _loaded["all"] = True
        if node_id in _known:
            return _known[node_id]
    names = frozenset(NicPort.objects.filter(node_id=node_id).values_list("name", flat=True))
    _known[node_id] = names
    return names


def set_ports(node_id: int, inventory: list[dict]) -> bool:
    changed = ports.set_ports(node_id, inventory)
    names = frozenset(p["name"] for p in inventory)
    transaction.on_commit(lambda: _known.__setitem__(node_id, names))
    return changed


# --- port faults ------------------------------------------------------------------------------

FLAPS_PREFIX = "myriad:net:flaps:"  # + node id: {port: [flap times within the last hour]}
HOUR_S = 3600.0


def port_faults(
    node_id: int, report: dict, previous: dict | None, store
) -> list[tuple[str, float, str, str]]:
    """(source, at, description, port) of the NIC port faults a report shows: a port that went
    down since the node's previous report (``nic_port_down``), a port whose link went down
    NIC_FLAPS_PER_HOUR times within an hour (``nic_link_flap``; its count starts again after).
    Flap times are kept per node in the live store, read only when a report has flaps."""
    net = report.get("net")
    if not net or not net["ports"]:
        return []
    found = []
    before = {p["port"]: p.get("state") for p in (previous or {}).get("net") or []}
    sent_at = report.get("sent_at") or time.time()
    for p in net["ports"]:
        if p.get("state") == "down" and before.get(p["port"]) != "down":
            found.append(("nic_port_down", sent_at, f"port {p['port']} went down", p["port"]))
    flapping = {p["port"]: p["flaps"] for p in net["ports"] if p.get("flaps")}
    if flapping:
        key = FLAPS_PREFIX + str(node_id)
        raw = store.get(key)
        history = orjson.loads(raw) if raw else {}
        limit = settings.NIC_FLAPS_PER_HOUR
        for port, times in flapping.items():
            recent = sorted(t for t in history.get(port, []) + list(times) if t > sent_at - HOUR_S)
            if len(recent) >= limit:
                text = f"port {port} flapped {len(recent)} times in the last hour (limit {limit})"
                found.append(("nic_link_flap", recent[-1], text, port))
                recent = []
            history[port] = recent
        store.put(key, orjson.dumps(history))
    return found


# --- recorded traces --------------------------------------------------------------------------

TRACE_REQUEST_PREFIX = "myriad:net:trace-request:"  # + node id: {"asked_at", "seconds", "by"}
TRACE_PREFIX = "myriad:net:trace:"  # + node id: the newest recorded trace
MAX_TRACE_WINDOWS = 6000  # 60 s of 10 ms windows
TRACE_SERIES = ("tx_util", "rx_util", *CONGESTION)
PREFIXES = (FLAPS_PREFIX, TRACE_REQUEST_PREFIX, TRACE_PREFIX)  # per-node keys of this module


def ask_for_trace(node_id: int, seconds: float, by: str, store) -> dict:
    """Ask the node's agent for its last ``seconds`` of 10 ms windows (with its next poll)."""
    request = {"asked_at": round(time.time(), 3), "seconds": seconds, "by": by}
    store.put(TRACE_REQUEST_PREFIX + str(node_id), orjson.dumps(request))
    return request


def trace_request(node_id: int, store) -> dict | None:
    raw = store.get(TRACE_REQUEST_PREFIX + str(node_id))
    return orjson.loads(raw) if raw else None


def parse_trace(body, known: frozenset[str]) -> dict:
    """An agent's uploaded trace, checked: ``asked_at`` (the request it answers), ``start``,
    ``interval_ms``, ``t_ms`` and per port (one of the node's) series as long as ``t_ms``."""
    if not isinstance(body, dict):
        raise FieldError("body", "a trace is a JSON object")
    number(body.get("asked_at"), "asked_at", 0, 1e11)
    number(body.get("start"), "start", 0, 1e11)
    number(body.get("interval_ms"), "interval_ms", 1, 60_000)
    t_ms = body.get("t_ms")
    if not isinstance(t_ms, list) or len(t_ms) > MAX_TRACE_WINDOWS:
        raise FieldError("t_ms", f"must be a list of at most {MAX_TRACE_WINDOWS} window times")
    for j, t in enumerate(t_ms):
        if type(t) not in (int, float) or not 0 <= t <= 1e8:
            number(t, f"t_ms[{j}]", 0, 1e8)
    series = body.get("ports")
    if not isinstance(series, list) or len(series) > ports.MAX_PORTS:
        raise FieldError("ports", f"must be a list of at most {ports.MAX_PORTS} ports")
    for i, p in enumerate(series):
        where = f"ports[{i}]"
        if not isinstance(p, dict) or p.get("port") not in known:
            raise FieldError(
                f"{where}.port", f"the node has no port {p.get('port') if isinstance(p, dict) else p!r}"
            )
        for key, values in p.items():
            if key == "port":
                continue
            if key == "states":
                if not isinstance(values, list) or len(values) > MAX_TRACE_WINDOWS:
                    raise FieldError(f"{where}.states", "must be a list of [window, state] changes")
                for j, change in enumerate(values):
                    if (
                        not isinstance(change, list)
                        or len(change) != 2
                        or change[1] not in STATES
                        or isinstance(change[0], bool)
                        or not isinstance(change[0], int)
                    ):
                        raise FieldError(f"{where}.states[{j}]", "must be [window, state]")
                continue
            if key not in TRACE_SERIES:
                raise FieldError(f"{where}.{key}", "unknown series")
            if not isinstance(values, list) or len(values) != len(t_ms):
                raise FieldError(f"{where}.{key}", f"must be a list of {len(t_ms)} values, one per window")
            hi = 100 if key.endswith("_util") else _TOP
            for j, v in enumerate(values):
                if type(v) not in (int, float) or not 0 <= v <= hi:
                    number(v, f"{where}.{key}[{j}]", 0, hi)
    return body


def store_trace(node_id: int, trace: dict, store) -> dict:
    """Keep the node's newest trace; the request it answers is done (a newer one stays)."""
    trace = {**trace, "received_at": round(time.time(), 3)}
    store.put(TRACE_PREFIX + str(node_id), orjson.dumps(trace))
    asked = trace_request(node_id, store)
    if asked and asked["asked_at"] <= trace["asked_at"]:
        store.delete(TRACE_REQUEST_PREFIX + str(node_id))
    return trace


def newest_trace(node_id: int, store) -> bytes | None:
    return store.get(TRACE_PREFIX + str(node_id))


# --- the row a port adds to the fabric's link loads (monitoring.telemetry.fabric) ---------------

FABRIC_COLUMNS = ("rail", "rate_gbps", "tx_bytes_s", "rx_bytes_s", "p99", "cnp_per_s", "down")


def fabric_row(summaries: list[dict]) -> list[float]:
    """The node's ports flattened for the fabric (FABRIC_COLUMNS per port): computed once per
    report here so a frame over 100k ports reads arrays, not 100k summaries."""
    row: list[float] = []
    for p in summaries:
        if "rail" not in p:
            continue
        seconds = p.get("seconds") or (p.get("windows") or 0) * 0.01 or 1.0
        row += [
            p["rail"],
            p.get("rate_gbps") or 0.0,
            (p.get("tx_bytes") or 0) / seconds,
            (p.get("rx_bytes") or 0) / seconds,
            (p.get("util") or {}).get("p99", 0.0),
            p.get("cnp_sent_per_s", 0.0),
            1.0 if p.get("state") == "down" else 0.0,
        ]
    return row


# --- network evidence for a hung or slow job ----------------------------------------------------


def evidence(node_ids, reports: dict[int, dict]) -> tuple[int, str] | None:
    """The node of ``node_ids`` whose newest port summaries show the strongest network trouble,
    and what: a port down, then a CNP storm (at the congestion threshold), then error counters
    that grew, then link flaps; None when none shows any."""
    storm = float(settings.FABRIC_CONGESTED_CNP_PER_S)
    found = []
    for node_id in node_ids:
        for p in (reports.get(node_id) or {}).get("net") or []:
            port = p["port"]
            cnp = p.get("cnp_sent_per_s", 0.0)
            errors = sum((p.get("errors") or {}).values())
            if p.get("state") == "down":
                found.append((3, 0.0, node_id, f"port {port} is down"))
            elif cnp >= storm:
                found.append((2, cnp, node_id, f"port {port} sends {cnp:,.0f} CNPs a second (a CNP storm)"))
            elif errors:
                names = ", ".join(f"{k} {v}" for k, v in sorted((p.get("errors") or {}).items()) if v)
                found.append((1, float(errors), node_id, f"port {port} counted errors: {names}"))
            elif p.get("flaps"):
                found.append(
                    (0, float(len(p["flaps"])), node_id, f"port {port} flapped {len(p['flaps'])} times")
                )
    if not found:
        return None
    _, _, node_id, text = max(found, key=lambda f: (f[0], f[1]))
    return node_id, text
