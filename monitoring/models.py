"""Fault events: what failed, when, what the controller did about it, and when it cleared."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from cluster.models import GPU, Datacenter, DatacenterLink, Node, Pod
from monitoring.choices import FaultAction, FaultSource, Severity


class FaultEvent(models.Model):
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="faults")
    gpu = models.ForeignKey(GPU, null=True, blank=True, on_delete=models.CASCADE, related_name="faults")
    pod = models.ForeignKey(
        Pod,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="faults",
        help_text="For a switch fault that takes a network block down",
    )
    link = models.ForeignKey(
        DatacenterLink, null=True, blank=True, on_delete=models.CASCADE, related_name="faults"
    )
    at = models.DateTimeField(db_index=True, help_text="When the fault happened")
    detected_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=20, choices=FaultSource.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.CRITICAL)
    cause = models.CharField(max_length=32, blank=True)
    description = models.CharField(max_length=255, blank=True)
    action = models.CharField(max_length=24, choices=FaultAction.choices, blank=True)
    actor = models.CharField(max_length=150, default="controller", help_text="Who or what took the action")
    job = models.ForeignKey(
        "scheduling.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="faults",
        help_text="The running job the fault interrupted",
    )
    recovery_s = models.FloatField(
        null=True, blank=True, help_text="Time from the fault to the job running again"
    )
    cleared_at = models.DateTimeField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["node", "at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(node__isnull=False)
                | Q(gpu__isnull=False)
                | Q(pod__isnull=False)
                | Q(link__isnull=False),
                name="fault_names_what_failed",
            ),
            models.CheckConstraint(
                condition=Q(source="xid", xid__isnull=False) | ~Q(source="xid"), name="fault_xid_has_code"
            ),
        ]

    def __str__(self) -> str:
        what = self.gpu or self.node or self.pod or self.link
        name = f"XID {self.xid}" if self.source == "xid" else self.get_source_display()
        return f"{name} on {what}"


class Simulation(models.Model):
    """A what-if simulation run by a Celery task: inputs, progress, summary and HTML report."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    name = models.CharField(max_length=128, blank=True)
    cluster = models.CharField(max_length=32, help_text="A preset (demo, 10k, 100k) or 'inventory'")
    days = models.FloatField()
    seed = models.IntegerField(default=0)
    jobs = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: from the target load")
    elastic_share = models.FloatField(default=0.0)
    configurations = models.JSONField(default=list, help_text='e.g. ["checkpoint=periodic:3600", "spares=4"]')
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(days__gt=0, days__lte=365), name="simulation_days_range"),
            models.CheckConstraint(
                condition=Q(progress__gte=0, progress__lte=1), name="simulation_progress_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"simulation {self.pk}"


class SimulationPart(models.Model):
    """One configuration of a simulation, run by its own task (a sweep's configurations run on
    every simulations worker at once); the last to finish assembles the report."""

    simulation = models.ForeignKey(Simulation, on_delete=models.CASCADE, related_name="parts")
    index = models.PositiveSmallIntegerField(help_text="Its place in the simulation's configurations")
    progress = models.FloatField(default=0.0)
    result = models.JSONField(null=True, blank=True, help_text="The configuration's results, with series")
    worker = models.CharField(max_length=255, blank=True, help_text="The worker that ran it")
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Its worker's last sign of life (a silent part starts again)"
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["simulation", "index"]
        constraints = [
            models.UniqueConstraint(fields=["simulation", "index"], name="simulation_part_once"),
            models.CheckConstraint(
                condition=Q(progress__gte=0, progress__lte=1), name="simulation_part_progress_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.simulation} part {self.index}"


class ClusterSample(models.Model):
    """One row per sampling interval for the whole cluster (never per GPU): the overview's buckets,
    jobs and faults, so the overview can chart the last hour, day and week."""

    at = models.DateTimeField(unique=True)
    gpus = models.PositiveIntegerField()
    free = models.PositiveIntegerField()
    allocated = models.PositiveIntegerField(help_text="Held by a job and working")
    allocated_idle = models.PositiveIntegerField()
    cordoned = models.PositiveIntegerField()
    down = models.PositiveIntegerField()
    repairing = models.PositiveIntegerField()
    running_jobs = models.PositiveIntegerField()
    pending_jobs = models.PositiveIntegerField()
    open_faults = models.PositiveIntegerField()
    faults_last_hour = models.PositiveIntegerField()

    class Meta:
        ordering = ["at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    gpus=F("free")
                    + F("allocated")
                    + F("allocated_idle")
                    + F("cordoned")
                    + F("down")
                    + F("repairing")
                ),
                name="sample_buckets_sum_to_gpus",
            )
        ]

    def __str__(self) -> str:
        return f"sample at {self.at:%Y-%m-%d %H:%M}"


class CongestionRecord(models.Model):
    """A fabric link congested for a while: a pod's rail leaf (``rail`` set) or its uplink
    (``rail`` empty) whose worst port's p99 utilization or CNP rate stayed at its threshold for
    MYRIAD_FABRIC_CONGESTION_MIN_S. Open while it lasts (``ended_at`` empty), with its peaks and
    the jobs whose traffic crossed it."""

    pod = models.ForeignKey(Pod, on_delete=models.CASCADE, related_name="congestion")
    rail = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The leaf's rail; empty: the pod uplink"
    )
    started_at = models.DateTimeField(db_index=True, help_text="When it was first seen congested")
    ended_at = models.DateTimeField(null=True, blank=True, help_text="When it cleared; empty while open")
    peak_p99 = models.FloatField(default=0.0, help_text="Highest p99 window utilization of its ports, %")
    peak_cnp_per_s = models.FloatField(default=0.0)
    peak_util = models.FloatField(default=0.0, help_text="Highest load over capacity")
    jobs = models.JSONField(default=list, blank=True, help_text="Jobs running across it while open")
    source = models.CharField(max_length=16, default="agents", help_text="agents or simulated")

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["pod", "rail"],
                condition=Q(ended_at__isnull=True, rail__isnull=False),
                name="congestion_open_once_per_leaf",
            ),
            models.UniqueConstraint(
                fields=["pod"],
                condition=Q(ended_at__isnull=True, rail__isnull=True),
                name="congestion_open_once_per_uplink",
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="congestion_ends_after_it_starts",
            ),
        ]

    def __str__(self) -> str:
        return f"congestion on {self.link} from {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def link(self) -> str:
        return (
            f"{self.pod.name} rail {self.rail} leaf" if self.rail is not None else f"{self.pod.name} uplink"
        )


