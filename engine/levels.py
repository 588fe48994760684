"""The operator's levels of the cluster (cluster > datacenter > pod > rack > node > GPU) and the
aggregate of a telemetry metric over each level's cells, computed with NumPy over the whole frame
at once: the server does it once per frame, whatever the number of viewers.

A level's cells are its domains (every datacenter, pod, rack or node; every GPU at the deepest);
each GPU belongs to one cell of every level. The aggregates an operator chooses between:

- ``mean``: the mean of the metric over the cell's GPUs;
- ``max``: its highest value;
- ``above``: the share of the cell's GPUs (in %) whose value is at least a threshold;
- ``unhealthy``: how many of the cell's GPUs report a health other than ok.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LEVELS = ("datacenter", "pod", "rack", "node", "gpu")  # below the whole cluster, widest first
AGGREGATES = ("mean", "max", "above", "unhealthy")


@dataclass(frozen=True)
class Hierarchy:
    """Which cell of each level every GPU belongs to, and each cell's parent."""

    gpu_node: np.ndarray
    node_rack: np.ndarray
    rack_pod: np.ndarray
    pod_datacenter: np.ndarray
    num_datacenters: int
    _groups: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, snap) -> Hierarchy:
        """From a topology snapshot (engine.topology.TopologySnapshot)."""
        return cls(
            np.asarray(snap.gpu_node, dtype=np.int64),
            np.asarray(snap.node_rack, dtype=np.int64),
            np.asarray(snap.rack_pod, dtype=np.int64),
            np.asarray(snap.pod_datacenter, dtype=np.int64),
            len(snap.datacenter_id),
        )

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_node)

    def size(self, level: str) -> int:
        """How many cells the level has."""
        return {
            "datacenter": self.num_datacenters,
            "pod": len(self.pod_datacenter),
            "rack": len(self.rack_pod),
            "node": len(self.node_rack),
            "gpu": self.num_gpus,
        }[_known(level)]

    def parents(self, level: str) -> np.ndarray | None:
        """The parent cell (one level up) of every cell of ``level``; None for datacenters."""
        return {
            "datacenter": None,
            "pod": self.pod_datacenter,
            "rack": self.rack_pod,
            "node": self.node_rack,
            "gpu": self.gpu_node,
        }[_known(level)]

    def cell_of_gpu(self, level: str) -> np.ndarray:
        """The cell of ``level`` of every GPU."""
        cell = np.arange(self.num_gpus)
        for lower in reversed(LEVELS[LEVELS.index(_known(level)) + 1 :]):
            cell = self.parents(lower)[cell]
        return cell

    def _group(self, level: str):
        """(cell of every GPU, GPUs ordered by cell, where each cell starts in that order, GPUs
        per cell), built once per level."""
        cached = self._groups.get(level)
        if cached is None:
            cell = self.cell_of_gpu(level)
            order = np.argsort(cell, kind="stable")
            counts = np.bincount(cell, minlength=self.size(level))
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            cached = self._groups[level] = (cell, order, starts, counts)
        return cached

    def gpus(self, level: str) -> np.ndarray:
        """GPUs per cell of ``level``."""
        return self._group(level)[3]

    def within(self, level: str, parent_level: str | None, parent: int | None) -> np.ndarray:
        """The cells of ``level`` inside cell ``parent`` of ``parent_level`` (a level above it),
        or every cell of ``level`` when ``parent_level`` is None."""
        cells = np.arange(self.size(level))
        if parent_level is None:
            return cells
        if LEVELS.index(_known(parent_level)) >= LEVELS.index(_known(level)):
            raise ValueError(f"{parent_level} is not above {level}")
        if not 0 <= parent < self.size(parent_level):
            raise ValueError(f"there is no {parent_level} {parent}")
        up = cells
        for lower in reversed(LEVELS[LEVELS.index(parent_level) + 1 : LEVELS.index(level) + 1]):
            up = self.parents(lower)[up]
        return cells[up == parent]

    def ancestors(self, level: str, cell: int) -> list[tuple[str, int]]:
        """(level, cell) from the datacenter down to ``cell`` itself."""
        path = [(_known(level), int(cell))]
        for lower in reversed(LEVELS[1 : LEVELS.index(level) + 1]):
            path.append((LEVELS[LEVELS.index(lower) - 1], int(self.parents(lower)[path[-1][1]])))
        return path[::-1]

    def up(self, level: str, indices: np.ndarray, of: str = "node") -> np.ndarray:
        """The cell of ``level`` that holds each of ``indices`` (cells of ``of``, a level at or
        below it)."""
        if LEVELS.index(_known(of)) < LEVELS.index(_known(level)):
            raise ValueError(f"a {of} is not inside a {level}")
        up = np.asarray(indices, dtype=np.int64)
        for lower in reversed(LEVELS[LEVELS.index(level) + 1 : LEVELS.index(of) + 1]):
            up = self.parents(lower)[up]
        return up

    def count(self, level: str, where: np.ndarray, of: str = "node") -> np.ndarray:
        """How many cells of ``of`` (node or gpu) marked in ``where`` (a mask or a list of
        indices) each cell of ``level`` holds: the marks the overlays draw (nodes down, open
        faults, a job's GPUs)."""
        marked = np.flatnonzero(where) if where.dtype == bool else np.asarray(where, dtype=np.int64)
        return np.bincount(self.up(level, marked, of), minlength=self.size(level))


def _known(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
    return level


def aggregate(
    hierarchy: Hierarchy,
    level: str,
    values: np.ndarray,
    how: str,
    *,
    threshold: int = 80,
    health: np.ndarray | None = None,
) -> np.ndarray:
    """The aggregate ``how`` (see the module) of a metric's ``values`` (one per GPU, the frame's
    order) over every cell of ``level``, as float32; a cell without GPUs is NaN."""
    if how not in AGGREGATES:
        raise ValueError(f"unknown aggregate {how!r}; known: {', '.join(AGGREGATES)}")
    if len(values) != hierarchy.num_gpus:
        raise ValueError(f"{len(values)} values for {hierarchy.num_gpus} GPUs")
    cell, order, starts, counts = hierarchy._group(level)
    n = hierarchy.size(level)
    empty = counts == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        if how == "mean":
            out = np.bincount(cell, weights=values.astype(np.float64), minlength=n) / counts
        elif how == "above":
            hits = np.bincount(cell, weights=(values >= threshold).astype(np.float64), minlength=n)
            out = 100.0 * hits / counts
        elif how == "unhealthy":
            if health is None:
                raise ValueError("the unhealthy count needs the frame's health values")
            out = np.bincount(cell, weights=(health > 0).astype(np.float64), minlength=n)
        else:  # max: over each cell's run of GPUs in cell order
            out = np.zeros(n)
            if len(order):
                filled = ~empty
                out[filled] = np.maximum.reduceat(values[order].astype(np.float64), starts[filled])
    out = out.astype(np.float32)
    out[empty] = np.nan
    return out


def aggregate_all(
    hierarchy: Hierarchy,
    values: np.ndarray,
    how: str,
    *,
    threshold: int = 80,
    health: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """``aggregate`` for every level at once (what one frame gives every viewer)."""
    return {
        level: aggregate(hierarchy, level, values, how, threshold=threshold, health=health)
        for level in LEVELS
    }
