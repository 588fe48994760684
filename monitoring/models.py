"""Fault events: what failed, when, what the controller did about it, and when it cleared."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from cluster.models import GPU, DatacenterLink, Node, Pod
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
