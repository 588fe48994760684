"""Move running work off draining nodes; report the nodes left empty.

A step of the scheduling cycle: functions over its state (engine.steps.state.CycleState:
pools, quota, result)."""

from __future__ import annotations

import numpy as np

from engine.steps.admission import charge
from engine.steps.state import CycleState
from engine.workload import Preemption


# --- 0. drains ------------------------------------------------------------------------
def drain(s: CycleState) -> None:
    """Running work leaves draining nodes: at the node's deadline, or at once without one (it
    is preempted, so it saves first where its policy can, and requeued). A draining node with
    nothing left on it is drained, ready for repair."""
    deadlines = s.topo.drain_deadlines(s.now)
    draining = ~np.isnan(deadlines)
    if not draining.any():
        return
    held = np.zeros(s.topo.num_nodes, dtype=bool)
    for job in s.running:
        nodes = s.topo.gpu_node[job.held]
        due = deadlines[nodes]
        on = ~np.isnan(due)
        if not on.any() or s.now < due[on].min():
            held[nodes] = True
            continue
        node = int(nodes[on][np.argmin(due[on])])
        late = s.topo.node_drain_deadline is not None and not np.isnan(s.topo.node_drain_deadline[node])
        reason = f"node {s.topo.node_hostname[node]} is draining" + (
            " and its deadline has passed" if late else ""
        )
        s.victims.add(job.id)
        charge(s, job, -1)
        if job.fractional:
            s.gpu_used[job.held] -= job.share
        else:  # its GPUs on other nodes are free again
            s.pools.give(job.held[s.schedulable[job.held]])
        s.result.preemptions.append(Preemption(job.id, None, reason))
    s.result.drained = [int(n) for n in np.flatnonzero(draining & ~held)]
