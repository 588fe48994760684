"""The trace replay protocol of the FGD paper's simulator (hkust-adsl/kubernetes-scheduler-simulator,
``core.go`` and ``simulator.go``), and the allocation curve it is measured by.

1. Tasks sorted by name, then shuffled with the run's seed.
2. Inflation ("tune") to ``target`` x GPU capacity: clones drawn uniformly from all original tasks
   (CPU-only included) are appended until the next clone's per-GPU share would pass the target.
3. Nodes get a seeded random order; among the best-scoring nodes the first in it wins.
4. Each task is tried once, in order; one that fits nowhere is dropped; tasks never leave.
5. After every attempt: allocated GPU capacity over cluster capacity, against the GPU capacity
   of all tasks attempted so far. The figure at x% (whole percent) is the mean allocation over
   the attempts whose requested share rounds to x (the neighbours' when none does).

One seeded generator drives the shuffle, the inflation, the node order and the random policy, in
that order, as the simulator's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.packing import POPULARITY, WHOLE, Nodes, PackState, Task, TaskMix
from engine.packing_scores import Scorer

POLICIES = ("random", "best-fit", "fgd", "fragmentation")


def mix_for(policy: str, tasks: list[Task], models: list[str]) -> TaskMix:
    """What a policy measures fragmentation against: FGD the most frequent kinds up to 95% of
    tasks (the paper's typical pods); ours every kind of the list."""
    return TaskMix.of(tasks, models, popularity=1.0 if policy == "fragmentation" else POPULARITY)


def arrivals(tasks: list[Task], capacity: int, target: float, rng: np.random.Generator) -> list[Task]:
    """The tasks by name, shuffled, then inflated (or trimmed) to ``target`` x capacity."""
    by_name = sorted(tasks, key=lambda t: t.name)
    out = [by_name[i] for i in rng.permutation(len(by_name))]
    asked = sum(t.demand for t in out)
    goal = target * capacity
    if asked > goal:  # trim at random until under the target
        while asked > goal and out:
            asked -= out.pop(int(rng.integers(len(out)))).demand
        return out
    i = 0
    while by_name:
        t = by_name[int(rng.integers(len(by_name)))]
        if asked + t.milli * (t.gpus > 0) > goal:
            break
        out.append(Task(f"{t.name}-tuned-{i}", t.cpu, t.mem, t.gpus, t.milli, t.models))
        asked += t.demand
        i += 1
    return out


@dataclass
class ReplayCurve:
    policy: str
    requested: np.ndarray  # requested share of GPU capacity after each attempt
    allocated: np.ndarray  # allocated share after each attempt
    failed: int  # GPU tasks that found no room
    unallocated: dict[str, int] = field(default_factory=dict)  # ``unallocated`` at the end of the run

    def allocated_at(self, percent: int) -> float:
        """The simulator's figure: mean allocated share (in %) over the attempts whose requested
        share rounds to ``percent``; the attempts within one point of it when none does."""
        x = np.round(self.requested * 100)
        return self._figure(x, np.round(self.allocated * 100, 2), percent)

    @staticmethod
    def _figure(x: np.ndarray, allocated: np.ndarray, percent: int) -> float:
        at = x == percent
        if not at.any():
            at = np.abs(x - percent) <= 1
        if not at.any():
            return float("nan")
        return float(np.mean(allocated[at]))

    def points(self, last: int = 130) -> dict[int, float]:
        """The figure at every whole percent up to ``last`` that the run reached."""
        x, allocated = np.round(self.requested * 100), np.round(self.allocated * 100, 2)
        out = {}
        for p in range(last + 1):
            v = self._figure(x, allocated, p)
            if v == v:
                out[p] = round(v, 2)
        return out


def unallocated(state: PackState, tasks: list[Task]) -> dict[str, int]:
    """Where the GPU capacity a run left unallocated sits, in thousandths: on GPUs wholly free, on
    GPUs partly used, and (of both) on GPUs where no GPU task of the list fits any more, by its
    share, its GPU count, the node's CPU and memory left, or its model."""
    free = state.gpu_free
    usable = np.zeros(free.shape, dtype=bool)
    kinds = {(t.cpu, t.mem, t.gpus, t.milli, t.models): t for t in tasks if t.gpus}  # one task per kind
    for task in kinds.values():
        room = (free >= task.milli) if task.fractional else (free == WHOLE)
        usable |= state.feasible(task)[:, None] & room
    return {
        "whole_gpus": int(free[free == WHOLE].sum()),
        "partial_gpus": int(free[(free > 0) & (free < WHOLE)].sum()),
        "no_task_fits": int(free[~usable].sum()),
    }


def replay(
    nodes: Nodes,
    tasks: list[Task],
    policy: str,
    *,
    target: float = 1.3,
    seed: int = 42,
    mix: TaskMix | None = None,
) -> ReplayCurve:
    """Replay ``tasks`` on ``nodes`` under ``policy`` by the protocol above."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    rng = np.random.default_rng(seed)
    stream = arrivals(tasks, nodes.gpu_capacity, target, rng)
    rank = np.empty(len(nodes.names), dtype=np.int64)
    rank[np.argsort(nodes.names, kind="stable")] = rng.permutation(len(nodes.names))
    state = nodes.fresh_state()
    scorer = Scorer(policy, state, mix or mix_for(policy, tasks, nodes.models), rng)
    capacity = nodes.gpu_capacity
    requested = np.zeros(len(stream))
    allocated = np.zeros(len(stream))
    asked = failed = 0
    used = 0
    for i, task in enumerate(stream):
        asked += task.demand
        choice = scorer.choose(task, rank)
        if choice is None:
            failed += task.gpus > 0
        else:
            scorer.take(task, *choice)
            used += task.demand
        requested[i] = asked / capacity
        allocated[i] = used / capacity
    state.check()
    if used != state.allocated:
        raise AssertionError("allocated capacity does not add up")
    return ReplayCurve(policy, requested, allocated, failed, unallocated(state, tasks))


def mean_figures(curves: list[ReplayCurve], percents=(100, 130)) -> dict[str, float]:
    """The mean over seeds of each figure, as the paper reports it."""
    return {str(p): round(float(np.mean([c.allocated_at(p) for c in curves])), 2) for p in percents}
