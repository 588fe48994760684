"""Node scores for placing one task: BestFit, FGD and ours, over engine.packing's state.

Each scorer returns, for candidate nodes (all feasible for the task), a score (higher is better)
and, for a fraction, the GPU slot it would use there. ``Scorer`` keeps each node's scores per task
kind until the node changes, so a replay only rescores the nodes that changed since that kind was
last placed; scores are a function of one node's state, so the cache is exact.
"""

from __future__ import annotations

import numpy as np

from engine.packing import MAX_SPEC_CPU, MAX_SPEC_GPU, WHOLE, PackState, Task, TaskMix

MAX_SCORE = 100


class FragTerms:
    """Every node's free GPU capacity, per-group terms (``TaskMix.terms``) and fragmentation,
    kept current as tasks are placed."""

    def __init__(self, state: PackState, mix: TaskMix):
        self.state, self.mix = state, mix
        self.total = state.gpu_free.sum(axis=1)
        count, room = mix.terms(state.gpu_free)
        self.count, self.room = count.astype(np.float64), room.astype(np.float64)
        self.frag = mix.from_terms(
            self.total, self.count, self.room, mix.weight(state.cpu_free, state.nodes.model)
        )
        self.stranded = stranded(self.total, self.frag)

    def update(self, node: int, frag: float | None = None) -> None:
        s = self.state
        row = s.gpu_free[node : node + 1]
        total = float(row.sum())
        count, room = self.mix.terms(row)
        self.total[node], self.count[node], self.room[node] = total, count[0], room[0]
        if frag is None:
            w = self.mix.weight(s.cpu_free[node : node + 1], s.nodes.model[node : node + 1])
            frag = float(self.mix.from_terms(np.array([total]), count, room, w)[0])
        self.frag[node] = frag
        self.stranded[node] = stranded(np.float64(total), np.float64(frag))


def _sigmoid_points(removed: np.ndarray) -> np.ndarray:
    """FGD's score: sigmoid of the fragmentation removed (in GPUs), in whole points."""
    removed = np.round(removed, 6)  # the same value however the sums were ordered
    return np.floor(MAX_SCORE / (1.0 + np.exp(-removed / WHOLE)))


def _best_per_row(rows: np.ndarray, slots: np.ndarray, score: np.ndarray, frag: np.ndarray, n: int):
    """Per candidate node: the highest score over its GPUs, the lowest slot that has it, and the
    node's fragmentation after that placement."""
    order = np.lexsort((slots, -score, rows))
    first = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
    best = np.full(n, -np.inf)
    slot = np.zeros(n, dtype=np.int64)
    after = np.zeros(n)
    best[rows[first]] = score[first]
    slot[rows[first]] = slots[first]
    after[rows[first]] = frag[first]
    return best, slot, after


def best_fit_scores(state: PackState, task: Task, nodes: np.ndarray, normalise: bool = False):
    """BestFit (``best_fit_score.go``): whole points of 1 - (CPU left / 128 cores + GPU left / 8
    GPUs) / 2 after the task; a fraction takes the node's tightest GPU with room (lowest slot)."""
    cpu_left = (state.cpu_free[nodes] - task.cpu) / MAX_SPEC_CPU * 0.5
    gpu_left = (state.gpu_free[nodes].sum(axis=1) - task.demand) / MAX_SPEC_GPU * 0.5
    # whole points 0-100 (a node never has more than 128 cores or 8 GPUs left); the framework's
    # NormalizeScore then stretches them to 0-100 in integers, which keeps their order and ties,
    # so the same nodes win and the score stays a function of the node alone
    score = np.trunc((1.0 - (cpu_left + gpu_left)) * MAX_SCORE)
    if normalise and len(score) and score.max() > score.min():  # bigger nodes: NormalizeScore itself
        lo = score.min()
        score = (score - lo) * MAX_SCORE // (score.max() - lo)
    slot = None
    if task.fractional:
        free = state.gpu_free[nodes]
        slot = np.argmin(np.where(free >= task.milli, free, 2 * WHOLE), axis=1)
    return score, slot, None


