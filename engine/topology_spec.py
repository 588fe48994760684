"""Cluster topology documents: parse, validate and expand into the rows to build.

A topology document (YAML or JSON) describes regions > datacenters > pods > racks > nodes > GPUs,
plus the links between datacenters. Validation collects every problem with the path of the
offending entry (``regions[0].datacenters[1].pods[2].chip_type: ...``) so one run shows them
all; nothing is built from a document with any error. The format is documented in
``docs/topology.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.sites import DEFAULT_LANE_GBPS, default_latency_ms, min_latency_ms

MAX_GPUS_PER_NODE = 72  # an NVL72 rack presented as one scale-up node
MAX_NODES_PER_RACK = 64
MAX_RACKS_PER_POD = 1024
MAX_PODS_PER_GROUP = 1000
MAX_TOTAL_GPUS = 1_000_000


class TopologyError(ValueError):
    """A topology document has errors; ``errors`` lists each as 'path: message'."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid topology:\n" + "\n".join(f"  - {e}" for e in errors))


@dataclass(frozen=True)
class PodSpec:
    name: str
    chip_type: str
    racks: int
    nodes_per_rack: int
    gpus_per_node: int
    spare_nodes: int
    fabric: str
    nic_gbps: float = 400.0  # each GPU's rail NIC port (one per GPU: a rail-optimized node)

    @property
    def nodes(self) -> int:
        return self.racks * self.nodes_per_rack

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class DatacenterSpec:
    name: str
    location: str
    power_budget_kw: float
    pods: tuple[PodSpec, ...]


@dataclass(frozen=True)
class RegionSpec:
    name: str
    description: str
    datacenters: tuple[DatacenterSpec, ...]


@dataclass(frozen=True)
class LinkSpec:
    a: tuple[str, str]  # (region, datacenter)
    b: tuple[str, str]
    distance_km: float
    latency_ms: float
    lanes: int
    lane_gbps: float

    @property
    def bandwidth_gbps(self) -> float:
        return self.lanes * self.lane_gbps


@dataclass(frozen=True)
class TopologySpec:
    regions: tuple[RegionSpec, ...]
    links: tuple[LinkSpec, ...] = field(default=())

    def datacenters(self) -> Iterator[tuple[RegionSpec, DatacenterSpec]]:
        for region in self.regions:
            for dc in region.datacenters:
                yield region, dc

    @property
    def total_nodes(self) -> int:
        return sum(p.nodes for _, dc in self.datacenters() for p in dc.pods)

    @property
    def total_gpus(self) -> int:
        return sum(p.gpus for _, dc in self.datacenters() for p in dc.pods)


