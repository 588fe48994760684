"""A job's life as pure rules: which actions apply in which state, and what a preemption, a
fault or a requeue does to its progress. The live services, the scheduling cycle, the fault
task and the what-if simulator all call these functions, so a rule is written once.

Times are seconds on the caller's clock (epoch seconds live, virtual seconds in a simulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint import CheckpointKind
from engine.faults import Action, Classification, classify
from engine.physics import Physics
from engine.states import InvalidTransition, transition_target

JOB_STATES: tuple[str, ...] = ("pending", "running", "suspended", "finished", "failed", "cancelled")
ACTIVE_JOB_STATES: tuple[str, ...] = ("pending", "running", "suspended")

# Job actions as {action: (states it may start from, resulting state)}. The first three are an
# operator's (pages, API, admin); the rest are taken by the controller and the nodes.
JOB_ACTIONS: dict[str, tuple[frozenset[str], str]] = {
    "cancel": (frozenset({"pending", "running", "suspended"}), "cancelled"),
    "suspend": (frozenset({"pending", "running"}), "suspended"),
    "resume": (frozenset({"suspended"}), "pending"),
    "admit": (frozenset({"pending"}), "running"),
    "preempt": (frozenset({"running"}), "pending"),
    "requeue": (frozenset({"running"}), "pending"),
    "finish": (frozenset({"running"}), "finished"),
    "fail": (frozenset({"running"}), "failed"),
}
OPERATOR_JOB_ACTIONS: tuple[str, ...] = ("cancel", "suspend", "resume")

# A node is a lemon (quarantined until an operator clears it) when it faults this often.
LEMON_FAULTS = 3
LEMON_WINDOW_S = 7 * 86_400.0


class JobStateError(InvalidTransition):
    """The action does not apply to the job's current state."""


def job_action_target(action: str, current: str) -> str:
    """The state a job moves to when ``action`` is taken from ``current``."""
    return transition_target(
        JOB_ACTIONS,
        action,
        current,
        what="job",
        states=JOB_STATES,
        known=list(JOB_ACTIONS),
        error=JobStateError,
    )


def shape_problem(
    gpus: int,
    *,
    min_gpus: int | None = None,
    size_step: int = 1,
    share: int = 1000,
    mixed: bool = False,
    chip_types=(),
) -> tuple[str, str] | None:
    """(field, message) when a job's elastic, shared and mixed-chip settings contradict each
    other; None when the shape is sound. Every submit path checks this (API, autoscaler, fleet)."""
    if min_gpus is not None:
        if min_gpus > gpus:
            return "min_gpus", f"must be at most gpus ({gpus})"
        if min_gpus % size_step or gpus % size_step:
            return (
                "size_step",
                f"gpus ({gpus}) and min_gpus ({min_gpus}) must be multiples of size_step ({size_step})",
            )
    elif size_step != 1:
        return "size_step", "only an elastic job (with min_gpus) has a size step"
    if share < 1000 and (gpus != 1 or min_gpus is not None):
        return "share", "a fraction of a GPU is for one-GPU jobs (gpus 1, not elastic)"
    if mixed and (len(chip_types or ()) < 2 or min_gpus is not None or share < 1000):
        return (
            "mixed_chips",
            "a mixed-chip job lists two or more chip_types; it is neither elastic nor shared",
        )
    return None


def operator_actions(state: str) -> list[str]:
    """The operator's actions that apply to a job in ``state`` (the job page's buttons)."""
    return [a for a in OPERATOR_JOB_ACTIONS if state in JOB_ACTIONS[a][0]]


def checkpoint_bytes(parameters: float | None, physics: Physics | None = None) -> float:
    """Bytes of a training job's checkpoint: weights, gradients and optimizer state."""
    return (parameters or 0.0) * (physics or Physics()).bytes_per_parameter


