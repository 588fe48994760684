"""Inference services and their autoscaling changes (the replicas are jobs: scheduling.models)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class InferenceService(models.Model):
    """An inference service: replicas of a fixed size that follow a load profile (engine.inference).
    Replicas are jobs of kind inference in the service's queue."""

    name = models.SlugField(max_length=64, unique=True)
    queue = models.ForeignKey("scheduling.Queue", on_delete=models.PROTECT, related_name="services")
    chip_types = models.JSONField(default=list, blank=True, help_text="Allowed chip types, preferred first")
    replica_gpus = models.PositiveIntegerField(default=1, help_text="GPUs per replica")
    replica_share = models.PositiveSmallIntegerField(
        default=1000, help_text="Thousandths of a GPU per replica (below 1000: replicas share GPUs)"
    )
    capacity_rps = models.FloatField(help_text="Requests per second one replica serves")
    headroom = models.FloatField(default=0.2, help_text="Spare capacity kept above the load (0.2 = 20%)")
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=8)
    load_profile = models.JSONField(default=dict, help_text="engine.inference.LoadProfile as JSON")
    scale_down_delay_s = models.FloatField(default=300.0)
    paused = models.BooleanField(
        default=False, help_text="Paused: the autoscaler leaves replicas as they are"
    )
    load_rps = models.FloatField(default=0.0, help_text="Load at the last autoscaling decision")
    desired_replicas = models.PositiveIntegerField(default=0)
    low_since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    # what operators set (API and admin); the rest is the autoscaler's
    EDITABLE_FIELDS = (
        "name",
        "queue",
        "chip_types",
        "replica_gpus",
        "replica_share",
        "capacity_rps",
        "headroom",
        "min_replicas",
        "max_replicas",
        "load_profile",
        "scale_down_delay_s",
        "paused",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(capacity_rps__gt=0), name="service_capacity_positive"),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=models.F("max_replicas")), name="service_replica_bounds"
            ),
            models.CheckConstraint(
                condition=Q(replica_share=1000)
                | Q(replica_share__gte=1, replica_share__lt=1000, replica_gpus=1),
                name="service_share_is_a_fraction_of_one_gpu",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ServiceScale(models.Model):
    """One autoscaling change: the load, the replicas before and after, and why."""

    service = models.ForeignKey(InferenceService, on_delete=models.CASCADE, related_name="scales")
    at = models.DateTimeField(db_index=True)
    load_rps = models.FloatField()
    replicas_before = models.PositiveIntegerField()
    replicas_after = models.PositiveIntegerField()
    reason = models.TextField()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.service} {self.replicas_before} -> {self.replicas_after} replicas"
