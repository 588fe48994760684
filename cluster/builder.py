"""Write a validated topology to the database in one transaction with bulk inserts.

100,000 GPUs are about 120,000 rows; they go in as a few dozen multi-row INSERTs, never one
save() per row. Nothing is written unless the whole build succeeds.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from django.db import connection, transaction

from cluster.models import GPU, ChipType, Datacenter, DatacenterLink, NicPort, Node, Pod, Rack, Region
from engine.chips import CATALOGUE
from engine.topology_spec import TopologySpec

_UUID_NAMESPACE = uuid.UUID("6f9d1c1e-5b0a-4f43-9b8a-4d7a3c1f2e10")


class InventoryExists(RuntimeError):
    """The database already holds a cluster and the build was not asked to replace it."""


@dataclass(frozen=True)
class BuildResult:
    regions: int
    datacenters: int
    pods: int
    racks: int
    nodes: int
    gpus: int
    links: int


def ensure_chip_catalogue() -> int:
    """Create the catalogue's chip types that are missing; never overwrites an operator's edits."""
    existing = set(ChipType.objects.values_list("name", flat=True))
    missing = [ChipType(**chip.as_dict()) for chip in CATALOGUE if chip.name not in existing]
    ChipType.objects.bulk_create(missing)
    return len(missing)


def known_chip_names() -> set[str]:
    return set(ChipType.objects.values_list("name", flat=True)) | {chip.name for chip in CATALOGUE}


def inventory_exists() -> bool:
    return Region.objects.exists()


def clear_inventory() -> None:
    """Delete the whole topology. GPUs and nodes go by plain DELETE, not Django's per-row cascade."""
    for model in (NicPort, GPU, Node, Rack, Pod, DatacenterLink, Datacenter, Region):
        model.objects.all()._raw_delete(model.objects.db)


def gpu_identity(hostname: str, index: int) -> tuple[str, str]:
    """A stable UUID and serial for a GPU, so rebuilding the same topology yields the same GPUs.

    Real nodes report their own; the node agent overwrites these with NVML's values."""
    digest = hashlib.blake2b(
        f"{hostname}/{index}".encode(), digest_size=22, key=_UUID_NAMESPACE.bytes
    ).digest()
    gpu_uuid = f"GPU-{uuid.UUID(bytes=digest[:16], version=4)}"
    serial = str(int.from_bytes(digest[16:], "big")).zfill(15)[-15:]
    return gpu_uuid, serial


def _insert_gpus(rows: list[tuple[int, int, str, str]]) -> None:
    """Insert (node_id, index, uuid, serial) rows: COPY on PostgreSQL, one prepared executemany on
    SQLite. The model's defaults (ready, ok) are written explicitly."""
    table = GPU._meta.db_table
    columns = f"node_id, {connection.ops.quote_name('index')}, uuid, serial, state, health"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # COPY is not wrapped by Django: map driver errors to Django's (IntegrityError...)
            with connection.wrap_database_errors, cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row((*row, "ready", "ok"))
        else:
            cursor.executemany(
                f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, 'ready', 'ok')", rows
            )


def _node_nics(nodes, racks, pods, pod_specs):
    """(node, its pod's NIC rate in Gb/s) for every node."""
    pod_rate = {pod.pk: spec.nic_gbps for pod, (_, spec) in zip(pods, pod_specs, strict=True)}
    rack_pod = {rack.pk: rack.pod_id for rack in racks}
    return [(node, pod_rate[rack_pod[node.rack_id]]) for node in nodes]


def _analyze(*models) -> None:
    """PostgreSQL: the planner's statistics for tables just filled, now rather than at autovacuum's
    next pass, so that the scheduling cycle's selective reads (nodes not ready, spare nodes, GPUs
    not healthy) are index lookups from the first cycle on instead of scans of every row."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f"ANALYZE {model._meta.db_table}")


def _insert_ports(rows: list[tuple[int, str, int, float]]) -> None:
    """Every node's rail ports (node_id, name, rail, rate): one RDMA port per GPU, named as the
    agent names them (``mlx5_<rail>/1``); a node's agent replaces them with what it finds."""
    table = NicPort._meta.db_table
    columns = "node_id, name, rail, rate_gbps, kind"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with connection.wrap_database_errors, cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row((*row, "ib"))
        else:
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, 'ib')", rows)


