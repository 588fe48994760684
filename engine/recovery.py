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

from engine.faults import Classification
from engine.physics import Physics
from engine.placement import LEVELS, FreePool, Layout, level_limit
from engine.policy import NO_POLICY, CheckpointPolicy
from engine.tiers import Step, detection_seconds, recovery_steps

RecoveryStep = Step  # one step of a recovery: engine.tiers says what each tier does


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
        """From the fault until the job trains again."""
        return sum(s.seconds for s in self.steps if s.throughput_lost >= 1.0)

    @property
    def degraded_s(self) -> float:
        """Full-throughput seconds the job gives up while it trains on without a replica group."""
        return sum(s.seconds * s.throughput_lost for s in self.steps if s.throughput_lost < 1.0)


def _steps(
    c: Classification,
    gpus: int,
    state_bytes: float,
    from_memory: bool,
    moved: bool,
    physics: Physics,
    policy: CheckpointPolicy,
    step_s: float,
) -> list[RecoveryStep]:
    return recovery_steps(
        c,
        policy.tier,
        gpus=gpus,
        state=state_bytes,
        from_memory=from_memory,
        moved=moved,
        step_s=step_s,
        replica_groups=policy.replica_groups,
        ph=physics,
    )


def plan_recovery(
    layout: Layout,
    job_gpus: np.ndarray,
    faulty: np.ndarray,
    classification: Classification,
    *,
    owned: np.ndarray,
    topology: str = "datacenter",
    policy: CheckpointPolicy | None = None,
    triggered_ok: bool | None = None,
    state_bytes: float = 0.0,
    physics: Physics | None = None,
    min_gpus: int | None = None,
    size_step: int = 1,
    yielding: np.ndarray | None = None,
    step_s: float = 0.0,
) -> RecoveryPlan:
    """Plan the recovery of one job.

    ``faulty``: GPU indices that left service with this fault (the fault verdict's ``out``,
    engine.lifecycle.judge: none for a fault that keeps the hardware, the node's for a lemon).
    ``owned``: a mask of GPUs held by any job (this one included). ``triggered_ok``: whether the
    triggered save succeeded (the caller draws it; None when the policy has no triggered save or
    memory is unreadable). ``yielding``: a mask of spare GPUs held by jobs that borrowed them;
    recovery may take them (free spares first), and the caller preempts their jobs. ``policy``: the
    job's checkpoint policy (engine.policy; none given: no checkpoints, the restart tier), whose
    kind says what it restores from and whose tier how long detection and each step take;
    ``step_s``: the job's training step.
    """
    ph = physics or Physics()
    policy = policy or NO_POLICY
    topo = layout.topo
    job_gpus = np.asarray(job_gpus, dtype=np.int64)
    lost = np.intersect1d(job_gpus, np.asarray(faulty, dtype=np.int64))
    if not classification.interrupts_job:
        return RecoveryPlan("none", lost[:0], lost[:0], (), None, "the fault does not interrupt the job")
    from_memory = policy.saves_from_memory
    triggered = triggered_ok if policy.triggered and classification.memory_readable else None
    if len(lost) == 0:  # nothing the job runs on left service: it restarts where it is
        steps = _steps(classification, len(job_gpus), state_bytes, from_memory, False, ph, policy, step_s)
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
    kept = np.setdiff1d(job_gpus, lost)
    c, memory = classification, from_memory
    ctx = _Ctx(
        layout, job_gpus, lost, kept, chip, usable, c, state_bytes, memory, triggered, ph, policy, step_s
    )
    plan = (
        _from_spares(ctx, np.asarray(faulty, dtype=np.int64), yielding)
        or _from_healthy(ctx, level_limit(topology))
        or _by_shrinking(ctx, min_gpus, size_step)
    )
    if plan is not None:
        return plan
    detect = detection_seconds(classification, policy.tier, step_s)
    steps = [RecoveryStep("detect", detect, classification.description)]
    return RecoveryPlan(
        "requeue",
        job_gpus,
        lost[:0],
        tuple(steps),
        triggered,
        f"no spare or healthy {topo.chip_names[chip]} GPUs near the job: requeued with its progress",
    )


