"""Each pending job's expected start, as the last forecast refresh played it (scheduling.forecast),
and its first forecast kept for the check against its real start."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from scheduling.choices import JobState


class JobForecast(models.Model):
    job = models.OneToOneField(
        "scheduling.Job", primary_key=True, on_delete=models.CASCADE, related_name="forecast"
    )
    p50 = models.DateTimeField(null=True, blank=True, help_text="Expected start; empty: beyond the horizon")
    p90 = models.DateTimeField(null=True, blank=True, help_text="Nine in ten start before this")
    computed_at = models.DateTimeField(help_text="The refresh that played it")
    first_at = models.DateTimeField(help_text="The first refresh that saw the job pending")
    first_p50 = models.DateTimeField(null=True, blank=True, help_text="What that refresh expected")
    first_played = models.DateTimeField(
        null=True, blank=True, help_text="The start in that refresh's play, before the calibration"
    )
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="When it first started, once a refresh saw it running"
    )

    class Meta:
        ordering = ["job_id"]
        indexes = [models.Index(fields=["started_at"], name="forecast_checked")]
        constraints = [
            models.CheckConstraint(
                condition=Q(p50__isnull=True) | Q(p90__isnull=True) | Q(p90__gte=F("p50")),
                name="forecast_p90_not_before_p50",
            ),
            models.CheckConstraint(
                condition=Q(computed_at__gte=F("first_at")), name="forecast_first_is_first"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.p50} / {self.p90}"

    def as_dict(self) -> dict:
        return {"p50": self.p50, "p90": self.p90, "computed_at": self.computed_at}


def expected_start(job) -> dict | None:
    """A job's expected start as the API and pages show it (None: not pending, or not played yet)."""
    if job.state != JobState.PENDING:
        return None
    row = getattr(job, "forecast", None)
    return row.as_dict() if row is not None else None
