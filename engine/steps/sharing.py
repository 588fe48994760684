"""Pack fractions of a GPU onto shared GPUs: the fragmentation-aware rule of engine.packing_scores.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.packing import TaskMix
from engine.packing_scores import choose_shared_gpu
from engine.reasons import Reason, joined
from engine.steps.admission import chip_options, record_admission
from engine.steps.state import CycleState
from engine.workload import MILLI, PendingJob

WHOLE_NODE = 8  # a gang of more GPUs needs whole nodes: it counts as a task of one whole node


# --- shared GPUs ----------------------------------------------------------------------
def admit_fraction(s: CycleState, qi: int, job: PendingJob) -> Reason | None:
    """A fraction of one GPU: among the shared GPUs with room and the fresh GPU the pools would
    give (on the fullest node), the one ``choose_shared_gpu`` picks against the kinds of work
    of the chip (its running and waiting jobs): no sliver smaller than any waiting fraction
    while that can be avoided, then the least capacity stranded."""
    reasons = []
    for c in chip_options(s, qi, job):
        check = s.quota.check(qi, c, job.demand)
        if not check.ok:
            reasons.append(check.reason)
            continue
        gpu = fraction_gpu(s, c, job.share)
        if gpu is None:
            chip, share = s.topo.chip_names[c], job.share / MILLI
            facts = {"chip": chip, "share": share}
            reasons.append(Reason(f"no {chip} GPU has {share:g} of a GPU free", "capacity", facts))
            continue
        if s.pools.open.free[gpu]:  # a fresh GPU leaves the pools and becomes shared
            s.pools.take(np.array([gpu], dtype=np.int64))
            s.shared = np.append(s.shared, gpu)
        s.gpu_used[gpu] += job.share
        node = int(s.topo.gpu_node[gpu])
        record_admission(s, qi, job, c, np.array([gpu], dtype=np.int64), 0, node)
        return None
    return joined(reasons)


def share_mix(s: CycleState, c: int) -> TaskMix:
    """The kinds of work of chip ``c`` (GPUs per job, share), running and waiting, by count."""
    mix = s.share_mixes.get(c)
    if mix is None:
        name, counts = s.topo.chip_names[c], {}
        for j in s.running:
            if j.chip == name:
                key = (1, j.share) if j.fractional else (min(len(j.held), WHOLE_NODE), MILLI)
                counts[key] = counts.get(key, 0) + 1
        for j in s.pending:
            if not j.chip_types or name in j.chip_types:
                key = (1, j.share) if j.fractional else (min(j.gpus, WHOLE_NODE), MILLI)
                counts[key] = counts.get(key, 0) + 1
        kinds = [(0, g, share, (), n) for (g, share), n in sorted(counts.items())]
        mix = s.share_mixes[c] = TaskMix.from_kinds(kinds, ["any"])
    return mix


def fraction_gpu(s: CycleState, c: int, share: int) -> int | None:
    idx = s.shared
    if len(idx):
        room = MILLI - s.gpu_used[idx]
        ok = (room >= share) & (s.topo.gpu_chip[idx] == c)
        idx = idx[ok & s.schedulable[idx] & ~s.reserved[idx]]
    where = s.pools.open.find(c, 1, 0)
    if where is not None:
        idx = np.append(idx, s.pools.open.choose(*where, c, 1)[:1]).astype(np.int64)
    if not len(idx):
        return None
    nodes = s.topo.gpu_node[idx]
    start, count = s.layout.node_gpu_start[nodes], s.layout.node_gpu_count[nodes]
    slot = np.arange(int(count.max()))[None, :]
    gpus = np.minimum(start[:, None] + slot, s.topo.num_gpus - 1)
    shared = (s.gpu_used[gpus] > 0) & s.schedulable[gpus] & ~s.reserved[gpus]
    usable = (slot < count[:, None]) & (s.pools.open.free[gpus] | shared)
    before = np.where(usable, MILLI - s.gpu_used[gpus], 0).astype(np.int64)
    return int(idx[choose_shared_gpu(share_mix(s, c), before, idx - start, share, s.min_share)])
