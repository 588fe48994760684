"""Load the inventory into the engine's ``TopologySnapshot`` with a handful of plain queries.

The GPU table is the big one (100k rows): it is read as integers only, and the few GPUs whose
state or health is not the default come from a second, selective query.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from django.db import connection

from cluster.models import GPU, ChipType, Datacenter, InventoryRevision, Node, Pod, Rack, Region
from engine.states import GPU_HEALTH_CODE, GPU_STATE_CODE, NODE_STATE_CODE
from engine.topology import TopologySnapshot


def _positions(sorted_ids: np.ndarray, ids) -> np.ndarray:
    """Index of each id in ``sorted_ids`` (ids ascending, as every query here orders them)."""
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.searchsorted(sorted_ids, ids)
    if len(ids) and (pos.max(initial=0) >= len(sorted_ids) or np.any(sorted_ids[pos] != ids)):
        raise ValueError("inventory changed while the snapshot was read; load it again")
    return pos.astype(np.int32)


# Written as IN lists (not <>) so the state and health indexes serve them without a table scan.
_UNUSUAL_GPUS_WHERE = (
    "state IN ("
    + ", ".join(f"'{s}'" for s in GPU_STATE_CODE if s != "ready")
    + ") OR health IN ("
    + ", ".join(f"'{h}'" for h in GPU_HEALTH_CODE if h != "ok")
    + ")"
)
_UNUSUAL_GPUS_SQL = "SELECT id, state, health FROM {table} WHERE " + _UNUSUAL_GPUS_WHERE

# What changes between two reads of an unchanged inventory, in one statement: the nodes not ready
# (0), the spare nodes (1), the GPUs not ready or not healthy (2).
_STATES_SQL = (
    f"SELECT 0, id, state, '' FROM {Node._meta.db_table} WHERE state IN ("
    + ", ".join(f"'{s}'" for s in NODE_STATE_CODE if s != "ready")
    + f") UNION ALL SELECT 1, id, '', '' FROM {Node._meta.db_table} WHERE is_spare"
    + f" UNION ALL SELECT 2, id, state, health FROM {GPU._meta.db_table} WHERE {_UNUSUAL_GPUS_WHERE}"
)


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def _drain_deadlines(node_id: np.ndarray) -> np.ndarray | None:
    """Deadlines of draining nodes, as epoch seconds per node (NaN: none); None when no node has one
    (the usual case: one indexed lookup of the few draining nodes)."""
    rows = list(
        Node.objects.filter(state="draining", drain_deadline__isnull=False).values_list(
            "id", "drain_deadline"
        )
    )
    if not rows:
        return None
    out = np.full(len(node_id), np.nan)
    out[np.searchsorted(node_id, [r[0] for r in rows])] = [r[1].timestamp() for r in rows]
    return out


def load_topology() -> TopologySnapshot:
    chips = list(ChipType.objects.order_by("id").values_list("id", "name"))
    chip_ids = np.array([c[0] for c in chips], dtype=np.int64)
    regions = list(Region.objects.order_by("id").values_list("id", "name"))
    region_id = np.array([r[0] for r in regions], dtype=np.int64)
    dcs = list(Datacenter.objects.order_by("id").values_list("id", "region_id", "name"))
    dc_id = np.array([d[0] for d in dcs], dtype=np.int64)
    pods = list(Pod.objects.order_by("id").values_list("id", "datacenter_id", "name"))
    pod_id = np.array([p[0] for p in pods], dtype=np.int64)
    racks = np.array(Rack.objects.order_by("id").values_list("id", "pod_id"), dtype=np.int64).reshape(-1, 2)
    rack_id = racks[:, 0]

    nodes = list(
        Node.objects.order_by("id").values_list(
            "id", "rack_id", "chip_type_id", "state", "is_spare", "hostname"
        )
    )
    node_id = np.array([n[0] for n in nodes], dtype=np.int64)

    q = connection.ops.quote_name
    table = GPU._meta.db_table
    gpus = np.array(
        _rows(f"SELECT id, node_id, {q('index')} FROM {table} ORDER BY node_id, {q('index')}"), dtype=np.int64
    ).reshape(-1, 3)
    gpu_id = gpus[:, 0]
    gpu_state = np.zeros(len(gpus), dtype=np.int8)  # "ready" is code 0
    gpu_health = np.zeros(len(gpus), dtype=np.int8)  # "ok" is code 0
    unusual = _rows(_UNUSUAL_GPUS_SQL.format(table=table))
    if unusual:
        order = np.argsort(gpu_id)
        where = order[np.searchsorted(gpu_id, [u[0] for u in unusual], sorter=order)]
        gpu_state[where] = [GPU_STATE_CODE[u[1]] for u in unusual]
        gpu_health[where] = [GPU_HEALTH_CODE[u[2]] for u in unusual]

    dc_names = {d[0]: d[2] for d in dcs}
    return TopologySnapshot(
        gpu_id=gpu_id,
        gpu_node=_positions(node_id, gpus[:, 1]),
        gpu_slot=gpus[:, 2].astype(np.int16),
        gpu_state=gpu_state,
        gpu_health=gpu_health,
        node_id=node_id,
        node_rack=_positions(rack_id, [n[1] for n in nodes]),
        node_chip=_positions(chip_ids, [n[2] for n in nodes]).astype(np.int16),
        node_state=np.array([NODE_STATE_CODE[n[3]] for n in nodes], dtype=np.int8),
        node_spare=np.array([n[4] for n in nodes], dtype=bool),
        node_hostname=tuple(n[5] for n in nodes),
        rack_id=rack_id,
        rack_pod=_positions(pod_id, racks[:, 1]),
        pod_id=pod_id,
        pod_datacenter=_positions(dc_id, [p[1] for p in pods]),
        datacenter_id=dc_id,
        datacenter_region=_positions(region_id, [d[1] for d in dcs]),
        region_id=region_id,
        chip_names=tuple(name for _, name in chips),
        names={
            "region": tuple(r[1] for r in regions),
            "datacenter": tuple(d[2] for d in dcs),
            "pod": tuple(f"{dc_names[p[1]]}-{p[2]}" for p in pods),
        },
        node_drain_deadline=_drain_deadlines(node_id),
    )


class TopologyCache:
    """Keeps the static structure of the last snapshot and refreshes only the states that change
    (node states, unusual GPU states) each time; reloads everything when the inventory changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None  # what the snapshot was built from (see ``key``)
        self._snapshot: TopologySnapshot | None = None
        self.gpu_order: np.ndarray | None = None
        self._cells: tuple | None = None
        self._checked_at = 0.0
        self._capacity: dict[tuple, tuple[int, int]] = {}

    @staticmethod
    def _structure_key() -> tuple:
        """The inventory's revision (raised by the database with every change to its structure,
        cluster.models.InventoryRevision) and each table's newest id (a table emptied and filled
        again, as tests do, starts the revision over but not the ids): index lookups, where
        counting the GPUs cost a cycle 12-15 ms on PostgreSQL."""
        newest = ", ".join(
            f"(SELECT MAX(id) FROM {model._meta.db_table})"
            for model in (GPU, Node, Rack, Pod, Datacenter, Region, ChipType)
        )
        revision = f"(SELECT revision FROM {InventoryRevision._meta.db_table} WHERE id = 1)"
        return tuple(_rows(f"SELECT {revision}, {newest}")[0])

    def reset(self) -> None:
        self.__init__()

    @property
    def key(self) -> tuple | None:
        """Identifies the inventory the cached snapshot was built from: it changes whenever GPUs,
        nodes or any other part of the topology are added or removed."""
        return self._key

    def structure(self, max_age_s: float = 2.0) -> TopologySnapshot:
        """The cached snapshot for questions about the cluster's shape (not its states); the
        inventory is re-checked at most every ``max_age_s`` seconds."""
        now = time.monotonic()
        if self._snapshot is None or now - self._checked_at > max_age_s:
            self.current()
        return self._snapshot

    def capacity(self, chips: tuple[int, ...], level: str, combined: bool = False) -> tuple[int, int]:
        """(GPUs of one of these chip types in the cluster, most in any one domain of ``level``),
        or with ``combined`` of all of them together (a mixed-chip job); spare nodes do not count
        (they are kept for recovery). Memoized per inventory and set of spares."""
        snap = self.structure()
        key = (self._key, chips, level, combined, hash(snap.node_spare.tobytes()))
        if key not in self._capacity:
            pool = ~snap.node_spare[snap.gpu_node]
            groups = (
                [np.isin(snap.gpu_chip, chips) & pool]
                if combined
                else [(snap.gpu_chip == c) & pool for c in chips]
            )
            best_total = best_domain = 0
            for mask in groups:
                total = int(mask.sum())
                best_total = max(best_total, total)
                domain = total if level == "cluster" else int(snap.count_by(level, mask).max(initial=0))
                best_domain = max(best_domain, domain)
            self._capacity[key] = (best_total, best_domain)
        return self._capacity[key]

    def current(self) -> TopologySnapshot:
        key = self._structure_key()
        self._checked_at = time.monotonic()
        if key != self._key or self._snapshot is None:
            self._snapshot = load_topology()
            self._key = key
            self.gpu_order = np.argsort(self._snapshot.gpu_id, kind="stable")
            return self._snapshot
        return self._refresh_states(self._snapshot)

    def gpu_indices(self, gpu_ids) -> np.ndarray:
        """Snapshot indices of the given GPU database ids."""
        snap = self._snapshot
        ids = np.asarray(gpu_ids, dtype=np.int64)
        sorted_ids = snap.gpu_id[self.gpu_order]
        pos = np.searchsorted(sorted_ids, ids)
        if len(ids) and (pos.max() >= len(sorted_ids) or np.any(sorted_ids[pos] != ids)):
            raise ValueError("allocation names a GPU that is not in the inventory")
        return self.gpu_order[pos]

    def _cell_keys(self) -> np.ndarray:
        """Each GPU's (node position x 128 + index on the node), ascending: the GPUs are ordered by
        node, then index."""
        snap = self._snapshot
        if self._cells is None or self._cells[0] is not snap.gpu_id:
            self._cells = (snap.gpu_id, snap.gpu_node.astype(np.int64) * 128 + snap.gpu_slot)
        return self._cells[1]

    def gpu_cells(self, gpu_ids) -> tuple[np.ndarray, np.ndarray]:
        """(node database id, index on the node) of the given GPU database ids."""
        snap = self.structure()
        try:
            at = self.gpu_indices(gpu_ids)
        except ValueError:  # GPUs added in the last seconds
            snap = self.current()
            at = self.gpu_indices(gpu_ids)
        return snap.node_id[snap.gpu_node[at]], snap.gpu_slot[at].astype(np.int64)

    def gpus_at(self, node_ids, indices) -> np.ndarray:
        """Database ids of the GPUs at (node database id, index on the node); -1 where the inventory
        has no such GPU."""
        nodes = np.asarray(node_ids, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        found = self._gpus_at(self.structure(), nodes, indices)
        if (found < 0).any():  # perhaps GPUs added in the last seconds
            found = self._gpus_at(self.current(), nodes, indices)
        return found

    def _gpus_at(self, snap: TopologySnapshot, nodes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if not len(snap.node_id) or not len(snap.gpu_id):
            return np.full(len(nodes), -1, dtype=np.int64)
        keys = self._cell_keys()
        pos = np.minimum(np.searchsorted(snap.node_id, nodes), len(snap.node_id) - 1)
        wanted = pos * 128 + indices
        at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
        found = (snap.node_id[pos] == nodes) & (keys[at] == wanted)
        return np.where(found, snap.gpu_id[at], -1)

    def _refresh_states(self, snap: TopologySnapshot) -> TopologySnapshot:
        node_state = np.zeros(snap.num_nodes, dtype=np.int8)
        spare = np.zeros(snap.num_nodes, dtype=bool)
        gpu_state = np.zeros(snap.num_gpus, dtype=np.int8)
        gpu_health = np.zeros(snap.num_gpus, dtype=np.int8)
        rows = _rows(_STATES_SQL)  # one round trip, each part an index lookup
        odd_nodes = [r for r in rows if r[0] == 0]
        if odd_nodes:
            where = np.searchsorted(snap.node_id, [n[1] for n in odd_nodes])
            node_state[where] = [NODE_STATE_CODE[n[2]] for n in odd_nodes]
        spares = [r[1] for r in rows if r[0] == 1]
        if spares:
            spare[np.searchsorted(snap.node_id, spares)] = True
        unusual = [r for r in rows if r[0] == 2]
        if unusual:
            where = self.gpu_indices([u[1] for u in unusual])
            gpu_state[where] = [GPU_STATE_CODE[u[2]] for u in unusual]
            gpu_health[where] = [GPU_HEALTH_CODE[u[3]] for u in unusual]
        deadlines = (
            _drain_deadlines(snap.node_id) if (node_state == NODE_STATE_CODE["draining"]).any() else None
        )
        fresh = replace(
            snap,
            gpu_state=gpu_state,
            gpu_health=gpu_health,
            node_state=node_state,
            node_spare=spare,
            node_drain_deadline=deadlines,
        )
        self._snapshot = fresh
        return fresh


topology_cache = TopologyCache()