@transaction.atomic
def build_cluster(spec: TopologySpec, *, replace: bool = False) -> BuildResult:
    if inventory_exists():
        if not replace:
            raise InventoryExists("the database already holds a cluster; pass replace to rebuild it")
        clear_inventory()
    ensure_chip_catalogue()
    regions = Region.objects.bulk_create(Region(name=r.name, description=r.description) for r in spec.regions)
    datacenters, dc_specs = _datacenters(spec, regions)
    links = _links(spec, {(r, dc.name): row for (r, dc), row in zip(dc_specs, datacenters, strict=True)})
    pod_rows, pod_specs = [], []
    for dc_row, (_, dc) in zip(datacenters, dc_specs, strict=True):
        for pod in dc.pods:
            pod_rows.append(Pod(datacenter=dc_row, name=pod.name, fabric=pod.fabric))
            pod_specs.append((dc.name, pod))
    pods = Pod.objects.bulk_create(pod_rows, batch_size=2000)
    rack_rows = []
    for pod_row, (_, pod) in zip(pods, pod_specs, strict=True):
        rack_rows.extend(Rack(pod=pod_row, name=f"r{r + 1:02d}") for r in range(pod.racks))
    racks = Rack.objects.bulk_create(rack_rows, batch_size=2000)
    nodes = _nodes(pod_specs, racks)
    gpu_rows = [
        (node.pk, index, *gpu_identity(node.hostname, index))
        for node in nodes
        for index in range(node.gpus_per_node)
    ]
    _insert_gpus(gpu_rows)
    rate = {node.rack_id: gbps for node, gbps in _node_nics(nodes, racks, pods, pod_specs)}
    _insert_ports(
        [(node.pk, f"mlx5_{r}/1", r, rate[node.rack_id]) for node in nodes for r in range(node.gpus_per_node)]
    )
    _analyze(Node, GPU, NicPort)
    return BuildResult(
        regions=len(regions),
        datacenters=len(datacenters),
        pods=len(pods),
        racks=len(racks),
        nodes=len(nodes),
        gpus=len(gpu_rows),
        links=len(links),
    )


def _datacenters(spec: TopologySpec, regions: list[Region]):
    rows, specs = [], []
    for region, region_spec in zip(regions, spec.regions, strict=True):
        for dc in region_spec.datacenters:
            rows.append(
                Datacenter(
                    region=region, name=dc.name, location=dc.location, power_budget_kw=dc.power_budget_kw
                )
            )
            specs.append((region_spec.name, dc))
    return Datacenter.objects.bulk_create(rows), specs


def _links(spec: TopologySpec, dc_by_key: dict) -> list[DatacenterLink]:
    links = []
    for link in spec.links:
        a, b = dc_by_key[link.a], dc_by_key[link.b]
        if a.pk > b.pk:
            a, b = b, a
        links.append(
            DatacenterLink(
                a=a,
                b=b,
                distance_km=link.distance_km,
                latency_ms=link.latency_ms,
                lanes=link.lanes,
                lane_gbps=link.lane_gbps,
            )
        )
    return DatacenterLink.objects.bulk_create(links)


def _nodes(pod_specs, racks: list[Rack]) -> list[Node]:
    chips = {c.name: c for c in ChipType.objects.all()}
    rows = []
    rack_iter = iter(racks)
    for dc_name, pod in pod_specs:
        # The last nodes of each pod are its spares: recovery takes them first.
        first_spare = pod.nodes - pod.spare_nodes
        for r in range(pod.racks):
            rack = next(rack_iter)
            for n in range(pod.nodes_per_rack):
                rows.append(
                    Node(
                        rack=rack,
                        hostname=f"{dc_name}-{pod.name}-{rack.name}-n{n + 1:02d}",
                        chip_type=chips[pod.chip_type],
                        gpus_per_node=pod.gpus_per_node,
                        is_spare=r * pod.nodes_per_rack + n >= first_spare,
                    )
                )
    return Node.objects.bulk_create(rows, batch_size=4000)
