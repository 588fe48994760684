"""A node's network ports in the inventory: the list its agent sends (at enrolment and whenever
it changes), checked and written. Reports then name these ports (monitoring.telemetry.netreports)."""

from __future__ import annotations

from cluster.fields import FieldError, number, objects, whole
from cluster.models import NicPort
from engine.states import PORT_KINDS

MAX_PORTS = 64


def parse_inventory(value) -> list[dict]:
    """A node's port list ([{name, kind, rail, rate_gbps}]), checked; names unique."""
    out, names = [], set()
    for i, p in enumerate(objects(value, "ports", MAX_PORTS)):
        where = f"ports[{i}]"
        name = p.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 32:
            raise FieldError(f"{where}.name", "must be the port's name (1 to 32 characters)")
        if name in names:
            raise FieldError(f"{where}.name", f"port {name!r} appears twice")
        names.add(name)
        if p.get("kind") not in PORT_KINDS:
            kinds = ", ".join(PORT_KINDS)
            raise FieldError(f"{where}.kind", f"{p.get('kind')!r} is not one of {kinds}"[:200])
        out.append(
            {
                "name": name,
                "kind": p["kind"],
                "rail": whole(p.get("rail"), f"{where}.rail", 0, 255),
                "rate_gbps": float(number(p.get("rate_gbps"), f"{where}.rate_gbps", 0, 10_000)),
            }
        )
    return out


def set_ports(node_id: int, inventory: list[dict]) -> bool:
    """Make the node's ports the list given (in the caller's transaction); True if it changed."""
    rows = {p.name: p for p in NicPort.objects.filter(node_id=node_id)}
    want = {p["name"]: p for p in inventory}
    changed = False
    gone = set(rows) - set(want)
    if gone:
        NicPort.objects.filter(node_id=node_id, name__in=gone).delete()
        changed = True
    for name, p in want.items():
        row = rows.get(name)
        if row is None:
            NicPort.objects.create(node_id=node_id, **p)
            changed = True
        elif (row.kind, row.rail, row.rate_gbps) != (p["kind"], p["rail"], p["rate_gbps"]):
            row.kind, row.rail, row.rate_gbps = p["kind"], p["rail"], p["rate_gbps"]
            row.save(update_fields=["kind", "rail", "rate_gbps"])
            changed = True
    return changed