@dataclass(frozen=True)
class _Ctx:
    layout: Layout
    job_gpus: np.ndarray
    lost: np.ndarray
    kept: np.ndarray
    chip: int
    usable: np.ndarray  # in service, not held by anyone, not faulty
    classification: Classification
    state_bytes: float
    from_memory: bool
    triggered: bool | None
    ph: Physics
    policy: CheckpointPolicy
    step_s: float

    def plan(self, outcome: str, dropped, replacements, gpus: int, reason: str) -> RecoveryPlan:
        steps = _steps(
            self.classification,
            gpus,
            self.state_bytes,
            self.from_memory,
            True,
            self.ph,
            self.policy,
            self.step_s,
        )
        return RecoveryPlan(outcome, dropped, replacements, tuple(steps), self.triggered, reason)


def _from_spares(ctx: _Ctx, faulty: np.ndarray, yielding: np.ndarray | None) -> RecoveryPlan | None:
    """1. spares in the job's pods, same chip (free ones first, then borrowed ones)."""
    layout, topo, need = ctx.layout, ctx.layout.topo, len(ctx.lost)
    pods = np.unique(layout.node_domain[2][topo.gpu_node[ctx.kept if len(ctx.kept) else ctx.job_gpus]])
    in_pods = np.isin(layout.node_domain[2][topo.gpu_node], pods)
    spare_here = topo.node_spare[topo.gpu_node] & (topo.gpu_chip == ctx.chip) & in_pods
    candidates = np.flatnonzero(spare_here & ctx.usable)
    if yielding is not None and len(candidates) < need:
        taken_back = yielding & topo.usable() & spare_here
        taken_back[faulty] = False
        taken_back[ctx.job_gpus] = False
        candidates = np.concatenate([candidates, np.flatnonzero(taken_back)])
    if len(candidates) < need:
        return None
    # whole spare nodes first, in node order
    reason = f"{need} GPUs replaced from the spare pool of the job's pod"
    return ctx.plan("spare", ctx.lost, candidates[:need], len(ctx.job_gpus), reason)


def _from_healthy(ctx: _Ctx, max_level: int) -> RecoveryPlan | None:
    """2. a healthy placement for the lost GPUs within the job's allowed domain."""
    layout, topo, need = ctx.layout, ctx.layout.topo, len(ctx.lost)
    anchor = topo.gpu_node[ctx.kept[0]] if len(ctx.kept) else topo.gpu_node[ctx.job_gpus[0]]
    pool = FreePool(layout, ctx.usable)
    for level in range(1, max_level + 1):
        domain = int(layout.node_domain[level][anchor]) if level < len(LEVELS) - 1 else 0
        placed = pool.place(ctx.chip, need, level, within=(level, domain))
        if placed is not None:
            reason = f"{need} GPUs replaced by healthy GPUs in {layout.domain_name(level, domain)}"
            return ctx.plan("replacement", ctx.lost, placed[0], len(ctx.job_gpus), reason)
    return None


def _by_shrinking(ctx: _Ctx, min_gpus: int | None, size_step: int) -> RecoveryPlan | None:
    """3. an elastic job shrinks onto what it has left."""
    if min_gpus is None:
        return None
    topo, kept = ctx.layout.topo, ctx.kept
    size = len(kept) - len(kept) % size_step
    if size < min_gpus or size <= 0:
        return None
    # drop the GPUs of the nodes the job holds least of (a partly lost node goes first)
    nodes = topo.gpu_node[kept]
    held = np.bincount(nodes, minlength=topo.num_nodes)[nodes]
    order = np.lexsort((kept, -held))
    keep = np.sort(kept[order[:size]])
    dropped = np.setdiff1d(ctx.job_gpus, keep)
    reason = (
        f"no spare or healthy {topo.chip_names[ctx.chip]} GPUs near the job: shrunk from "
        f"{len(ctx.job_gpus)} to {size} GPUs and re-planned"
    )
    return ctx.plan("shrink", dropped, ctx.lost[:0], size, reason)