def _fragmentation_after(state: PackState, task: Task, nodes: np.ndarray, mix: TaskMix, terms: FragTerms):
    """(rows into ``nodes``, slots or None, fragmentation after) for every
    way the task can go: each distinct free capacity of a GPU with room for a fraction (its
    lowest slot), else the node. Only the changed GPU's terms are recomputed."""
    weight = mix.weight(state.cpu_free[nodes] - task.cpu, state.nodes.model[nodes])
    total, count, room = terms.total[nodes], terms.count[nodes], terms.room[nodes]
    if task.fractional:
        m = task.milli
        free = state.gpu_free[nodes]
        rows, slots = np.nonzero(free >= m)
        v = free[rows, slots]
        if len(rows) > 64:  # one candidate per distinct free capacity of a node (its lowest slot)
            _, first = np.unique(rows * (2 * WHOLE + 1) + v, return_index=True)
            rows, slots, v = rows[first], slots[first], v[first]
        # what the GPU loses per group depends on its free capacity alone: once per distinct value
        values, which = np.unique(v, return_inverse=True)
        values = values[:, None]
        group = mix.group_milli[None, :]
        ge_before, ge_after = values >= group, values - m >= group  # room for the group's tasks
        lost_count = (ge_before & ~ge_after).astype(np.float64)
        lost_room = ge_before * values - ge_after * (values - m)
        frag = mix.from_terms(
            total[rows] - m, count[rows] - lost_count[which], room[rows] - lost_room[which], weight[rows]
        )
        return rows, slots, frag
    k = task.gpus  # whole GPUs: every group loses k GPUs with a whole GPU of room each
    frag = mix.from_terms(total - k * WHOLE, count - k, room - k * WHOLE, weight)
    return None, None, frag


def fgd_scores(state: PackState, task: Task, nodes: np.ndarray, mix: TaskMix, terms: FragTerms):
    """FGD (``fgd_score.go``): the sigmoid of the fragmentation the placement removes, in whole
    points; a fraction goes to the first GPU of the node with the best score."""
    rows, slots, frag = _fragmentation_after(state, task, nodes, mix, terms)
    before = terms.frag[nodes] if rows is None else terms.frag[nodes][rows]
    points = _sigmoid_points(before - frag)
    if rows is None:
        return points, None, frag
    return _best_per_row(rows, slots, points, frag, len(nodes))


LOOKAHEAD = 4  # tasks drawn from the mix that try a node before its free capacity counts as lost


def stranded(total: np.ndarray, frag: np.ndarray, lookahead: int = LOOKAHEAD) -> np.ndarray:
    """Ours: the free GPU capacity of a node that ``lookahead`` tasks drawn from the mix would all
    fail to use. FGD's fragmentation over the free capacity is the chance that one task drawn
    from the mix cannot use the node; the capacity is lost when every one of the next few
    cannot, so what counts is that chance to the power ``lookahead``. A node some kind still fits
    well costs little; a node nothing fits costs all its free capacity, which is what is left
    unallocated when the cluster fills."""
    share = np.clip(frag / np.maximum(total, 1e-9), 0.0, 1.0)
    return total * share**lookahead


SLIVER_LOOKAHEAD = 40  # tasks drawn from the mix that a partly used GPU's room waits through


def sliver_lost(mix: TaskMix, free: np.ndarray) -> np.ndarray:
    """Ours, per GPU: the free capacity of a partly used GPU that none of the next
    ``SLIVER_LOOKAHEAD`` tasks drawn from the mix could use (fractions that fit by share). The
    node's ``stranded`` looks a few tasks ahead; a GPU's leftover waits much longer, and what
    decides whether it is ever used is whether the mix has fractions small enough for it: room
    that only the mix's rare small fractions fit is lost, room that common ones fit is not. A
    wholly free GPU loses nothing (whole-GPU tasks take it)."""
    free = np.asarray(free)
    return np.where(free < WHOLE, free * (1.0 - mix.fitting_share(free)) ** SLIVER_LOOKAHEAD, 0.0)


def choose_shared_gpu(mix: TaskMix, before: np.ndarray, slot: np.ndarray, share: int, smallest: int) -> int:
    """Ours where a scheduler knows its queue (the production cycle): which of the candidate
    GPUs a fraction of ``share`` takes. Row i of ``before`` is the free capacity of the GPUs of
    candidate i's node, the candidate GPU at ``slot[i]``; the node has no CPU or memory limit.
    A GPU left with less than ``smallest`` (the smallest waiting fraction) and more than nothing is
    avoided while another candidate does not strand such a sliver; among the rest the
    ``stranded`` and ``sliver_lost`` capacity removed scores as in the replay, ties to the
    tightest GPU, then node."""
    rows = np.arange(len(before))
    after = before.copy()
    after[rows, slot] -= share
    left = after[rows, slot]
    ok = (left == 0) | (left >= smallest)
    cand = np.flatnonzero(ok) if ok.any() else rows
    cpu, model = np.ones(len(cand), dtype=np.int64), np.zeros(len(cand), dtype=np.int64)
    b, a = before[cand], after[cand]
    tb, ta = b.sum(axis=1).astype(np.float64), a.sum(axis=1).astype(np.float64)
    removed = stranded(tb, mix.fragmentation(b, cpu, model)) - stranded(ta, mix.fragmentation(a, cpu, model))
    removed += sliver_lost(mix, before[cand, slot[cand]]) - sliver_lost(mix, left[cand])
    score = _sigmoid_points(removed) - (left[cand] + 0.999 * ta / np.maximum(tb.max(), 1)) / (WHOLE + 1)
    return int(cand[np.argmax(score)])


