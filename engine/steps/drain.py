"""Move running work off draining nodes; report the nodes left empty.

A step of engine.scheduler.Cycle: it works on the cycle's state (pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.workload import Preemption


class DrainStep:
    # --- 0. drains ------------------------------------------------------------------------
    def _drain(self) -> None:
        """Running work leaves draining nodes: at the node's deadline, or at once without one (it
        is preempted, so it saves first where its policy can, and requeued). A draining node with
        nothing left on it is drained, ready for repair."""
        deadlines = self.topo.drain_deadlines(self.now)
        draining = ~np.isnan(deadlines)
        if not draining.any():
            return
        held = np.zeros(self.topo.num_nodes, dtype=bool)
        for job in self.running:
            nodes = self.topo.gpu_node[job.held]
            due = deadlines[nodes]
            on = ~np.isnan(due)
            if not on.any() or self.now < due[on].min():
                held[nodes] = True
                continue
            node = int(nodes[on][np.argmin(due[on])])
            late = self.topo.node_drain_deadline is not None and not np.isnan(
                self.topo.node_drain_deadline[node]
            )
            reason = f"node {self.topo.node_hostname[node]} is draining" + (
                " and its deadline has passed" if late else ""
            )
            self.victims.add(job.id)
            self._charge(job, -1)
            if job.fractional:
                self.gpu_used[job.held] -= job.share
            else:  # its GPUs on other nodes are free again
                self.pools.give(job.held[self.schedulable[job.held]])
            self.result.preemptions.append(Preemption(job.id, None, reason))
        self.result.drained = [int(n) for n in np.flatnonzero(draining & ~held)]
