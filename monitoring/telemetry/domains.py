"""The fleet's domains as the level views and the drain preview name them: the hierarchy
(datacenter > pod > rack > node > GPU, engine.levels) with rack names, each level's database ids
and display names, and the errors a query about them gets."""

from __future__ import annotations

import numpy as np

from cluster.models import Rack
from engine.levels import Hierarchy

_hierarchies: dict[int, tuple] = {}  # id(snapshot) -> (snapshot, Hierarchy, rack names)


class LevelQueryError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class UnknownDomain(LevelQueryError):
    """The query names a domain or job that does not exist (404, where a malformed one is 400)."""


def hierarchy(snap):
    entry = _hierarchies.get(id(snap))
    if entry is None or entry[0] is not snap:
        rack_names = dict(Rack.objects.values_list("id", "name"))
        entry = (snap, Hierarchy.of(snap), tuple(rack_names.get(int(r), str(r)) for r in snap.rack_id))
        _hierarchies.clear()
        _hierarchies[id(snap)] = entry
    return entry[1], entry[2]


def ids(snap, level: str) -> np.ndarray:
    return {
        "datacenter": snap.datacenter_id,
        "pod": snap.pod_id,
        "rack": snap.rack_id,
        "node": snap.node_id,
        "gpu": snap.gpu_id,
    }[level]


def names(snap, level: str, racks: tuple[str, ...], cells: np.ndarray) -> list[str]:
    if level in ("datacenter", "pod"):
        labels = snap.names[level]
        return [labels[c] for c in cells]
    if level == "rack":
        pods = snap.names["pod"]
        return [f"{pods[snap.rack_pod[c]]}/{racks[c]}" for c in cells]
    if level == "node":
        return [snap.node_hostname[c] for c in cells]
    return [f"{snap.node_hostname[snap.gpu_node[c]]} GPU {snap.gpu_slot[c]}" for c in cells]


def an_id(text: str) -> bool:
    """Digits that fit a database id (a 64-bit integer)."""
    return 0 < len(text) <= 19 and text.isascii() and text.isdigit() and int(text) < 2**63