def unsaved_s(
    now: float, started_at: float | None, last_checkpoint_at: float | None, *, every: float | None = None
) -> float:
    """Work (seconds of the job's wall time) done since its last restore point: what a stop
    without a save loses. The restore points are the job's start, its last durable checkpoint and,
    with ``every``, one every ``every`` seconds after the later of the two (the periodic
    checkpoints of a simulated run, an in-memory copy, a replica group's step). This is the one
    lost-work rule: production, the cluster simulator and the ETTR model all call it."""
    since = max([t for t in (started_at, last_checkpoint_at) if t is not None] or [now])
    elapsed = max(0.0, now - since)
    if every:
        return elapsed - (elapsed // every) * every
    return elapsed


def saves_on_demand(kind: CheckpointKind | str | None) -> bool:
    """Whether a policy can write a checkpoint when asked (asynchronous and triggered copy the
    state to host memory in seconds); periodic ones only save on their schedule."""
    return kind is not None and CheckpointKind(kind) in (CheckpointKind.ASYNC, CheckpointKind.TRIGGERED)


@dataclass(frozen=True)
class Stop:
    """What stopping a running job (preemption, drain, requeue after a fault) does to it."""

    saved: bool  # a checkpoint is written at the stop
    progress_s: float  # the job's durable progress afterwards
    lost_s: float  # work since the last durable checkpoint that is lost
    last_checkpoint_at: float | None  # its newest durable checkpoint afterwards


def stop(
    now: float,
    *,
    progress_s: float,
    started_at: float | None,
    last_checkpoint_at: float | None,
    policy: CheckpointKind | str | None,
    graceful: bool = True,
) -> Stop:
    """Stop a running job. A graceful stop (preemption, drain) saves first when the policy can;
    otherwise the work since the last durable checkpoint is lost. The job keeps its progress."""
    unsaved = unsaved_s(now, started_at, last_checkpoint_at)
    if graceful and saves_on_demand(policy) and unsaved > 0:
        return Stop(True, progress_s + unsaved, 0.0, now)
    return Stop(False, progress_s, unsaved, last_checkpoint_at)


def recent_faults(fault_times: list[float], now: float) -> int:
    """Faults of a node within the lemon window before ``now`` (``now`` itself included)."""
    return sum(1 for t in fault_times if 0 <= now - t < LEMON_WINDOW_S)


def is_lemon(recent: int) -> bool:
    """The lemon rule: a node with LEMON_FAULTS faults or more within LEMON_WINDOW_S."""
    return recent >= LEMON_FAULTS


def repeated(history: list[tuple[float, str, int | None]], now: float, source: str, xid: int | None) -> bool:
    """Whether the same fault (source and XID) already happened on the node within the lemon
    window before ``now``; ``history``: (time, source, xid) of the node's earlier faults."""
    return any(0 < now - t < LEMON_WINDOW_S and s == source and x == xid for t, s, x in history)


def out_of_service(action: Action, *, lemon: bool) -> str:
    """What a classified fault takes out of service: "node" (a reboot, a repair, or a lemon's
    quarantine: all its GPUs), "gpu" (a reset of the GPU that faulted), or "" (nothing)."""
    if lemon or action in (Action.REBOOT_NODE, Action.REPAIR_NODE):
        return "node"
    if action == Action.RESET_GPU:
        return "gpu"
    return ""


@dataclass(frozen=True)
class Verdict:
    """What one fault means for the hardware, in every world (the fault task, the cluster
    simulator, the ETTR model): its classification, whether it repeats, whether it makes its
    node a lemon, and what leaves service until when."""

    classification: Classification
    repeated: bool  # the same fault (source and XID) already happened on the node in the lemon window
    recent: int  # the node's faults in the lemon window, this one included
    lemon: bool  # the node meets the lemon rule and is quarantined
    out: str  # what leaves service: "node", "gpu" or "" (engine.lifecycle.out_of_service)

    @property
    def action(self) -> Action:
        return self.classification.action

    @property
    def interrupts_job(self) -> bool:
        return self.classification.interrupts_job

    @property
    def gpu_down(self) -> bool:
        """The GPU that faulted goes down until it is reset (its health critical)."""
        return self.action == Action.RESET_GPU

    @property
    def node_down(self) -> bool:
        """The node goes down for a reboot, a repair, or as a lemon."""
        return self.out == "node"

    @property
    def node_cordoned(self) -> bool:
        """The node takes no new work; what runs there runs on (a flapping port)."""
        return self.action == Action.CORDON_NODE and not self.node_down

    @property
    def gpu_warning(self) -> bool:
        """The GPU keeps running with a warning until a reset at the next job boundary."""
        return self.action == Action.RESET_WHEN_CONVENIENT

    @property
    def returns(self) -> str:
        """How what left service comes back: "reset" (the GPU, in minutes), "reboot" (the node, in
        minutes), "repair" (hands-on, days), "operator" (a lemon stays out until an operator
        clears it) or "" (nothing left service)."""
        if self.lemon:
            return "operator"
        if self.out == "gpu":
            return "reset"
        if self.out == "node":
            return "reboot" if self.action == Action.REBOOT_NODE else "repair"
        return ""


def judge(
    history: list[tuple[float, str, int | None]], now: float, source: str, xid: int | None = None
) -> Verdict:
    """The fault verdict: a fault of ``source`` (and ``xid``) at ``now`` on a node whose earlier
    faults are ``history`` ((time, source, xid), this one not included; empty when the fault is on
    no node, a pod or a link). Repeated fault, then classification, then the lemon rule, then what
    leaves service."""
    again = repeated(history, now, source, xid)
    c = classify(source, xid, repeated_on_node=again)
    recent = recent_faults([t for t, _, _ in history] + [now], now)
    lemon = is_lemon(recent)
    return Verdict(c, again, recent, lemon, out_of_service(c.action, lemon=lemon))