class _Collector:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, required: set[str], optional: set[str]) -> dict | None:
        if not isinstance(value, dict):
            self.add(path, f"must be a mapping, got {type(value).__name__}")
            return None
        for key in sorted(required - value.keys()):
            self.add(f"{path}.{key}" if path else key, "is required")
        for key in sorted(value.keys() - required - optional, key=str):
            allowed = ", ".join(sorted(required | optional))
            self.add(f"{path}.{key}" if path else str(key), f"unknown field (allowed: {allowed})")
        return value

    def items(self, value: Any, path: str) -> list:
        if not isinstance(value, list) or not value:
            self.add(path, "must be a non-empty list")
            return []
        return value

    def name(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.add(path, "must be a non-empty string")
            return ""
        if len(value) > 64 or any(c.isspace() or c == "/" for c in value):
            self.add(path, f"{value!r} must be at most 64 characters without spaces or '/'")
        return value

    def integer(self, value: Any, path: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be a whole number, got {value!r}")
            return low
        if not low <= value <= high:
            self.add(path, f"must be between {low} and {high}, got {value}")
            return low
        return value

    def number(self, value: Any, path: str, low: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(path, f"must be a number, got {value!r}")
            return low
        if value < low:
            self.add(path, f"must be at least {low}, got {value}")
            return low
        return float(value)

    def unique(self, names: Iterable[tuple[str, str]], what: str) -> None:
        seen: set[str] = set()
        for path, name in names:
            if name and name in seen:
                self.add(path, f"duplicate {what} name {name!r}")
            seen.add(name)


def parse_topology(doc: Any, known_chips: Iterable[str]) -> TopologySpec:
    """Validate a parsed YAML/JSON document and return the topology it describes.

    Raises ``TopologyError`` listing every problem found.
    """
    chips = set(known_chips)
    c = _Collector()
    root = c.mapping(doc, "", {"regions"}, {"links", "name", "description"})
    if root is None:
        raise TopologyError(c.errors)
    regions: list[RegionSpec] = []
    for ri, raw_region in enumerate(c.items(root.get("regions"), "regions")):
        rpath = f"regions[{ri}]"
        region = c.mapping(raw_region, rpath, {"name", "datacenters"}, {"description"})
        if region is None:
            continue
        dcs = [
            _parse_datacenter(c, raw_dc, f"{rpath}.datacenters[{di}]", chips)
            for di, raw_dc in enumerate(c.items(region.get("datacenters"), f"{rpath}.datacenters"))
        ]
        c.unique(
            ((f"{rpath}.datacenters[{i}].name", dc.name) for i, dc in enumerate(dcs) if dc), "datacenter"
        )
        regions.append(
            RegionSpec(
                name=c.name(region.get("name"), f"{rpath}.name"),
                description=str(region.get("description", "")),
                datacenters=tuple(dc for dc in dcs if dc),
            )
        )
    c.unique(((f"regions[{i}].name", r.name) for i, r in enumerate(regions)), "region")
    spec = TopologySpec(regions=tuple(regions))
    links = _parse_links(c, root.get("links", []), spec)
    if not c.errors and spec.total_gpus > MAX_TOTAL_GPUS:
        c.add("regions", f"describes {spec.total_gpus} GPUs; at most {MAX_TOTAL_GPUS} are supported")
    if c.errors:
        raise TopologyError(c.errors)
    return TopologySpec(regions=spec.regions, links=tuple(links))


def _parse_datacenter(c: _Collector, raw: Any, path: str, chips: set[str]) -> DatacenterSpec | None:
    dc = c.mapping(raw, path, {"name", "pods"}, {"location", "power_budget_kw"})
    if dc is None:
        return None
    name = c.name(dc.get("name"), f"{path}.name")
    pods: list[PodSpec] = []
    counter = 0
    for gi, raw_group in enumerate(c.items(dc.get("pods"), f"{path}.pods")):
        gpath = f"{path}.pods[{gi}]"
        group = c.mapping(
            raw_group,
            gpath,
            {"chip_type", "racks", "nodes_per_rack", "gpus_per_node"},
            {"name", "count", "spare_nodes", "fabric", "nic_gbps"},
        )
        if group is None:
            continue
        chip = group.get("chip_type")
        if chip not in chips:
            c.add(f"{gpath}.chip_type", f"unknown chip type {chip!r} (known: {', '.join(sorted(chips))})")
        count = c.integer(group.get("count", 1), f"{gpath}.count", 1, MAX_PODS_PER_GROUP)
        racks = c.integer(group.get("racks"), f"{gpath}.racks", 1, MAX_RACKS_PER_POD)
        per_rack = c.integer(group.get("nodes_per_rack"), f"{gpath}.nodes_per_rack", 1, MAX_NODES_PER_RACK)
        per_node = c.integer(group.get("gpus_per_node"), f"{gpath}.gpus_per_node", 1, MAX_GPUS_PER_NODE)
        spares = c.integer(group.get("spare_nodes", 0), f"{gpath}.spare_nodes", 0, racks * per_rack)
        fabric = str(group.get("fabric", "HPN"))
        nic = c.number(group.get("nic_gbps", 400), f"{gpath}.nic_gbps", 1.0)
        if nic > 10_000:
            c.add(f"{gpath}.nic_gbps", f"{nic:g} Gb/s is above 10,000")
        if "name" in group and count != 1:
            c.add(f"{gpath}.name", "a named pod group must have count 1; omit name to number pods")
        for _ in range(count):
            counter += 1
            pod_name = c.name(group["name"], f"{gpath}.name") if "name" in group else f"p{counter:02d}"
            pods.append(PodSpec(pod_name, str(chip), racks, per_rack, per_node, spares, fabric, nic))
    c.unique(((f"{path}.pods", p.name) for p in pods), "pod")
    return DatacenterSpec(
        name=name,
        location=str(dc.get("location", "")),
        power_budget_kw=c.number(dc.get("power_budget_kw", 0), f"{path}.power_budget_kw"),
        pods=tuple(pods),
    )


def _lanes(c: _Collector, link: dict, path: str) -> tuple[int, float]:
    """``lanes`` x ``lane_gbps`` (default 400), or a total ``bandwidth_gbps`` in 400 Gb/s lanes."""
    if "lanes" not in link and "bandwidth_gbps" in link:
        total = c.number(link["bandwidth_gbps"], f"{path}.bandwidth_gbps", low=0.001)
        lanes = max(1, round(total / DEFAULT_LANE_GBPS))
        return lanes, total / lanes
    if "lanes" not in link:
        c.add(f"{path}.lanes", "is required (or bandwidth_gbps)")
        return 1, DEFAULT_LANE_GBPS
    lanes = link["lanes"]
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes <= 0:
        c.add(f"{path}.lanes", f"must be a whole number above 0, got {lanes!r}")
        lanes = 1
    lane_gbps = c.number(link.get("lane_gbps", DEFAULT_LANE_GBPS), f"{path}.lane_gbps", low=0.001)
    return lanes, lane_gbps


def _parse_links(c: _Collector, raw_links: Any, spec: TopologySpec) -> list[LinkSpec]:
    if not isinstance(raw_links, list):
        c.add("links", "must be a list")
        return []
    by_name: dict[str, list[tuple[str, str]]] = {}
    for region, dc in spec.datacenters():
        by_name.setdefault(dc.name, []).append((region.name, dc.name))
        by_name.setdefault(f"{region.name}/{dc.name}", []).append((region.name, dc.name))
    links: list[LinkSpec] = []
    seen: set[frozenset] = set()
    for li, raw in enumerate(raw_links):
        path = f"links[{li}]"
        optional = {"distance_km", "latency_ms", "lanes", "lane_gbps", "bandwidth_gbps"}
        link = c.mapping(raw, path, {"between"}, optional)
        if link is None:
            continue
        ends = link.get("between")
        if not isinstance(ends, list) or len(ends) != 2:
            c.add(f"{path}.between", "must list exactly two datacenters")
            continue
        resolved = []
        for ei, end in enumerate(ends):
            matches = by_name.get(str(end), [])
            if len(matches) != 1:
                why = "is ambiguous; write region/datacenter" if matches else "names no datacenter"
                c.add(f"{path}.between[{ei}]", f"{end!r} {why}")
            else:
                resolved.append(matches[0])
        if len(resolved) != 2:
            continue
        if resolved[0] == resolved[1]:
            c.add(f"{path}.between", "a link joins two different datacenters")
            continue
        key = frozenset(resolved)
        if key in seen:
            c.add(f"{path}.between", "duplicate link between these datacenters")
        seen.add(key)
        distance = c.number(link.get("distance_km", 0), f"{path}.distance_km")
        latency = c.number(link.get("latency_ms", default_latency_ms(distance)), f"{path}.latency_ms")
        if latency < min_latency_ms(distance) - 1e-12:
            c.add(
                f"{path}.latency_ms",
                f"{latency} ms is below what light in fibre needs for {distance:g} km "
                f"({min_latency_ms(distance):.3f} ms)",
            )
        lanes, lane_gbps = _lanes(c, link, path)
        a, b = sorted(resolved)
        links.append(LinkSpec(a, b, distance, latency, lanes, lane_gbps))
    return links
