"""Packing tasks that share GPUs onto nodes: placement policies and the trace replay protocol.

A task asks for CPU (millicores), memory (MiB) and GPUs: none, a fraction of one GPU in
thousandths, or whole GPUs; it may restrict the GPU model. A node has CPU, memory and up to 8
GPUs of one model, each with a free capacity in thousandths; a shared GPU never exceeds 1000, and
a whole-GPU task only takes GPUs that are entirely free.

Policies:
- ``random``: any feasible node and GPU, uniformly (a seeded generator).
- ``best-fit``: the tightest fit: the GPU (for a fraction) or the node (for whole GPUs or a
  CPU-only task) left with the least free capacity.
- ``fragmentation`` (ours): fragmentation gradient descent (Weng et al., "Beware of
  Fragmentation", USENIX ATC'23). A node's fragmentation is the GPU capacity that a task drawn
  from the workload's mix could not use there: all of its free GPU capacity when the task would
  not fit (GPUs, CPU or memory), else the free capacity of the GPUs too small for it. Each task
  goes where it increases the expected fragmentation least; ties go to the tightest fit.

The replay protocol (the FGD paper's): tasks arrive in order and never leave; when the list is
exhausted, tasks are cloned at random (seeded) until the requested GPU capacity reaches a target
share of the cluster (130% by default); after each arrival the allocated share of cluster GPU
capacity is recorded against the requested share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

POLICIES = ("random", "best-fit", "fragmentation")
MAX_GPUS_PER_NODE = 8
WHOLE = 1000


@dataclass
class Nodes:
    """The cluster's nodes as arrays; ``gpu_free`` is (nodes, 8) thousandths, -1 where no GPU."""

    names: list[str]
    cpu: np.ndarray  # millicores
    mem: np.ndarray  # MiB
    gpus: np.ndarray  # GPUs per node
    model: np.ndarray  # index into models
    models: list[str]

    def fresh_state(self) -> PackState:
        gpu_free = np.full((len(self.names), MAX_GPUS_PER_NODE), -1, dtype=np.int32)
        for i, n in enumerate(self.gpus):
            gpu_free[i, :n] = WHOLE
        return PackState(self, self.cpu.astype(np.int64).copy(), self.mem.astype(np.int64).copy(), gpu_free)

    @property
    def gpu_capacity(self) -> int:
        """Total GPU capacity in thousandths."""
        return int(self.gpus.sum()) * WHOLE


