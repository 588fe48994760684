"""Inventory: chip types and the topology Region > Datacenter > Pod > Rack > Node > GPU.

Uniqueness of names within a parent, GPU index per node and sane numbers are enforced by the
database, not only by forms, so bulk writes and concurrent workers cannot break them.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from cluster.choices import GPUHealth, GPUState, NodeState, PortKind
from engine.sites import FIBRE_MIN_MS_PER_KM, link_state


class ChipType(models.Model):
    name = models.CharField(max_length=64, unique=True)
    vendor = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    generation = models.CharField(max_length=64)
    bf16_tflops = models.FloatField("dense BF16 TFLOPS")
    memory_gib = models.FloatField("memory (GiB)")
    memory_bandwidth_tbps = models.FloatField("memory bandwidth (TB/s)")
    link_bandwidth_gbps = models.FloatField("intra-node link bandwidth (GB/s)")
    tdp_watts = models.PositiveIntegerField("TDP (W)")
    price_per_gpu_hour = models.DecimalField("list price per GPU-hour (USD)", max_digits=8, decimal_places=3)
    charge_per_gpu_hour = models.DecimalField(
        "chargeback price per GPU-hour (USD)",
        max_digits=8,
        decimal_places=3,
        null=True,
        blank=True,
        help_text="What usage reports charge a queue per allocated GPU-hour; empty: the list price",
    )
    failure_rate_factor = models.FloatField(default=1.0, help_text="Relative failure rate; H100 = 1.0")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(bf16_tflops__gt=0), name="chiptype_tflops_positive"),
            models.CheckConstraint(condition=Q(memory_gib__gt=0), name="chiptype_memory_positive"),
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gte=0), name="chiptype_price_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(charge_per_gpu_hour__isnull=True) | Q(charge_per_gpu_hour__gte=0),
                name="chiptype_charge_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(failure_rate_factor__gt=0), name="chiptype_failure_factor_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Region(models.Model):
    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Datacenter(models.Model):
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="datacenters")
    name = models.CharField(max_length=64)
    location = models.CharField(max_length=128, blank=True)
    power_budget_kw = models.FloatField("power budget (kW)", default=0)

    class Meta:
        ordering = ["region__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["region", "name"], name="datacenter_name_unique_in_region"),
            models.CheckConstraint(condition=Q(power_budget_kw__gte=0), name="datacenter_power_not_negative"),
        ]

    def __str__(self) -> str:
        return self.name


class DatacenterLink(models.Model):
    """The network between two datacenters; stored once per pair with ``a`` < ``b``.

    Its capacity is lanes (e.g. 8 x 400 Gb/s); lanes lost (a wavelength down) thin it, and a link
    marked down carries nothing. The rule for its state and what it carries is engine.sites'."""

    a = models.ForeignKey(Datacenter, on_delete=models.CASCADE, related_name="links_as_a")
    b = models.ForeignKey(Datacenter, on_delete=models.CASCADE, related_name="links_as_b")
    distance_km = models.FloatField(default=0)
    latency_ms = models.FloatField("one-way latency (ms)")
    lanes = models.PositiveIntegerField(default=8)
    lane_gbps = models.FloatField("Gb/s per lane", default=400.0)
    lanes_lost = models.PositiveIntegerField(default=0)
    down = models.BooleanField(default=False)
    state_reason = models.CharField(max_length=255, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["a_id", "b_id"]
        constraints = [
            models.UniqueConstraint(fields=["a", "b"], name="datacenter_link_unique_pair"),
            models.CheckConstraint(condition=Q(a__lt=F("b")), name="datacenter_link_ordered_pair"),
            models.CheckConstraint(condition=Q(lanes__gt=0), name="datacenter_link_lanes_positive"),
            models.CheckConstraint(condition=Q(lane_gbps__gt=0), name="datacenter_link_lane_rate_positive"),
            models.CheckConstraint(
                condition=Q(lanes_lost__lte=F("lanes")), name="datacenter_link_lanes_lost_at_most_lanes"
            ),
            models.CheckConstraint(
                condition=Q(latency_ms__gte=F("distance_km") * FIBRE_MIN_MS_PER_KM),
                name="datacenter_link_latency_above_fibre_floor",
            ),
            models.CheckConstraint(
                condition=Q(distance_km__gte=0), name="datacenter_link_distance_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.a} <-> {self.b}"

    @property
    def bandwidth_gbps(self) -> float:
        """The design capacity: every lane."""
        return self.lanes * self.lane_gbps

    @property
    def state(self) -> str:
        return link_state(self.lanes, self.lanes_lost, self.down)

    @property
    def capacity_gbps(self) -> float:
        """What it carries now: the lanes left, nothing when down."""
        return 0.0 if self.state == "down" else (self.lanes - self.lanes_lost) * self.lane_gbps


class Pod(models.Model):
    """A network block of the HPN fabric: racks that share one tier of switches."""

    datacenter = models.ForeignKey(Datacenter, on_delete=models.CASCADE, related_name="pods")
    name = models.CharField(max_length=64)
    fabric = models.CharField(max_length=32, default="HPN")

    class Meta:
        ordering = ["datacenter_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["datacenter", "name"], name="pod_name_unique_in_datacenter")
        ]

    def __str__(self) -> str:
        return f"{self.datacenter.name}-{self.name}"


class Rack(models.Model):
    pod = models.ForeignKey(Pod, on_delete=models.CASCADE, related_name="racks")
    name = models.CharField(max_length=64)

    class Meta:
        ordering = ["pod_id", "name"]
        constraints = [models.UniqueConstraint(fields=["pod", "name"], name="rack_name_unique_in_pod")]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    rack = models.ForeignKey(Rack, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=128, unique=True)
    chip_type = models.ForeignKey(ChipType, on_delete=models.PROTECT, related_name="nodes")
    gpus_per_node = models.PositiveSmallIntegerField(default=8)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY, db_index=True)
    state_reason = models.CharField(max_length=255, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    drain_deadline = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While draining: running work may finish until then, then it is moved",
    )
    is_spare = models.BooleanField("spare", default=False, db_index=True)
    is_lemon = models.BooleanField(
        "lemon", default=False, help_text="Faults repeatedly: quarantined until an operator clears it"
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus_per_node__gte=1) & Q(gpus_per_node__lte=72), name="node_gpus_per_node_range"
            ),
            models.CheckConstraint(condition=Q(state__in=NodeState.values), name="node_state_valid"),
        ]

    def __str__(self) -> str:
        return self.hostname


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField("index on node")
    uuid = models.CharField(max_length=64, unique=True)
    serial = models.CharField(max_length=32, unique=True)
    state = models.CharField(max_length=16, choices=GPUState.choices, default=GPUState.READY, db_index=True)
    health = models.CharField(max_length=16, choices=GPUHealth.choices, default=GPUHealth.OK, db_index=True)

    class Meta:
        verbose_name = "GPU"
        ordering = ["node_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_per_node"),
            models.CheckConstraint(condition=Q(state__in=GPUState.values), name="gpu_state_valid"),
            models.CheckConstraint(condition=Q(health__in=GPUHealth.values), name="gpu_health_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.node.hostname}/gpu{self.index}"

    def clean(self) -> None:
        if self.node_id and self.index is not None and self.index >= self.node.gpus_per_node:
            raise ValidationError(
                {"index": f"index {self.index} is outside node {self.node}'s {self.node.gpus_per_node} GPUs"}
            )


class InventoryRevision(models.Model):
    """One row whose ``revision`` the database raises (triggers, migration 0010) in the same
    transaction as any change to the inventory's structure: a GPU, node, rack, pod, datacenter,
    region or chip type added or removed, or a column the topology snapshot is built from
    changed (a node moved to another rack, a datacenter renamed). The snapshot cache
    (``cluster.snapshot``) reads this row instead of counting 100,000 GPUs each cycle."""

    revision = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"inventory revision {self.revision}"


class NicPort(models.Model):
    """A node's network port as its agent reports it (``mlx5_0/1``, ``eth0``): kind, rail, rate.
    The agent sends the list at enrolment and whenever it changes; reports name these ports."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ports")
    name = models.CharField(max_length=32)
    kind = models.CharField(max_length=8, choices=PortKind.choices)
    rail = models.PositiveSmallIntegerField(help_text="The NIC's rail: its index among the node's NICs")
    rate_gbps = models.FloatField(help_text="Link rate in Gb/s as the port last reported it")

    class Meta:
        verbose_name = "NIC port"
        ordering = ["node_id", "rail", "name"]
        constraints = [
            models.UniqueConstraint(fields=["node", "name"], name="nic_port_name_unique_per_node"),
            models.CheckConstraint(condition=Q(kind__in=PortKind.values), name="nic_port_kind_valid"),
            models.CheckConstraint(
                condition=Q(rate_gbps__gte=0) & Q(rate_gbps__lte=10_000), name="nic_port_rate_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.hostname}/{self.name}"


class AuditRecord(models.Model):
    """Who changed what, from a page, the API or the admin: queue quotas, node actions, policies."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32, help_text="e.g. update, create, cordon")
    object_type = models.CharField(max_length=32, db_index=True, help_text="queue, node, checkpoint policy")
    object_id = models.PositiveIntegerField(null=True, blank=True)
    object_name = models.CharField(max_length=128)
    changes = models.JSONField(default=dict, blank=True, help_text="field: [before, after]")
    reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id", "at"])]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type} {self.object_name}"


class EnrolmentToken(models.Model):
    """A one-time token an operator hands to a new node's agent, which trades it for a node
    credential. Only its SHA-256 is stored; the token itself is shown once, when it is made."""

    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The token's first characters, to tell tokens apart")
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="enrolment_tokens",
        help_text="The node it enrols; empty: the node named by the agent's hostname",
    )
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_for = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The node it enrolled",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(used_at__isnull=True) | Q(used_for__isnull=False),
                name="enrolment_token_used_for_a_node",
            )
        ]

    def __str__(self) -> str:
        return f"enrolment token {self.prefix}…"


class NodeCredential(models.Model):
    """What a node's agent authenticates with: bound to one node, stored hashed, revocable. It may
    report for its own node and read its own assignments, nothing else."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    address = models.CharField(
        max_length=255, blank=True, help_text="Where the node's peers reach it (a gang's MASTER_ADDR)"
    )
    agent_version = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="The agent's last accepted report")
    last_seq = models.PositiveBigIntegerField(
        default=0, help_text="Sequence number of the newest report accepted: older ones change nothing"
    )
    reports_accepted = models.PositiveBigIntegerField(default=0)
    heartbeat_lost_at = models.DateTimeField(
        null=True, blank=True, help_text="Set when missed reports raised a heartbeat-loss fault"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["node_id", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"], condition=Q(revoked_at__isnull=True), name="one_live_credential_per_node"
            )
        ]

    def __str__(self) -> str:
        return f"credential {self.prefix}… of {self.node}"
