"""Load the inventory into the engine's ``TopologySnapshot`` with seven plain queries."""

from __future__ import annotations

import numpy as np
from django.db import connection

from cluster.models import GPU, ChipType, Datacenter, Node, Pod, Rack, Region
from engine.states import GPU_HEALTH_CODE, GPU_STATE_CODE, NODE_STATE_CODE
from engine.topology import TopologySnapshot


def _index(ids: np.ndarray) -> dict[int, int]:
    return {int(pk): i for i, pk in enumerate(ids)}


def _map(ids: list[int], lookup: dict[int, int], dtype) -> np.ndarray:
    return np.fromiter((lookup[i] for i in ids), dtype=dtype, count=len(ids))


def load_topology() -> TopologySnapshot:
    chips = list(ChipType.objects.order_by("id").values_list("id", "name"))
    chip_index = {pk: i for i, (pk, _) in enumerate(chips)}
    regions = list(Region.objects.order_by("id").values_list("id", "name"))
    region_id = np.array([r[0] for r in regions], dtype=np.int64)
    dcs = list(Datacenter.objects.order_by("id").values_list("id", "region_id", "name"))
    dc_id = np.array([d[0] for d in dcs], dtype=np.int64)
    pods = list(Pod.objects.order_by("id").values_list("id", "datacenter_id", "name"))
    pod_id = np.array([p[0] for p in pods], dtype=np.int64)
    racks = list(Rack.objects.order_by("id").values_list("id", "pod_id"))
    rack_id = np.array([r[0] for r in racks], dtype=np.int64)

    nodes = list(
        Node.objects.order_by("id").values_list(
            "id", "rack_id", "chip_type_id", "state", "is_spare", "hostname"
        )
    )
    node_id = np.array([n[0] for n in nodes], dtype=np.int64)
    node_index = _index(node_id)

    # The GPU table is the big one: read it through the cursor to skip model machinery.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, node_id, {connection.ops.quote_name('index')}, state, health "
            f"FROM {GPU._meta.db_table} ORDER BY node_id, {connection.ops.quote_name('index')}"
        )
        gpus = cursor.fetchall()
    gpu_cols = list(zip(*gpus, strict=True)) if gpus else [[], [], [], [], []]

    return TopologySnapshot(
        gpu_id=np.array(gpu_cols[0], dtype=np.int64),
        gpu_node=_map(gpu_cols[1], node_index, np.int32),
        gpu_slot=np.array(gpu_cols[2], dtype=np.int16),
        gpu_state=np.fromiter((GPU_STATE_CODE[s] for s in gpu_cols[3]), dtype=np.int8, count=len(gpus)),
        gpu_health=np.fromiter((GPU_HEALTH_CODE[s] for s in gpu_cols[4]), dtype=np.int8, count=len(gpus)),
        node_id=node_id,
        node_rack=_map([n[1] for n in nodes], _index(rack_id), np.int32),
        node_chip=np.array([chip_index[n[2]] for n in nodes], dtype=np.int16),
        node_state=np.array([NODE_STATE_CODE[n[3]] for n in nodes], dtype=np.int8),
        node_spare=np.array([n[4] for n in nodes], dtype=bool),
        node_hostname=tuple(n[5] for n in nodes),
        rack_id=rack_id,
        rack_pod=_map([r[1] for r in racks], _index(pod_id), np.int32),
        pod_id=pod_id,
        pod_datacenter=_map([p[1] for p in pods], _index(dc_id), np.int32),
        datacenter_id=dc_id,
        datacenter_region=_map([d[1] for d in dcs], _index(region_id), np.int32),
        region_id=region_id,
        chip_names=tuple(name for _, name in chips),
        names={
            "region": tuple(r[1] for r in regions),
            "datacenter": tuple(d[2] for d in dcs),
            "pod": tuple(f"{dcs[_index(dc_id)[p[1]]][2]}-{p[2]}" for p in pods),
        },
    )