@dataclass(frozen=True)
class Task:
    name: str
    cpu: int  # millicores
    mem: int  # MiB
    gpus: int  # 0: CPU only; 1 with milli < 1000: a fraction; else whole GPUs
    milli: int  # per-GPU share in thousandths (1000: whole)
    models: tuple[str, ...] = ()  # allowed GPU models; empty: any

    @property
    def demand(self) -> int:
        """GPU capacity asked for, in thousandths."""
        return self.gpus * self.milli if self.gpus else 0

    @property
    def fractional(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < WHOLE


@dataclass
class PackState:
    nodes: Nodes
    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_free: np.ndarray  # (nodes, 8) thousandths; -1: no GPU in that slot
    placements: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def allocated(self) -> int:
        """GPU capacity allocated, in thousandths."""
        free = self.gpu_free
        return self.nodes.gpu_capacity - int(free[free > 0].sum())

    def check(self) -> None:
        """Invariants: nothing overcommitted."""
        if (self.gpu_free > WHOLE).any() or ((self.gpu_free < 0) & (self.gpu_free != -1)).any():
            raise AssertionError("a GPU is overcommitted")
        if (self.cpu_free < 0).any() or (self.mem_free < 0).any():
            raise AssertionError("a node's CPU or memory is overcommitted")


@dataclass(frozen=True)
class TaskMix:
    """The workload's GPU task types and their shares: what fragmentation is measured against."""

    gpus: np.ndarray
    milli: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    share: np.ndarray

    @classmethod
    def of(cls, tasks: list[Task]) -> TaskMix:
        groups: dict[tuple[int, int], list[Task]] = {}
        for t in tasks:
            if t.gpus:
                groups.setdefault((t.gpus, t.milli), []).append(t)
        if not groups:
            return cls(*(np.zeros(0) for _ in range(5)))
        keys = sorted(groups)
        total = sum(len(v) for v in groups.values())
        return cls(
            gpus=np.array([k[0] for k in keys]),
            milli=np.array([k[1] for k in keys]),
            cpu=np.array([np.median([t.cpu for t in groups[k]]) for k in keys]),
            mem=np.array([np.median([t.mem for t in groups[k]]) for k in keys]),
            share=np.array([len(groups[k]) / total for k in keys]),
        )

    def fragmentation(self, gpu_free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
        """Expected unusable GPU capacity (thousandths) of each row's node."""
        g = np.maximum(gpu_free, 0)[:, :, None]  # (rows, 8, 1)
        total = g.sum(axis=1)  # (rows, 1)
        m = self.milli[None, None, :]
        fits_resources = (cpu_free[:, None] >= self.cpu[None, :]) & (mem_free[:, None] >= self.mem[None, :])
        fractional = self.milli < WHOLE
        # a fraction fits when some GPU has room; whole GPUs when enough are entirely free
        frac_fits = (g >= m).any(axis=1)
        whole_fits = (g == WHOLE).sum(axis=1) >= self.gpus[None, :]
        fits = fits_resources & np.where(fractional[None, :], frac_fits, whole_fits)
        small = np.where(fractional[None, None, :], g < m, g < WHOLE)  # GPUs this type cannot use
        stranded = (g * small).sum(axis=1)
        per_type = np.where(fits, stranded, total)
        return per_type @ self.share


def _feasible(state: PackState, task: Task, allowed_models: np.ndarray | None) -> np.ndarray:
    ok = (state.cpu_free >= task.cpu) & (state.mem_free >= task.mem)
    if allowed_models is not None:
        ok &= np.isin(state.nodes.model, allowed_models)
    if task.gpus == 0:
        return ok
    if task.fractional:
        return ok & (state.gpu_free >= task.milli).any(axis=1)
    return ok & ((state.gpu_free == WHOLE).sum(axis=1) >= task.gpus)


def _candidates(state: PackState, task: Task, nodes: np.ndarray):
    """(candidate nodes, GPU slot of each for a fraction, each node's free GPU milli after, tightness):
    a fraction considers one GPU per distinct free value on each node (the same outcome)."""
    free = state.gpu_free[nodes]
    if task.fractional:
        rows, slots = np.nonzero(free >= task.milli)
        key = nodes[rows].astype(np.int64) * 2048 + free[rows, slots]
        _, first = np.unique(key, return_index=True)
        rows, slots = rows[first], slots[first]
        after = free[rows].copy()
        after[np.arange(len(rows)), slots] -= task.milli
        return nodes[rows], slots, after, after[np.arange(len(rows)), slots].astype(np.float64)
    after = free.copy()
    if task.gpus:
        # the first k entirely free GPUs of each node
        whole = after == WHOLE
        after[whole & (np.cumsum(whole, axis=1) <= task.gpus)] = 0
        tight = np.where(after > 0, after, 0).sum(axis=1).astype(np.float64)
    else:
        tight = (state.cpu_free[nodes] - task.cpu).astype(np.float64)
    return nodes, None, after, tight


def _pick(policy, state, task, rng, mix, node_frag, cand_nodes, after, tight) -> int:
    """The candidate ``policy`` chooses (an index into ``cand_nodes``)."""
    if policy == "random":
        return int(rng.integers(len(cand_nodes)))
    if policy == "best-fit":
        return int(np.argmin(tight))
    if policy == "fragmentation":
        if mix is None or node_frag is None:
            raise ValueError("the fragmentation policy needs the task mix and node fragmentation")
        frag_after = mix.fragmentation(
            after, state.cpu_free[cand_nodes] - task.cpu, state.mem_free[cand_nodes] - task.mem
        )
        delta = frag_after - node_frag[cand_nodes]
        best = np.flatnonzero(delta <= delta.min() + 1e-9)
        return int(best[np.argmin(tight[best])])
    raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


def place(
    state: PackState,
    task: Task,
    policy: str,
    rng: np.random.Generator,
    mix: TaskMix | None = None,
    node_frag: np.ndarray | None = None,
) -> tuple[int, tuple[int, ...]] | None:
    """Choose (node, GPU slots) for ``task`` under ``policy`` and take the resources; None if it
    fits nowhere. ``node_frag`` (fragmentation policy) is kept up to date in place."""
    allowed = None
    if task.models:
        allowed = np.array([state.nodes.models.index(m) for m in task.models if m in state.nodes.models])
    nodes = np.flatnonzero(_feasible(state, task, allowed))
    if len(nodes) == 0:
        return None
    cand_nodes, slots, after, tight = _candidates(state, task, nodes)
    pick = _pick(policy, state, task, rng, mix, node_frag, cand_nodes, after, tight)
    node = int(cand_nodes[pick])
    if task.fractional:
        used = (int(slots[pick]),)
    elif task.gpus:
        used = tuple(int(s) for s in np.flatnonzero(state.gpu_free[node] == WHOLE)[: task.gpus])
    else:
        used = ()
    state.gpu_free[node] = after[pick]
    state.cpu_free[node] -= task.cpu
    state.mem_free[node] -= task.mem
    state.placements[task.name] = (node, used)
    if node_frag is not None and mix is not None:
        node_frag[node] = mix.fragmentation(
            state.gpu_free[node : node + 1], state.cpu_free[node : node + 1], state.mem_free[node : node + 1]
        )[0]
    return node, used


@dataclass
class ReplayCurve:
    policy: str
    requested: np.ndarray  # cumulative requested share of GPU capacity after each arrival
    allocated: np.ndarray  # allocated share after each arrival
    failed: int  # GPU tasks that found no room

    def allocated_at(self, requested_share: float) -> float:
        """Allocated share when the requested share first reaches ``requested_share``."""
        i = int(np.searchsorted(self.requested, requested_share))
        return float(self.allocated[min(i, len(self.allocated) - 1)])


def arrivals(tasks: list[Task], capacity: int, target: float, seed: int) -> list[Task]:
    """The tasks in order, then seeded random clones until requests reach ``target`` x capacity."""
    out = list(tasks)
    requested = sum(t.demand for t in out)
    rng = np.random.default_rng(seed)
    gpu_tasks = [t for t in tasks if t.gpus] or tasks
    n = 0
    while requested < target * capacity and gpu_tasks:
        t = gpu_tasks[int(rng.integers(len(gpu_tasks)))]
        n += 1
        clone = Task(f"{t.name}-clone{n}", t.cpu, t.mem, t.gpus, t.milli, t.models)
        out.append(clone)
        requested += clone.demand
    return out


def replay(
    nodes: Nodes, tasks: list[Task], policy: str, *, target: float = 1.3, seed: int = 0
) -> ReplayCurve:
    """Replay the arrival protocol under one policy (see the module docstring)."""
    stream = arrivals(tasks, nodes.gpu_capacity, target, seed)
    state = nodes.fresh_state()
    rng = np.random.default_rng(seed + 1)
    mix = TaskMix.of(tasks) if policy == "fragmentation" else None
    node_frag = mix.fragmentation(state.gpu_free, state.cpu_free, state.mem_free) if mix else None
    requested = np.zeros(len(stream))
    allocated = np.zeros(len(stream))
    asked = 0
    failed = 0
    capacity = nodes.gpu_capacity
    for i, task in enumerate(stream):
        asked += task.demand
        if place(state, task, policy, rng, mix, node_frag) is None and task.gpus:
            failed += 1
        requested[i] = asked / capacity
        allocated[i] = state.allocated / capacity
    state.check()
    return ReplayCurve(policy, requested, allocated, failed)
