from django.db import models

from cluster.choices import engine_choices
from engine import checkpoint, lifecycle, reasons, tiers
from engine.placement import TOPOLOGY_CONSTRAINTS
from engine.workload import QUEUEING_STRATEGIES, RECLAIM_POLICIES, WITHIN_QUEUE_POLICIES


class JobKind(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"
    BATCH = "batch", "Batch"


JobState = engine_choices("JobState", lifecycle.JOB_STATES)


ACTIVE_STATES = tuple(JobState(s) for s in lifecycle.ACTIVE_JOB_STATES)

PendingKind = engine_choices("PendingKind", reasons.PENDING_KINDS)  # what keeps a job pending


CheckpointKind = engine_choices(
    "CheckpointKind",
    checkpoint.CheckpointKind,
    {
        "periodic": "Periodic (synchronous)",
        "async": "Asynchronous",
        "triggered": "Triggered (with periodic fallback)",
    },
)
RecoveryTier = engine_choices(  # each tier includes the ones before
    "RecoveryTier",
    tiers.TIERS,
    {
        "restart": "Restart every process from the newest checkpoint",
        "fast_detection": "Fast detection (NVML events, heartbeats, progress)",
        "warm_restart": "Warm restart (healthy nodes keep their processes; warm standbys)",
        "in_memory": "In-memory checkpoints to a peer node every step",
        "replica_groups": "Replica groups (train on without the faulty group)",
    },
)


class EventKind(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    ADMITTED = "admitted", "Admitted"
    PLACED = "placed", "Placed"
    PREEMPTED = "preempted", "Preempted"
    REQUEUED = "requeued", "Requeued"
    SUSPENDED = "suspended", "Suspended"
    RESUMED = "resumed", "Resumed"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    FAULTED = "faulted", "Faulted"
    CHECKPOINTED = "checkpointed", "Checkpointed"
    RECOVERED = "recovered", "Recovered"
    RESIZED = "resized", "Resized"
    PLANNED = "planned", "Planned"
    LAUNCHED = "launched", "Running on every node"
    STRAGGLER = "straggler", "Straggler found"


TopologyConstraint = engine_choices(
    "TopologyConstraint",
    TOPOLOGY_CONSTRAINTS,
    {
        "node": "One node",
        "rack": "One rack",
        "pod": "One pod",
        "datacenter": "One datacenter",
        "region": "One region (may span its datacenters)",
        "any": "Anywhere (may span regions)",
    },
)
ReclaimPolicy = engine_choices("ReclaimPolicy", RECLAIM_POLICIES)
WithinQueuePolicy = engine_choices("WithinQueuePolicy", WITHIN_QUEUE_POLICIES)
QueueingStrategy = engine_choices(
    "QueueingStrategy",
    QUEUEING_STRATEGIES,
    {
        "backfill": "Backfill (quota is reserved for a blocked job; later jobs use it if they end first)",
        "best_effort": "Best effort (later jobs may pass a blocked one, up to the bounded wait)",
        "strict_fifo": "Strict order (a blocked job holds the whole queue)",
    },
)


class ProcessState(models.TextChoices):
    """A job's launcher process on one node, as the node's agent reports it."""

    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    EXITED = "exited", "Exited"
    FAILED_TO_START = "failed_to_start", "Failed to start"


STATE_COLOURS = {
    "pending": "#E69F00",
    "running": "#009E73",
    "suspended": "#56B4E9",
    "finished": "#999999",
    "failed": "#D55E00",
    "cancelled": "#CC79A7",
}
