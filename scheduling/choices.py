from django.db import models

from engine import checkpoint, tiers
from engine.placement import TOPOLOGY_CONSTRAINTS
from engine.workload import QUEUEING_STRATEGIES, RECLAIM_POLICIES, WITHIN_QUEUE_POLICIES


class JobKind(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"
    BATCH = "batch", "Batch"


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)


class CheckpointKind(models.TextChoices):  # the choices of engine.checkpoint.CheckpointKind
    PERIODIC = "periodic", "Periodic (synchronous)"
    ASYNC = "async", "Asynchronous"
    TRIGGERED = "triggered", "Triggered (with periodic fallback)"


class RecoveryTier(models.TextChoices):  # the tiers of engine.tiers, each including the ones before
    RESTART = "restart", "Restart every process from the newest checkpoint"
    FAST_DETECTION = "fast_detection", "Fast detection (NVML events, heartbeats, progress)"
    WARM_RESTART = "warm_restart", "Warm restart (healthy nodes keep their processes; warm standbys)"
    IN_MEMORY = "in_memory", "In-memory checkpoints to a peer node every step"
    REPLICA_GROUPS = "replica_groups", "Replica groups (train on without the faulty group)"


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


class TopologyConstraint(models.TextChoices):
    NODE = "node", "One node"
    RACK = "rack", "One rack"
    POD = "pod", "One pod"
    DATACENTER = "datacenter", "One datacenter"
    REGION = "region", "One region (may span its datacenters)"
    ANY = "any", "Anywhere (may span regions)"


class ReclaimPolicy(models.TextChoices):
    NEVER = "never", "Never"
    LOWER_PRIORITY = "lower_priority", "Lower priority"
    ANY = "any", "Any"


class WithinQueuePolicy(models.TextChoices):
    NEVER = "never", "Never"
    LOWER_PRIORITY = "lower_priority", "Lower priority"


class QueueingStrategy(models.TextChoices):
    BEST_EFFORT = "best_effort", "Best effort (later jobs may pass a blocked one, up to the bounded wait)"
    STRICT_FIFO = "strict_fifo", "Strict order (a blocked job holds the whole queue)"


assert tuple(QueueingStrategy.values) == QUEUEING_STRATEGIES
assert tuple(CheckpointKind.values) == tuple(checkpoint.CheckpointKind)
assert tuple(RecoveryTier.values) == tiers.TIERS
assert tuple(TopologyConstraint.values) == TOPOLOGY_CONSTRAINTS
assert tuple(ReclaimPolicy.values) == RECLAIM_POLICIES
assert tuple(WithinQueuePolicy.values) == WITHIN_QUEUE_POLICIES


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