class SitePartition(models.Model):
    """A datacenter the control plane cannot reach: every agent there silent at once, or an
    operator marking its path to the control plane down. One event, not a fault per node: nothing
    new is placed there while it is open, the work inside keeps running (its agents keep it), and
    nobody is requeued; it closes when an agent there reports again (or the operator ends it)."""

    datacenter = models.ForeignKey(Datacenter, on_delete=models.CASCADE, related_name="partitions")
    started_at = models.DateTimeField(db_index=True, help_text="The last report before the silence")
    detected_at = models.DateTimeField()
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was reached again; empty while open"
    )
    source = models.CharField(max_length=16, help_text="agents_silent or operator")
    nodes = models.PositiveIntegerField(default=0, help_text="Nodes with an agent there when it opened")
    reason = models.CharField(max_length=255, blank=True)
    ended_reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["datacenter"],
                condition=Q(ended_at__isnull=True),
                name="partition_open_once_per_datacenter",
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="partition_ends_after_it_starts",
            ),
            models.CheckConstraint(
                condition=Q(source__in=("agents_silent", "operator")), name="partition_source_known"
            ),
        ]

    def __str__(self) -> str:
        return f"partition of {self.datacenter} from {self.started_at:%Y-%m-%d %H:%M:%S}"


class JobEfficiency(models.Model):
    """How a job used the GPUs it held, over its life, from the telemetry frames (the agents' or the
    simulated fleet's): sums of utilization, memory and power (each in % of the GPU's) times
    GPU-seconds, and the GPU-seconds below the idle utilization. Written from the live store's
    running totals about once a minute (monitoring.telemetry.efficiency); one row per job."""

    job = models.OneToOneField(
        "scheduling.Job", primary_key=True, on_delete=models.CASCADE, related_name="efficiency"
    )
    gpu_s = models.FloatField(default=0.0, help_text="GPU-seconds observed in frames")
    util_s = models.FloatField(default=0.0, help_text="Utilization (%) x GPU-seconds")
    memory_s = models.FloatField(default=0.0, help_text="Memory used (% of the GPU's) x GPU-seconds")
    power_s = models.FloatField(default=0.0, help_text="Power (% of the GPU's limit) x GPU-seconds")
    idle_gpu_s = models.FloatField(default=0.0, help_text="GPU-seconds below the idle utilization")
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_s__gte=0)
                & Q(util_s__gte=0)
                & Q(memory_s__gte=0)
                & Q(power_s__gte=0)
                & Q(idle_gpu_s__gte=0)
                & Q(idle_gpu_s__lte=F("gpu_s")),
                name="job_efficiency_sane",
            )
        ]

    def __str__(self) -> str:
        return f"efficiency of job {self.job_id}"
