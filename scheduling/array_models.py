"""Job arrays: one submit of many jobs that differ only by their index (scheduling.arrays)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class JobArray(models.Model):
    """What one array submit asked for. Each of its jobs is a whole job (its own state, events,
    GPUs and ETTR) that points back here with its index; ``max_running`` is honoured by the
    engine in every cycle."""

    name = models.CharField(max_length=128, blank=True)
    queue = models.ForeignKey("scheduling.Queue", on_delete=models.PROTECT, related_name="arrays")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    spec = models.CharField(max_length=4096, help_text='The indices as submitted, e.g. "0-9999%500"')
    size = models.PositiveIntegerField(help_text="How many jobs (indices) it has")
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this many of its jobs run at once (the %N); empty: no limit"
    )
    submitted_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(condition=Q(size__gte=1), name="array_not_empty"),
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1), name="array_limit_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"array {self.pk}"
