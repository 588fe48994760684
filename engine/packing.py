"""Packing tasks that share GPUs onto nodes: the cluster state, the workload mix, the scores.

A task asks for CPU (millicores), memory (MiB) and GPUs: none, a fraction of one GPU in
thousandths, or whole GPUs; it may restrict the GPU model. A node has CPU, memory and up to 8
GPUs of one model, each with a free capacity in thousandths; a shared GPU never exceeds 1000, and
a whole-GPU task only takes GPUs that are entirely free.

Scores (engine.packing_policies turns them into a node and GPU per policy):
- ``best_fit_scores``: BestFit of the FGD paper's simulator (hkust-adsl/kubernetes-scheduler-
  simulator, ``best_fit_score.go``): CPU and GPU left over after the task, weighted equally,
  normalised by 128 cores and 8 GPUs, scaled to whole points 0-100 (higher is tighter).
- ``fgd_scores``: fragmentation gradient descent (Weng et al., "Beware of Fragmentation", USENIX
  ATC'23; ``fgd_score.go``, ``frag.go``): a node's fragmentation is the GPU capacity that a task
  drawn from the workload's mix (``TaskMix``) could not use there; the score is the sigmoid of the
  fragmentation the placement removes, in whole points, and a fraction goes to the GPU of the
  node that scores best.
- ``stranding_scores``: ours, the fragmentation measure refined (see ``TaskMix.stranding``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

MAX_GPUS_PER_NODE = 8
WHOLE = 1000
MAX_SPEC_CPU = 128_000  # the simulator's normalisers: 128 cores, 8 GPUs
MAX_SPEC_GPU = 8 * WHOLE
POPULARITY = 0.95  # the mix keeps the most frequent task kinds up to this share of tasks


@dataclass
class Nodes:
    """The cluster's nodes as arrays."""

    names: list[str]
    cpu: np.ndarray  # millicores
    mem: np.ndarray  # MiB
    gpus: np.ndarray  # GPUs per node
    model: np.ndarray  # index into models
    models: list[str]

    def fresh_state(self) -> PackState:
        slots = np.arange(MAX_GPUS_PER_NODE)[None, :] < np.asarray(self.gpus)[:, None]
        gpu_free = np.where(slots, WHOLE, 0).astype(np.int64)
        return PackState(self, self.cpu.astype(np.int64).copy(), self.mem.astype(np.int64).copy(), gpu_free)

    @property
    def gpu_capacity(self) -> int:
        """Total GPU capacity in thousandths."""
        return int(np.asarray(self.gpus).sum()) * WHOLE

    def allowed(self, models: tuple[str, ...]) -> np.ndarray:
        """Which nodes a task restricted to ``models`` may use (all when unrestricted)."""
        if not models:
            return np.ones(len(self.names), dtype=bool)
        wanted = [i for i, m in enumerate(self.models) if m in models]
        return np.isin(self.model, wanted)


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

    @property
    def kind(self) -> tuple:
        """What placement depends on besides memory: CPU, GPUs, share, models."""
        return (self.cpu, self.gpus, self.milli if self.gpus else 0, self.models)


@dataclass
class PackState:
    nodes: Nodes
    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_free: np.ndarray  # (nodes, 8) thousandths; 0 in slots with no GPU
    placements: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    def __post_init__(self):
        # per node: the most free capacity on one GPU, and the GPUs entirely free
        self.most_free = self.gpu_free.max(axis=1)
        self.whole_free = (self.gpu_free == WHOLE).sum(axis=1)

    def _refresh(self, node: int) -> None:
        self.most_free[node] = self.gpu_free[node].max()
        self.whole_free[node] = int((self.gpu_free[node] == WHOLE).sum())

    @property
    def allocated(self) -> int:
        """GPU capacity allocated, in thousandths."""
        return self.nodes.gpu_capacity - int(self.gpu_free.sum())

    def feasible(self, task: Task, allowed: np.ndarray | None = None) -> np.ndarray:
        """The nodes ``task`` fits on: CPU and memory, the model, a GPU with room for a fraction or
        enough entirely free GPUs."""
        ok = (self.cpu_free >= task.cpu) & (self.mem_free >= task.mem)
        if task.gpus == 0:
            return ok
        ok &= self.nodes.allowed(task.models) if allowed is None else allowed
        if task.fractional:
            return ok & (self.most_free >= task.milli)
        return ok & (self.whole_free >= task.gpus)

    def take(self, task: Task, node: int, slot: int | None = None) -> tuple[int, ...]:
        """Give ``task`` node ``node`` (a fraction: GPU ``slot``; whole GPUs: the first free ones)."""
        if task.fractional:
            if slot is None or self.gpu_free[node, slot] < task.milli:
                raise ValueError(f"GPU {slot} of node {node} has no room for {task.milli} thousandths")
            self.gpu_free[node, slot] -= task.milli
            used: tuple[int, ...] = (int(slot),)
        elif task.gpus:
            used = tuple(int(s) for s in np.flatnonzero(self.gpu_free[node] == WHOLE)[: task.gpus])
            if len(used) < task.gpus:
                raise ValueError(f"node {node} has fewer than {task.gpus} free GPUs")
            self.gpu_free[node, list(used)] = 0
        else:
            used = ()
        self.cpu_free[node] -= task.cpu
        self.mem_free[node] -= task.mem
        self.placements[task.name] = (node, used)
        if task.gpus:
            self._refresh(node)
        return used

    def check(self) -> None:
        """Invariants: nothing overcommitted."""
        slots = np.arange(MAX_GPUS_PER_NODE)[None, :] < np.asarray(self.nodes.gpus)[:, None]
        if (self.gpu_free > WHOLE).any() or (self.gpu_free < 0).any() or (self.gpu_free[~slots] != 0).any():
            raise AssertionError("a GPU is overcommitted")
        if (self.cpu_free < 0).any() or (self.mem_free < 0).any():
            raise AssertionError("a node's CPU or memory is overcommitted")