def stranding_scores(state: PackState, task: Task, nodes: np.ndarray, mix: TaskMix, terms: FragTerms):
    """Ours: FGD's points for the capacity ``stranded`` the placement removes (measured against
    every kind of the list, not the most frequent 95%), and for a fraction the capacity
    ``sliver_lost`` it removes on its GPU; a fraction takes the tightest GPU of the node; ties
    between nodes go to the node order."""
    rows, slots, frag = _fragmentation_after(state, task, nodes, mix, terms)
    before = terms.stranded[nodes]
    after_total = terms.total[nodes] - task.demand
    if rows is None:
        return _sigmoid_points(before - stranded(after_total, frag)), None, frag
    room = state.gpu_free[nodes[rows], slots]
    slot_left = room - task.milli
    removed = (
        before[rows]
        - stranded(after_total[rows], frag)
        + sliver_lost(mix, room)
        - sliver_lost(mix, slot_left)
    )
    return _best_per_row(rows, slots, _sigmoid_points(removed) - slot_left / (WHOLE + 1), frag, len(nodes))


class Scorer:
    """Chooses a node (and GPU) for each task under one policy and keeps the fragmentation of
    every node current; see the module docstring for the cache."""

    LOCAL = ("best-fit", "fgd", "fragmentation")  # node scores that depend on that node alone
    FRAGMENTATION = ("fgd", "fragmentation")  # policies that keep every node's fragmentation

    def __init__(self, policy: str, state: PackState, mix: TaskMix, rng: np.random.Generator):
        self.policy, self.state, self.mix, self.rng = policy, state, mix, rng
        nodes = state.nodes
        big = int(nodes.cpu.max()) > MAX_SPEC_CPU  # BestFit's normalisation then merges scores
        self.local = policy in self.LOCAL and not (big and policy == "best-fit")
        self.normalise = big
        self.keeps_frag = policy in self.FRAGMENTATION
        self.terms = FragTerms(state, mix) if self.keeps_frag else None
        self._frag_after: tuple[int, float] | None = None  # (node, fragmentation) of the last choice
        self.version = np.zeros(len(nodes.names), dtype=np.int64)
        self.step = 0
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._allowed: dict[tuple, np.ndarray] = {}

    def forget_scores(self) -> None:
        """Drop every cached score: the next task of each kind scores all its feasible nodes."""
        self._cache.clear()

    def scores(self, task: Task, nodes: np.ndarray):
        if self.policy == "best-fit":
            return best_fit_scores(self.state, task, nodes, self.normalise)
        if self.policy == "fgd":
            return fgd_scores(self.state, task, nodes, self.mix, self.terms)
        if self.policy == "fragmentation":
            return stranding_scores(self.state, task, nodes, self.mix, self.terms)
        raise ValueError(f"no scores for policy {self.policy!r}")

    def _local_scores(self, task: Task, nodes: np.ndarray):
        key = task.kind
        entry = self._cache.get(key)
        if entry is None:
            n = len(self.version)
            entry = self._cache[key] = (
                np.full(n, -1, np.int64),
                np.zeros(n),
                np.zeros(n, np.int64),
                np.zeros(n),
            )
        at, score, slot, frag = entry
        stale = nodes[at[nodes] < self.version[nodes]]
        if len(stale):
            s, g, f = self.scores(task, stale)
            score[stale] = s
            if f is not None:
                frag[stale] = f
            if g is not None:
                slot[stale] = g
            at[stale] = self.step
        return score[nodes], (slot[nodes] if task.fractional else None), frag[nodes]

    def choose(self, task: Task, rank: np.ndarray) -> tuple[int, int | None] | None:
        """(node, GPU slot for a fraction) or None when the task fits nowhere."""
        allowed = self._allowed.get(task.models)
        if allowed is None:
            allowed = self._allowed[task.models] = self.state.nodes.allowed(task.models)
        nodes = np.flatnonzero(self.state.feasible(task, allowed))
        if not len(nodes):
            return None
        if self.policy == "random":
            node = int(nodes[self.rng.integers(len(nodes))])
            if not task.fractional:
                return node, None
            slots = np.flatnonzero(self.state.gpu_free[node] >= task.milli)
            return node, int(slots[self.rng.integers(len(slots))])
        if self.local:
            score, slot, frag = self._local_scores(task, nodes)
        else:
            score, slot, frag = self.scores(task, nodes)
        best = np.flatnonzero(score >= score.max())
        pick = best[np.argmin(rank[nodes[best]])]
        if self.keeps_frag:
            self._frag_after = (int(nodes[pick]), float(frag[pick]))
        return int(nodes[pick]), (int(slot[pick]) if slot is not None else None)

    def take(self, task: Task, node: int, slot: int | None) -> tuple[int, ...]:
        used = self.state.take(task, node, slot)
        self.step += 1
        self.version[node] = self.step
        if self.keeps_frag:  # the fragmentation after, as scored when the node was chosen
            chosen, frag = self._frag_after or (None, None)
            self.terms.update(node, frag if chosen == node else None)
            self._frag_after = None
        return used
