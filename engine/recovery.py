"""Recovery planning for a running job hit by a fault. Pure: it returns a plan; the caller applies it.

Order of preference for the GPUs the job lost:
1. a spare node of the same chip type in the same pod (the pool recovery takes first),
2. the best healthy placement for the lost GPUs inside the domain the job is allowed to span,
   as close to the job's other GPUs as the placement rules allow,
3. an elastic job shrinks onto the GPUs it still has (whole steps, at or above its minimum) and
   re-plans with the global batch fixed,
4. otherwise the job is requeued whole, keeping its progress up to its last usable checkpoint.
The plan never uses a GPU that is faulty, not schedulable, or held by another job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.checkpoint import CheckpointKind
from engine.faults import Action, Classification
from engine.physics import Physics
from engine.placement import LEVELS, FreePool, Layout, level_limit


@dataclass(frozen=True)
class RecoveryStep:
    name: str  # detect, checkpoint, reschedule, restart, load
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class RecoveryPlan:
    outcome: str  # "restart_in_place", "spare", "replacement", "shrink", "requeue"
    lost_gpus: np.ndarray  # job GPUs that leave the job
    replacement_gpus: np.ndarray  # GPUs that join it
    steps: tuple[RecoveryStep, ...] = field(default_factory=tuple)
    triggered_checkpoint: bool | None = None  # None: the policy has none
    reason: str = ""

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def _steps(
    c: Classification, gpus: int, state_bytes: float, from_memory: bool, moved: bool, physics: Physics
) -> list[RecoveryStep]:
    steps = [RecoveryStep("detect", c.detection_s, c.description)]
    if moved:
        steps.append(RecoveryStep("reschedule", physics.reschedule_s, "replacement GPUs chosen and prepared"))
    steps.append(
        RecoveryStep(
            "restart",
            physics.process_start_s + physics.comm_init_s(gpus),
            "process start and communicator initialization",
        )
    )
    if from_memory:
        load = state_bytes / max(gpus, 1) * 8 / (physics.peer_load_gbps * 1e9)
        steps.append(RecoveryStep("load", load, "checkpoint loaded from host memory (peers for new nodes)"))
    else:
        load = state_bytes / (physics.storage_gbps(gpus) * 1e9)
        steps.append(RecoveryStep("load", load, "checkpoint loaded from durable storage"))
    return steps


def plan_recovery(
    layout: Layout,
    job_gpus: np.ndarray,
    faulty: np.ndarray,
    classification: Classification,
    *,
    owned: np.ndarray,
    topology: str = "datacenter",
    policy: CheckpointKind | None = None,
    triggered_ok: bool | None = None,
    state_bytes: float = 0.0,
    physics: Physics | None = None,
    min_gpus: int | None = None,
    size_step: int = 1,
    yielding: np.ndarray | None = None,
) -> RecoveryPlan:
    """Plan the recovery of one job.

    ``faulty``: GPU indices that left service with this fault. ``owned``: a mask of GPUs held by any
    job (this one included). ``triggered_ok``: whether the triggered save succeeded (the caller
    draws it; None when the policy has no triggered save or memory is unreadable). ``yielding``: a
    mask of spare GPUs held by jobs that borrowed them; recovery may take them (free spares
    first), and the caller preempts their jobs.
    """
    ph = physics or Physics()
    topo = layout.topo
    job_gpus = np.asarray(job_gpus, dtype=np.int64)
    lost = np.intersect1d(job_gpus, np.asarray(faulty, dtype=np.int64))
    if not classification.interrupts_job:
        return RecoveryPlan("none", lost[:0], lost[:0], (), None, "the fault does not interrupt the job")
    from_memory = policy in (CheckpointKind.ASYNC, CheckpointKind.TRIGGERED)
    triggered = (
        triggered_ok if policy == CheckpointKind.TRIGGERED and classification.memory_readable else None
    )
    keeps_hardware = classification.action in (
        Action.RESTART_JOB,
        Action.LINK_DOWN,
        Action.OBSERVE,
        Action.RESET_WHEN_CONVENIENT,
    )
    if keeps_hardware or len(lost) == 0:
        steps = _steps(classification, len(job_gpus), state_bytes, from_memory, False, ph)
        return RecoveryPlan(
            "restart_in_place",
            lost[:0],
            lost[:0],
            tuple(steps),
            triggered,
            "restart on the same GPUs from the newest checkpoint",
        )
    usable = topo.usable() & ~owned  # spare nodes are there for this
    usable[np.asarray(faulty, dtype=np.int64)] = False
    chip = int(topo.gpu_chip[job_gpus[0]])
    need = len(lost)
    kept = np.setdiff1d(job_gpus, lost)
    # 1. spares in the job's pods, same chip
    pods = np.unique(layout.node_domain[2][topo.gpu_node[kept if len(kept) else job_gpus]])
    in_pods = np.isin(layout.node_domain[2][topo.gpu_node], pods)
    spare_here = topo.node_spare[topo.gpu_node] & (topo.gpu_chip == chip) & in_pods
    candidates = np.flatnonzero(spare_here & usable)
    if yielding is not None and len(candidates) < need:
        taken_back = yielding & topo.usable() & spare_here
        taken_back[np.asarray(faulty, dtype=np.int64)] = False
        taken_back[job_gpus] = False
        candidates = np.concatenate([candidates, np.flatnonzero(taken_back)])
    if len(candidates) >= need:
        # whole spare nodes first, in node order
        chosen = candidates[:need]
        steps = _steps(classification, len(job_gpus), state_bytes, from_memory, True, ph)
        return RecoveryPlan(
            "spare",
            lost,
            chosen,
            tuple(steps),
            triggered,
            f"{need} GPUs replaced from the spare pool of the job's pod",
        )
    # 2. a healthy placement for the lost GPUs within the job's allowed domain
    max_level = level_limit(topology)
    anchor = topo.gpu_node[kept[0]] if len(kept) else topo.gpu_node[job_gpus[0]]
    pool = FreePool(layout, usable)
    for level in range(1, max_level + 1):
        domain = int(layout.node_domain[level][anchor]) if level < len(LEVELS) - 1 else 0
        placed = pool.place(chip, need, level, within=(level, domain))
        if placed is not None:
            steps = _steps(classification, len(job_gpus), state_bytes, from_memory, True, ph)
            return RecoveryPlan(
                "replacement",
                lost,
                placed[0],
                tuple(steps),
                triggered,
                f"{need} GPUs replaced by healthy GPUs in {layout.domain_name(level, domain)}",
            )
    # 3. an elastic job shrinks onto what it has left
    if min_gpus is not None:
        size = len(kept) - len(kept) % size_step
        if size >= min_gpus and size > 0:
            # drop the GPUs of the nodes the job holds least of (a partly lost node goes first)
            nodes = topo.gpu_node[kept]
            held = np.bincount(nodes, minlength=topo.num_nodes)[nodes]
            order = np.lexsort((kept, -held))
            keep = np.sort(kept[order[:size]])
            dropped = np.setdiff1d(job_gpus, keep)
            steps = _steps(classification, size, state_bytes, from_memory, True, ph)
            return RecoveryPlan(
                "shrink",
                dropped,
                lost[:0],
                tuple(steps),
                triggered,
                f"no spare or healthy {topo.chip_names[chip]} GPUs near the job: shrunk from "
                f"{len(job_gpus)} to {size} GPUs and re-planned",
            )
    steps = [RecoveryStep("detect", classification.detection_s, classification.description)]
    return RecoveryPlan(
        "requeue",
        job_gpus,
        lost[:0],
        tuple(steps),
        triggered,
        f"no spare or healthy {topo.chip_names[chip]} GPUs near the job: requeued with its progress",
    )