@dataclass(frozen=True)
class TaskMix:
    """The workload's task kinds and their shares: what fragmentation is measured against (the
    FGD simulator's typical pods: kinds keyed by CPU, GPU count, share and models, CPU-only
    included, the most frequent first until ``POPULARITY`` of all tasks, shares renormalised).

    Kinds are grouped by (share, GPU count, models): within a group the share of kinds a node's CPU
    still serves is a step function of its free CPU (``weights[level, group]``)."""

    thresholds: np.ndarray  # distinct per-GPU shares of the GPU kinds
    group_threshold: np.ndarray  # (groups,) index into thresholds
    group_gpus: np.ndarray  # (groups,) GPUs per task
    group_access: np.ndarray  # (groups, node models) may a group use a model
    cpu_levels: np.ndarray  # sorted distinct CPU requests of the GPU kinds
    weights: np.ndarray  # (levels + 1, groups): share of a group's kinds within free CPU
    kinds: tuple  # ((cpu, gpus, milli, models, count), ...) most frequent first
    models: tuple  # the node models access is computed for

    @classmethod
    def of(cls, tasks: list[Task], models: list[str], popularity: float = POPULARITY) -> TaskMix:
        counts: dict[tuple, int] = {}
        for t in tasks:
            key = (t.cpu, t.gpus, t.milli if t.gpus else 0, t.models)
            counts[key] = counts.get(key, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][:3], "|".join(kv[0][3])))
        kept, cum = [], 0
        for key, n in ranked:
            if cum >= popularity * len(tasks):
                break
            kept.append((*key, n))
            cum += n
        return cls.from_kinds(kept, models)

    @classmethod
    def from_kinds(cls, kinds, models) -> TaskMix:
        """A mix of (cpu, gpus, milli, models, count) kinds, shares in proportion to count."""
        kinds = tuple(kinds)
        cum = sum(k[4] for k in kinds) or 1
        gpu_kinds = [k for k in kinds if k[1]]
        thresholds = np.array(sorted({k[2] for k in gpu_kinds}), dtype=np.int64)
        groups = sorted({(k[2], k[1], k[3]) for k in gpu_kinds})
        cpu_levels = np.array(sorted({k[0] for k in gpu_kinds}), dtype=np.int64)
        weights = np.zeros((len(cpu_levels) + 1, len(groups)))
        index = {g: i for i, g in enumerate(groups)}
        for cpu, gpus, milli, allowed, n in gpu_kinds:
            weights[int(np.searchsorted(cpu_levels, cpu)) + 1 :, index[(milli, gpus, allowed)]] += n / cum
        access = np.array([[not g[2] or m in g[2] for m in models] for g in groups], dtype=bool).reshape(
            len(groups), len(models)
        )
        return cls(
            thresholds=thresholds,
            group_threshold=np.searchsorted(thresholds, [g[0] for g in groups]).astype(np.int64),
            group_gpus=np.array([g[1] for g in groups], dtype=np.int64),
            group_access=access,
            cpu_levels=cpu_levels,
            weights=weights,
            kinds=kinds,
            models=tuple(models),
        )

    @cached_property
    def _fraction_shares(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct shares of the fractional kinds, ascending, and the share of all tasks that
        are fractions of at most each (``cum[i]``: of the ``i`` smallest shares; ``cum[0]`` = 0)."""
        total = sum(k[4] for k in self.kinds) or 1
        counts: dict[int, int] = {}
        for _, gpus, milli, _, n in self.kinds:
            if gpus == 1 and 0 < milli < WHOLE:
                counts[milli] = counts.get(milli, 0) + n
        shares = np.array(sorted(counts), dtype=np.int64)
        return shares, np.concatenate([[0.0], np.cumsum([counts[m] / total for m in shares])])

    def fitting_share(self, free: np.ndarray) -> np.ndarray:
        """For each GPU's free capacity: the share of the mix's tasks that are fractions fitting in
        it (by share alone, whatever their CPU or model)."""
        shares, cum = self._fraction_shares
        return cum[np.searchsorted(shares, free, side="right")]

    @property
    def group_milli(self) -> np.ndarray:
        return self.thresholds[self.group_threshold]

    def terms(self, gpu_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, groups): the GPUs with room for one of each group's tasks, and their free capacity."""
        ge = gpu_free[:, :, None] >= self.group_milli[None, None, :]  # (rows, 8, groups)
        return ge.sum(axis=1), (gpu_free[:, :, None] * ge).sum(axis=1)

    @cached_property
    def _model_weights(self) -> np.ndarray:
        """(models, levels + 1, groups): ``weights`` where each model may be used, else 0."""
        return self.weights[None, :, :] * self.group_access.T[:, None, :]

    def weight(self, cpu_free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """(rows, groups): the share of each group's kinds that fit the row's CPU and model."""
        return self._model_weights[model, np.searchsorted(self.cpu_levels, cpu_free, side="right")]

    def from_terms(self, total, count, room, weight) -> np.ndarray:
        """Fragmentation from a node's free capacity, its ``terms`` and ``weight``."""
        usable = np.where(count >= self.group_gpus[None, :], room, 0) * weight
        return total - usable.sum(axis=1)

    def fragmentation(self, gpu_free: np.ndarray, cpu_free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """FGD's measure: each row's expected free GPU capacity that a task drawn from the mix
        could not use (all of it for CPU-only kinds and kinds that do not fit)."""
        count, room = self.terms(gpu_free)
        return self.from_terms(gpu_free.sum(axis=1), count, room, self.weight(cpu_free, model))
