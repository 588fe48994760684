"""Queues, cohorts, jobs, allocations and the job event log.

The database guarantees the one rule that must never break: a GPU is in at most one active
allocation (partial unique indexes, on SQLite and PostgreSQL alike: scheduling.allocation_models).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from cluster.models import ChipType, Node
from engine import policy as checkpoint_policy
from engine.workload import DEFAULT_HEAD_WAIT_S
from scheduling.allocation_models import AllocatedGPU, Allocation  # noqa: F401 - the app's models are all here
from scheduling.array_models import JobArray
from scheduling.choices import (
    CheckpointKind,
    EventKind,
    JobKind,
    JobState,
    PendingKind,
    ProcessState,
    QueueingStrategy,
    ReclaimPolicy,
    RecoveryTier,
    TopologyConstraint,
    WithinQueuePolicy,
)
from scheduling.forecast_models import JobForecast  # noqa: F401 - each pending job's expected start
from scheduling.notify_models import WebhookDelivery  # noqa: F401 - the app's models are all here
from scheduling.service_models import InferenceService, ServiceScale  # noqa: F401 - both live here too
from scheduling.totals_models import AllocationTotals, RunningTotals  # noqa: F401 - kept by triggers
from scheduling.usage_models import UsageDay  # noqa: F401 - the app's models are all here


class Cohort(models.Model):
    """Queues that lend each other their idle quota."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


_DEFAULT_POLICY = checkpoint_policy.CheckpointPolicy()
ETTR_GOAL_DEFAULT = 0.9  # a policy's ETTR goal unless set; a job without a policy is held to it


class CheckpointPolicy(models.Model):
    """How a job saves its state: periodic (synchronous), asynchronous, or triggered at a fault with
    a periodic asynchronous fallback. An empty interval means "auto": the Young/Daly interval from
    the job's measured mean time between faults and its checkpoint stall. The recovery tier says
    how a fault is found and recovered from (engine.tiers)."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=CheckpointKind.choices, default=_DEFAULT_POLICY.kind)
    interval_s = models.FloatField(
        null=True, blank=True, help_text="Seconds between checkpoints; empty: auto"
    )
    triggered_success = models.FloatField(
        default=_DEFAULT_POLICY.triggered_success,
        help_text="Probability that a triggered save succeeds when GPU memory is readable",
    )
    recovery_tier = models.CharField(
        max_length=16,
        choices=RecoveryTier.choices,
        default=_DEFAULT_POLICY.tier,
        help_text="How a fault is found and recovered from; each tier includes the ones before",
    )
    replica_groups = models.PositiveIntegerField(
        default=_DEFAULT_POLICY.replica_groups,
        help_text="Data-parallel replica groups, for the replica-groups tier",
    )
    cordon_stragglers = models.BooleanField(
        default=False, help_text="Cordon a node found slowing its job (a straggler) until an operator looks"
    )
    ettr_goal = models.FloatField(
        default=ETTR_GOAL_DEFAULT,
        help_text="The ETTR its running jobs should keep (0 to 1); one below it for an hour alerts",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "checkpoint policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(interval_s__isnull=True) | Q(interval_s__gt=0),
                name="checkpoint_interval_positive",
            ),
            models.CheckConstraint(
                condition=Q(triggered_success__gte=0) & Q(triggered_success__lte=1),
                name="checkpoint_triggered_success_probability",
            ),
            models.CheckConstraint(condition=Q(replica_groups__gte=2), name="checkpoint_replica_groups_two"),
            models.CheckConstraint(
                condition=Q(ettr_goal__gte=0) & Q(ettr_goal__lte=1), name="checkpoint_ettr_goal_ratio"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def value(self) -> checkpoint_policy.CheckpointPolicy:
        """The policy as the engine and both simulators read it (engine.policy)."""
        return checkpoint_policy.CheckpointPolicy(
            kind=CheckpointKind(self.kind),
            interval_s=self.interval_s,
            triggered_success=self.triggered_success,
            tier=RecoveryTier(self.recovery_tier),
            replica_groups=self.replica_groups,
            name=self.name,
        )

    @staticmethod
    def fields_of(value: checkpoint_policy.CheckpointPolicy) -> dict:
        """The model's fields for an engine policy (its name aside)."""
        kind, tier = (value.kind or _DEFAULT_POLICY.kind).value, str(value.tier)
        fields = {"interval_s": value.interval_s, "triggered_success": value.triggered_success}
        return {"kind": kind, **fields, "recovery_tier": tier, "replica_groups": value.replica_groups}

    @classmethod
    def from_value(cls, value: checkpoint_policy.CheckpointPolicy, **fields) -> CheckpointPolicy:
        return cls(name=value.name, **cls.fields_of(value), **fields)


