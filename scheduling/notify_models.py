"""Webhook deliveries: one per job state change a tenant asked to hear of (scheduling.webhooks)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    job = models.ForeignKey("scheduling.Job", on_delete=models.CASCADE, related_name="webhooks")
    event = models.OneToOneField(
        "scheduling.JobEvent", on_delete=models.CASCADE, related_name="webhook", help_text="What it announces"
    )
    kind = models.CharField(max_length=16, help_text="started, preempted, recovered, finished or failed")
    url = models.URLField(max_length=500)
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_status = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The receiver's HTTP status"
    )
    last_error = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(state="delivered", delivered_at__isnull=False)
                | (~Q(state="delivered") & Q(delivered_at__isnull=True)),
                name="webhook_delivered_has_its_time",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} of job {self.job_id} to {self.url} ({self.state})"
