"""Topology-aware gang placement over free-GPU counts kept per node, rack, pod, datacenter and region.

A gang goes into the smallest domain (node, rack, pod, datacenter, region, then the whole
cluster) that holds all of it, up to the level the job allows. Among the domains that fit, the
one with the fewest free GPUs wins (best fit) so large contiguous blocks stay free. Inside it the
same rule repeats one level down; when no single child holds the rest, the fullest-free children
are taken whole first and the remainder goes to the child that fits it best, so a gang touches
as few racks and nodes as possible and takes whole nodes before partial ones.

Counts are NumPy arrays updated incrementally as GPUs are taken or given back: a placement costs
a few vector comparisons over the domains of one level, never a scan of every GPU.

A gang that spans nodes loads the fabric above them. Given the pods whose links are congested
(engine.fabric.congested_pods), a rack or pod domain in a congested pod is chosen last: only
when no clear domain of that level has room (``congested_choice`` then says so).
"""

from __future__ import annotations

import numpy as np

from engine.topology import TopologySnapshot

LEVELS = ("node", "rack", "pod", "datacenter", "region", "cluster")
TOPOLOGY_CONSTRAINTS = LEVELS[:-1] + ("any",)
RACK_LEVEL, POD_LEVEL = 1, 2  # the levels whose domains sit inside one pod's fabric


def level_limit(constraint: str) -> int:
    """Index in LEVELS of the largest domain a job with this topology constraint may span."""
    if constraint == "any":
        return len(LEVELS) - 1
    if constraint not in LEVELS:
        raise ValueError(
            f"unknown topology constraint {constraint!r}; known: {', '.join(TOPOLOGY_CONSTRAINTS)}"
        )
    return LEVELS.index(constraint)


class Layout:
    """Static structure derived from a snapshot: domain of every node, children of every domain."""

    def __init__(self, topo: TopologySnapshot):
        if topo.num_gpus and np.any(np.diff(topo.gpu_node) < 0):
            raise ValueError("GPUs must be ordered by node")
        self.topo = topo
        self.num_chips = len(topo.chip_names)
        self.node_chip = topo.node_chip.astype(np.int64)
        self.chip_nodes = [np.flatnonzero(self.node_chip == c) for c in range(self.num_chips)]  # ascending
        self.node_gpu_start = np.searchsorted(topo.gpu_node, np.arange(topo.num_nodes)).astype(np.int64)
        self.node_gpu_count = np.bincount(topo.gpu_node, minlength=topo.num_nodes).astype(np.int64)
        # domain index of each node at each level; the cluster is one domain
        self.node_domain = [
            np.arange(topo.num_nodes, dtype=np.int64),
            topo.node_rack.astype(np.int64),
            topo.node_pod.astype(np.int64),
            topo.node_datacenter.astype(np.int64),
            topo.node_region.astype(np.int64),
            np.zeros(topo.num_nodes, dtype=np.int64),
        ]
        self.domain_count = [
            topo.num_nodes,
            len(topo.rack_id),
            len(topo.pod_id),
            len(topo.datacenter_id),
            len(topo.region_id),
            1,
        ]
        # parent of each domain of level k (k >= 1) at level k+1, then children lists (CSR)
        parents = [
            topo.node_rack.astype(np.int64),
            topo.rack_pod.astype(np.int64),
            topo.pod_datacenter.astype(np.int64),
            topo.datacenter_region.astype(np.int64),
            np.zeros(len(topo.region_id), dtype=np.int64),
        ]
        self.children: list[tuple[np.ndarray, np.ndarray] | None] = [None]
        for k, parent in enumerate(parents, start=1):
            order = np.argsort(parent, kind="stable")
            offsets = np.searchsorted(parent[order], np.arange(self.domain_count[k] + 1))
            self.children.append((order, offsets))
        self.gpu_node = topo.gpu_node.astype(np.int64)
        # nodes of every domain of every level (CSR), to collect a whole domain's GPUs at once
        self.nodes_in: list[tuple[np.ndarray, np.ndarray]] = []
        for k in range(len(LEVELS)):
            order = np.argsort(self.node_domain[k], kind="stable")
            offsets = np.searchsorted(self.node_domain[k][order], np.arange(self.domain_count[k] + 1))
            self.nodes_in.append((order, offsets))
        # (chip, domain) of every node at every level as one flat index, for per-level bincounts
        self.flat_domain = [
            self.node_chip * self.domain_count[k] + self.node_domain[k] for k in range(len(LEVELS))
        ]
        # the most GPUs of each chip type any single domain of each level holds (static): a gang
        # larger than that never fits at that level, so placement skips the level outright
        self.level_capacity = np.zeros((len(LEVELS), self.num_chips), dtype=np.int64)
        for k in range(len(LEVELS)):
            totals = np.zeros((self.num_chips, self.domain_count[k]), dtype=np.int64)
            np.add.at(totals, (self.node_chip, self.node_domain[k]), self.node_gpu_count)
            self.level_capacity[k] = totals.max(axis=1, initial=0)

    def with_states(self, topo: TopologySnapshot) -> Layout:
        """The same structure over a snapshot whose states (not shape) changed."""
        if topo.num_gpus != self.topo.num_gpus or topo.num_nodes != self.topo.num_nodes:
            raise ValueError("the topology's shape changed; build a new Layout")
        clone = object.__new__(Layout)
        clone.__dict__.update(self.__dict__)
        clone.topo = topo
        return clone

    def domain_pod(self, level: int) -> np.ndarray:
        """The pod index of every domain of ``level`` (a node, a rack or a pod itself)."""
        out = np.zeros(self.domain_count[level], dtype=np.int64)
        out[self.node_domain[level]] = self.node_domain[POD_LEVEL]
        return out

    def children_of(self, level: int, domain: int) -> np.ndarray:
        order, offsets = self.children[level]
        return order[offsets[domain] : offsets[domain + 1]]

    def domain_name(self, level: int, domain: int) -> str:
        topo = self.topo
        if level == 0:
            return topo.node_hostname[domain]
        if level == 5:
            return "the cluster"
        key = LEVELS[level]
        names = topo.names.get(key)
        if names:
            return f"{key} {names[domain]}"
        return f"{key} #{domain}"