class Queue(models.Model):
    """A business's virtual queue: quota per chip type, priority and preemption policy."""

    name = models.SlugField(max_length=64, unique=True)
    cohort = models.ForeignKey(
        Cohort, null=True, blank=True, on_delete=models.SET_NULL, related_name="queues"
    )
    description = models.TextField(blank=True)
    priority = models.IntegerField(default=0, help_text="Default priority of the queue's jobs")
    weight = models.FloatField(default=1.0, help_text="Fair-share weight: usage / weight orders the queues")
    reclaim_within_cohort = models.CharField(
        max_length=16, choices=ReclaimPolicy.choices, default=ReclaimPolicy.NEVER
    )
    within_queue = models.CharField(
        max_length=16, choices=WithinQueuePolicy.choices, default=WithinQueuePolicy.NEVER
    )
    stopped = models.BooleanField(
        default=False, help_text="A stopped queue admits nothing and keeps running work"
    )
    may_use_spares = models.BooleanField(
        "may use spare nodes",
        default=False,
        help_text="Its jobs may run on spare nodes when nothing else is free; fault recovery takes "
        "the spares back, preempting them first",
    )
    borrow_preempt_max_priority = models.IntegerField(
        "preempt while borrowing up to priority",
        null=True,
        blank=True,
        help_text="Empty (the default): a job that would borrow preempts nothing. A number: it may "
        "preempt jobs its policies allow up to this priority (Kueue's borrowWithinCohort)",
    )
    queueing_strategy = models.CharField(
        max_length=16, choices=QueueingStrategy.choices, default=QueueingStrategy.BACKFILL
    )
    head_wait_s = models.PositiveIntegerField(
        "bounded wait (s)",
        null=True,
        blank=True,
        default=int(DEFAULT_HEAD_WAIT_S),
        help_text="Best effort only: once a job blocked by quota has waited this long, the queue's "
        "later jobs on its chip types wait for it. Empty: later jobs may always pass it",
    )
    default_checkpoint_policy = models.ForeignKey(
        CheckpointPolicy, null=True, blank=True, on_delete=models.SET_NULL, related_name="queues"
    )
    webhook_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="Where its jobs' state changes are posted (a job's URL wins)",
    )
    webhook_secret = models.CharField(
        max_length=64, blank=True, help_text="Signs the webhooks (HMAC-SHA256); shown once when rotated"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(condition=Q(weight__gt=0), name="queue_weight_positive")]

    def __str__(self) -> str:
        return self.name


# A queue's own settings (quotas aside): what its API, admin, edit page and audit records show.
QUEUE_SETTINGS = (
    "description",
    "priority",
    "weight",
    "reclaim_within_cohort",
    "within_queue",
    "queueing_strategy",
    "head_wait_s",
    "may_use_spares",
    "borrow_preempt_max_priority",
    "stopped",
    "webhook_url",
)


class QueueQuota(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="quotas")
    chip_type = models.ForeignKey(ChipType, on_delete=models.PROTECT, related_name="quotas")
    nominal = models.PositiveIntegerField(
        help_text="GPUs guaranteed to the queue (the lendable part excepted)"
    )
    borrowing_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit")
    lending_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: all of nominal")

    class Meta:
        ordering = ["queue_id", "chip_type_id"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "chip_type"], name="quota_one_per_queue_and_chip"),
            models.CheckConstraint(
                condition=Q(lending_limit__isnull=True) | Q(lending_limit__lte=models.F("nominal")),
                name="quota_lending_within_nominal",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue}: {self.nominal} {self.chip_type}"


