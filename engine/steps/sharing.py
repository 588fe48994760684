"""Pack fractions of a GPU onto shared GPUs: the fragmentation-aware rule of engine.packing_scores.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.packing import TaskMix
from engine.packing_scores import choose_shared_gpu
from engine.reasons import Reason, joined
from engine.workload import MILLI, PendingJob

WHOLE_NODE = 8  # a gang of more GPUs needs whole nodes: it counts as a task of one whole node


class SharingStep:
    # --- shared GPUs ----------------------------------------------------------------------
    def _admit_fraction(self, qi: int, job: PendingJob) -> Reason | None:
        """A fraction of one GPU: among the shared GPUs with room and the fresh GPU the pools would
        give (on the fullest node), the one ``choose_shared_gpu`` picks against the kinds of work
        of the chip (its running and waiting jobs): no sliver smaller than any waiting fraction
        while that can be avoided, then the least capacity stranded."""
        reasons = []
        for c in self._chip_options(qi, job):
            check = self.quota.check(qi, c, job.demand)
            if not check.ok:
                reasons.append(check.reason)
                continue
            gpu = self._fraction_gpu(c, job.share)
            if gpu is None:
                chip, share = self.topo.chip_names[c], job.share / MILLI
                facts = {"chip": chip, "share": share}
                reasons.append(Reason(f"no {chip} GPU has {share:g} of a GPU free", "capacity", facts))
                continue
            if self.pools.open.free[gpu]:  # a fresh GPU leaves the pools and becomes shared
                self.pools.take(np.array([gpu], dtype=np.int64))
                self.shared = np.append(self.shared, gpu)
            self.gpu_used[gpu] += job.share
            node = int(self.topo.gpu_node[gpu])
            self._record_admission(qi, job, c, np.array([gpu], dtype=np.int64), 0, node)
            return None
        return joined(reasons)

    def _share_mix(self, c: int) -> TaskMix:
        """The kinds of work of chip ``c`` (GPUs per job, share), running and waiting, by count."""
        mix = self.share_mixes.get(c)
        if mix is None:
            name, counts = self.topo.chip_names[c], {}
            for j in self.running:
                if j.chip == name:
                    key = (1, j.share) if j.fractional else (min(len(j.held), WHOLE_NODE), MILLI)
                    counts[key] = counts.get(key, 0) + 1
            for j in self.pending:
                if not j.chip_types or name in j.chip_types:
                    key = (1, j.share) if j.fractional else (min(j.gpus, WHOLE_NODE), MILLI)
                    counts[key] = counts.get(key, 0) + 1
            kinds = [(0, g, share, (), n) for (g, share), n in sorted(counts.items())]
            mix = self.share_mixes[c] = TaskMix.from_kinds(kinds, ["any"])
        return mix

    def _fraction_gpu(self, c: int, share: int) -> int | None:
        idx = self.shared
        if len(idx):
            room = MILLI - self.gpu_used[idx]
            ok = (room >= share) & (self.topo.gpu_chip[idx] == c)
            idx = idx[ok & self.schedulable[idx] & ~self.reserved[idx]]
        where = self.pools.open.find(c, 1, 0)
        if where is not None:
            idx = np.append(idx, self.pools.open.choose(*where, c, 1)[:1]).astype(np.int64)
        if not len(idx):
            return None
        nodes = self.topo.gpu_node[idx]
        start, count = self.layout.node_gpu_start[nodes], self.layout.node_gpu_count[nodes]
        slot = np.arange(int(count.max()))[None, :]
        gpus = np.minimum(start[:, None] + slot, self.topo.num_gpus - 1)
        shared = (self.gpu_used[gpus] > 0) & self.schedulable[gpus] & ~self.reserved[gpus]
        usable = (slot < count[:, None]) & (self.pools.open.free[gpus] | shared)
        before = np.where(usable, MILLI - self.gpu_used[gpus], 0).astype(np.int64)
        return int(idx[choose_shared_gpu(self._share_mix(c), before, idx - start, share, self.min_share)])