class FreePool:
    """Which GPUs are free, with per-domain free counts for every level and chip type."""

    def __init__(self, layout: Layout, free: np.ndarray):
        self.layout = layout
        self.free = np.asarray(free, dtype=bool).copy()
        # GPUs are ordered by node: a node's free count is one segment sum
        if layout.topo.num_gpus and (layout.node_gpu_count > 0).all():
            self.node_free = np.add.reduceat(self.free.view(np.int8), layout.node_gpu_start, dtype=np.int64)
        else:
            self.node_free = np.bincount(
                layout.gpu_node, weights=self.free, minlength=layout.topo.num_nodes
            ).astype(np.int64)
        self.level_free: list[np.ndarray] = [self.node_free]
        for k in range(1, len(LEVELS)):
            size = layout.num_chips * layout.domain_count[k]
            counts = np.bincount(layout.flat_domain[k], weights=self.node_free, minlength=size).astype(
                np.int64
            )
            self.level_free.append(counts.reshape(layout.num_chips, layout.domain_count[k]))
        self.congested: dict[int, np.ndarray] = {}  # level -> congested mask over its domains
        self.congested_choice = False  # the last find() could only use a congested domain

    def set_congestion(self, pods: np.ndarray | None) -> None:
        """The pods whose fabric links are congested (bool over pods; None: none known)."""
        self.congested = {}
        if pods is not None and np.any(pods):
            pods = np.asarray(pods, dtype=bool)
            for level in (RACK_LEVEL, POD_LEVEL):
                self.congested[level] = pods[self.layout.domain_pod(level)]

    def is_congested(self, level: int, domain: int) -> bool:
        mask = self.congested.get(level)
        return bool(mask is not None and mask[domain])

    def copy(self) -> FreePool:
        clone = object.__new__(FreePool)
        clone.layout = self.layout
        clone.congested = self.congested
        clone.congested_choice = False
        clone.free = self.free.copy()
        clone.node_free = self.node_free.copy()
        clone.level_free = [clone.node_free] + [c.copy() for c in self.level_free[1:]]
        return clone

    # --- counts --------------------------------------------------------------------------
    def counts(self, level: int, chip: int) -> np.ndarray:
        if level == 0:
            return np.where(self.layout.node_chip == chip, self.node_free, 0)
        return self.level_free[level][chip]

    def total(self, chip: int) -> int:
        return int(self.level_free[-1][chip, 0])

    def largest_block(self, chip: int, max_level: int) -> tuple[int, int, int]:
        """(free GPUs, level, domain) of the largest free block at ``max_level``."""
        counts = self.counts(max_level, chip)
        domain = int(np.argmax(counts))
        return int(counts[domain]), max_level, domain

    # --- changes -------------------------------------------------------------------------
    def _apply(self, indices: np.ndarray, sign: int) -> None:
        if len(indices) == 0:
            return
        lay = self.layout
        owners = lay.gpu_node[indices]
        node = owners[0]
        if len(owners) == 1 or (owners == node).all():
            # one node (a small job): scalar updates, no per-level scatter
            n = sign * len(owners)
            self.node_free[node] += n
            chip = lay.node_chip[node]
            for k in range(1, len(LEVELS)):
                self.level_free[k][chip, lay.node_domain[k][node]] += n
            return
        if (owners[1:] < owners[:-1]).any():
            # unsorted (several jobs' GPUs given back at once): count per node, no sort
            per_node = np.bincount(owners, minlength=len(self.node_free))
            nodes = np.flatnonzero(per_node)
            per_node = per_node[nodes]
        else:
            # segments of equal node ids in a sorted array: cheaper than np.unique's sort
            edges = np.flatnonzero(np.diff(owners)) + 1
            nodes = owners[np.concatenate(([0], edges))]
            per_node = np.diff(np.concatenate(([0], edges, [len(owners)])))
        self.node_free[nodes] += sign * per_node
        chips = lay.node_chip[nodes]
        for k in range(1, len(LEVELS)):
            np.add.at(self.level_free[k], (chips, lay.node_domain[k][nodes]), sign * per_node)

    def take(self, indices: np.ndarray) -> None:
        indices = np.asarray(indices, dtype=np.int64)
        if not self.free[indices].all():
            raise ValueError("taking GPUs that are not free")
        self.free[indices] = False
        self._apply(indices, -1)

    def give(self, indices: np.ndarray) -> None:
        indices = np.asarray(indices, dtype=np.int64)
        indices = indices[~self.free[indices]]
        self.free[indices] = True
        self._apply(indices, +1)

    def take_where_free(self, indices: np.ndarray) -> None:
        """Take those of ``indices`` that are free here (used to keep a second pool in step)."""
        indices = np.asarray(indices, dtype=np.int64)
        self.take(indices[self.free[indices]])

    # --- placement -----------------------------------------------------------------------
    def find(self, chip: int, gpus: int, max_level: int, within: tuple[int, int] | None = None):
        """The (level, domain) where a gang of ``gpus`` would go, or None. Pure: changes nothing."""
        if gpus <= 0 or self.total(chip) < gpus:
            return None
        capacity = self.layout.level_capacity[:, chip]
        for level in range(0, max_level + 1):
            if capacity[level] < gpus:
                continue
            if level == 0 and within is None:  # (congestion is marked on racks and pods only)
                # the chip's nodes only (the best fit, first in node order, as over every node)
                nodes = self.layout.chip_nodes[chip]
                free = self.node_free[nodes]
                fits = np.flatnonzero(free >= gpus)
                if fits.size:
                    self.congested_choice = False
                    return 0, int(nodes[fits[np.argmin(free[fits])]])
                continue
            counts = self.counts(level, chip)
            if within is not None:
                if level > within[0]:
                    return None
                counts = np.where(self._domains_within(level, *within), counts, 0)
            fits = np.flatnonzero(counts >= gpus)
            if fits.size:
                mask = self.congested.get(level)
                self.congested_choice = False
                if mask is not None:
                    clear = fits[~mask[fits]]
                    if clear.size:
                        fits = clear  # a domain whose uplinks are congested is chosen last
                    else:
                        self.congested_choice = True
                return level, int(fits[np.argmin(counts[fits])])
        return None

    def _domains_within(self, level: int, w_level: int, w_domain: int) -> np.ndarray:
        """Mask over the domains of ``level`` that lie inside domain ``w_domain`` of ``w_level``."""
        lay = self.layout
        mask = np.zeros(lay.domain_count[level], dtype=bool)
        nodes = np.flatnonzero(lay.node_domain[w_level] == w_domain)
        mask[lay.node_domain[level][nodes]] = True
        return mask

    def all_free_in(self, level: int, domain: int, chip: int) -> np.ndarray:
        """Every free GPU of ``chip`` in the domain, in GPU order."""
        lay = self.layout
        order, offsets = lay.nodes_in[level]
        nodes = order[offsets[domain] : offsets[domain + 1]]
        nodes = nodes[(lay.node_chip[nodes] == chip) & (self.node_free[nodes] > 0)]
        counts = lay.node_gpu_count[nodes]
        starts = lay.node_gpu_start[nodes]
        idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return idx[self.free[idx]]

    def choose(self, level: int, domain: int, chip: int, gpus: int) -> np.ndarray:
        """Pick ``gpus`` free GPUs of ``chip`` inside the domain, best fit level by level."""
        lay = self.layout
        if level == 0:
            start = lay.node_gpu_start[domain]
            free = np.flatnonzero(self.free[start : start + lay.node_gpu_count[domain]])
            if len(free) < gpus:
                raise ValueError("node has fewer free GPUs than counted")
            return (start + free[:gpus]).astype(np.int64)
        children = lay.children_of(level, domain)
        counts = self.counts(level - 1, chip)[children]
        fits = counts >= gpus
        if fits.any():
            idx = np.flatnonzero(fits)
            best = idx[np.argmin(counts[idx])]
            return self.choose(level - 1, int(children[best]), chip, gpus)
        picked: list[np.ndarray] = []
        remaining = gpus
        order = np.argsort(-counts, kind="stable")
        used = np.zeros(len(children), dtype=bool)
        for i in order:
            if counts[i] == 0:
                break
            if counts[i] >= remaining:
                # the remainder goes to the child that fits it best
                rest = np.flatnonzero((counts >= remaining) & ~used)
                best = rest[np.argmin(counts[rest])]
                picked.append(self.choose(level - 1, int(children[best]), chip, remaining))
                remaining = 0
                break
            picked.append(self.all_free_in(level - 1, int(children[i]), chip))
            used[i] = True
            remaining -= int(counts[i])
        if remaining:
            raise ValueError("domain has fewer free GPUs than counted")
        return np.concatenate(picked)

    def place(self, chip: int, gpus: int, max_level: int, within: tuple[int, int] | None = None):
        """Find and take a placement; returns (GPU indices, level, domain) or None."""
        where = self.find(chip, gpus, max_level, within)
        if where is None:
            return None
        level, domain = where
        chosen = self.choose(level, domain, chip, gpus)
        self.take(chosen)
        return chosen, level, domain