class Job(models.Model):
    name = models.CharField(max_length=128, blank=True)
    # indexed through (queue, state) below; a second index on queue alone would only slow writes
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.TRAINING)
    priority = models.IntegerField(default=0)
    gpus = models.PositiveIntegerField("GPUs requested", help_text="For an elastic job: its maximum size")
    min_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Elastic: the smallest size it runs at; empty: rigid"
    )
    size_step = models.PositiveIntegerField(default=1, help_text="Elastic sizes are multiples of this")
    share = models.PositiveSmallIntegerField(
        default=1000, help_text="Thousandths of each GPU; below 1000 the job shares one GPU with others"
    )
    allocated_gpus = models.PositiveIntegerField(default=0, help_text="GPUs it holds now")
    model = models.JSONField(
        default=dict, blank=True, help_text="Model shape for the step-time model (params, layers, ...)"
    )
    plan = models.JSONField(default=dict, blank=True, help_text="Current parallel plan, modelled")
    link_loads = models.JSONField(null=True, blank=True, editable=False, help_text="[[dc, dc, B/s]]")
    chip_ranking = models.JSONField(default=list, blank=True, help_text="Chip types by tokens per dollar")
    service = models.ForeignKey(
        InferenceService, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas"
    )
    mixed_chips = models.BooleanField(
        default=False, help_text="May be split over several of its chip types when no one type can hold it"
    )
    chip_types = models.JSONField(default=list, blank=True, help_text="Allowed chip types, preferred first")
    topology = models.CharField(max_length=16, choices=TopologyConstraint.choices, default="datacenter")
    estimated_duration_s = models.FloatField(null=True, blank=True)
    parameters = models.FloatField(null=True, blank=True, help_text="Model parameters, for checkpoint size")
    checkpoint_policy = models.ForeignKey(
        CheckpointPolicy,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        help_text="Empty: the queue's default",
    )
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    pending_reason = models.TextField(blank=True)
    # what keeps it pending (engine.reasons) as the last cycle said; empty until one says
    pending_kind = models.CharField(max_length=16, choices=PendingKind.choices, blank=True)
    submitted_at = models.DateTimeField(db_index=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="Start of the current run")
    finished_at = models.DateTimeField(null=True, blank=True)
    chip = models.ForeignKey(ChipType, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    placement = models.CharField(max_length=128, blank=True, help_text="Smallest domain holding the gang")
    progress_s = models.FloatField(default=0.0, help_text="Work saved at the last checkpoint, seconds")
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    preemptions = models.PositiveIntegerField(default=0)
    # On real nodes (scheduling.launch): what each node's agent starts, and how starts went.
    command = models.TextField(
        blank=True, help_text="Started once per node by its agent (sh -c); empty: not launched by agents"
    )
    env = models.JSONField(default=dict, blank=True, help_text="Extra environment variables for the command")
    webhook_url = models.URLField(
        max_length=500, blank=True, help_text="Where its state changes are posted (else its queue's URL)"
    )
    launched_generation = models.CharField(
        max_length=16, blank=True, help_text="The placement every node reported running (empty: not yet)"
    )
    start_failures = models.PositiveSmallIntegerField(
        default=0, help_text="Starts in a row that did not reach every node in time"
    )
    requeue_at = models.DateTimeField(
        null=True, blank=True, help_text="After a failed start: not admitted again before this time"
    )
    checkpoint_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="An operator asked for a checkpoint now; agents signal the job"
    )
    # one job of a job array (scheduling.arrays); the unique (array, index) below is its index
    array = models.ForeignKey(
        JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs", db_index=False
    )
    array_index = models.PositiveIntegerField(null=True, blank=True, help_text="Its index in its array")
    # raised by the database itself (a trigger, migration 0026) whenever an UPDATE names a column
    # the scheduler reads of a running job: the cycle rebuilds only the jobs whose revision moved.
    # SQLite drops a table's triggers when a migration remakes it: such a migration creates it again
    # (tests/test_cycle_allocation_cache.py fails without it)
    revision = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-id"]
        # A plain index on state (db_index on a CharField would add a second, LIKE-pattern index
        # on PostgreSQL that no query uses); every index here is paid again by each admission.
        # (state, array, id): jobs by state, and a cycle's window on each array's pending jobs
        indexes = [
            models.Index(fields=["queue", "state"]),
            models.Index(fields=["state", "array", "id"], name="job_state_array"),
            models.Index(fields=["state", "id", "revision"], name="job_state_revision"),
            # the few jobs holding a share of a link between datacenters, read by every cycle
            # (scheduling.sites): without it, every running job's row was read to find them
            models.Index(
                fields=["state", "id"], condition=Q(link_loads__isnull=False), name="job_link_loads"
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_positive"),
            models.CheckConstraint(
                condition=Q(min_gpus__isnull=True) | (Q(min_gpus__gte=1) & Q(min_gpus__lte=models.F("gpus"))),
                name="job_min_gpus_within_size",
            ),
            models.CheckConstraint(condition=Q(size_step__gte=1), name="job_size_step_positive"),
            models.CheckConstraint(
                condition=Q(share=1000) | (Q(share__gte=1, share__lt=1000, gpus=1, min_gpus__isnull=True)),
                name="job_share_is_a_fraction_of_one_gpu",
            ),
            models.CheckConstraint(
                condition=Q(mixed_chips=False) | Q(min_gpus__isnull=True, share=1000),
                name="job_mixed_chips_rigid_and_whole",
            ),
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
            models.UniqueConstraint(
                fields=["array", "array_index"],
                condition=Q(array__isnull=False),
                name="job_one_per_array_index",
            ),
            models.CheckConstraint(
                condition=Q(array__isnull=True, array_index__isnull=True)
                | Q(array__isnull=False, array_index__isnull=False),
                name="job_array_has_index",
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"job {self.pk}"

    @property
    def effective_checkpoint_policy(self):
        """The job's own checkpoint policy, else its queue's default (None: neither)."""
        return self.checkpoint_policy or self.queue.default_checkpoint_policy


class Checkpoint(models.Model):
    """One saved checkpoint of a job, as reported by its nodes or taken at a fault."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveBigIntegerField(default=0)
    at = models.DateTimeField(db_index=True)
    progress_s = models.FloatField(help_text="Training progress saved, in seconds of work")
    size_bytes = models.FloatField(default=0)
    kind = models.CharField(max_length=16, choices=CheckpointKind.choices)
    durable = models.BooleanField(
        default=True, help_text="Written to durable storage, not only to host memory"
    )
    stall_s = models.FloatField(default=0, help_text="How long training stopped for it")

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(stall_s__gte=0), name="checkpoint_stall_not_negative")
        ]

    def __str__(self) -> str:
        return f"{self.job} step {self.step} ({self.kind})"


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    at = models.DateTimeField(db_index=True)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            # "when was this job last requeued?", asked for every job a cycle admits: the few
            # requeues among hundreds of thousands of events, found without the planner's statistics
            models.Index(fields=["job", "at"], condition=Q(kind="requeued"), name="jobevent_requeues"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


class JobProcess(models.Model):
    """A job's launcher process on one node for one placement (its generation), as the node's
    agent reports it: one row per job, node and placement, never per GPU or per sample."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="processes")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="processes")
    generation = models.CharField(max_length=16, help_text="The placement this process was started for")
    rank = models.PositiveIntegerField(help_text="NODE_RANK")
    state = models.CharField(max_length=16, choices=ProcessState.choices, default=ProcessState.STARTING)
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    log_tail = models.TextField(blank=True, help_text="The last lines of its output")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job_id", "generation", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "node", "generation"], name="process_one_per_job_node_generation"
            ),
            models.CheckConstraint(condition=Q(state__in=ProcessState.values), name="process_state_valid"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.node_id} ({self.state})"
