"""Usage per queue, chip type and day: the rollup chargeback reads (scheduling.chargeback)."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q


class UsageDay(models.Model):
    """GPU-seconds a queue held of a chip type on a day (UTC), as the cluster sampler saw them every
    MYRIAD_SAMPLE_INTERVAL_S: allocated (shares counted as their fraction), used (allocated weighted
    by the GPUs' utilization in the newest frame), borrowed from its cohort and lent to it."""

    queue = models.ForeignKey("scheduling.Queue", on_delete=models.CASCADE, related_name="usage_days")
    chip_type = models.ForeignKey("cluster.ChipType", on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField(db_index=True)
    allocated_gpu_s = models.FloatField(default=0.0)
    used_gpu_s = models.FloatField(default=0.0)
    borrowed_gpu_s = models.FloatField(default=0.0)
    lent_gpu_s = models.FloatField(default=0.0)

    class Meta:
        ordering = ["day", "queue_id", "chip_type_id"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "chip_type", "day"], name="usage_day_once"),
            models.CheckConstraint(
                condition=Q(allocated_gpu_s__gte=0)
                & Q(used_gpu_s__gte=0)
                & Q(borrowed_gpu_s__gte=0)
                & Q(lent_gpu_s__gte=0)
                & Q(used_gpu_s__lte=F("allocated_gpu_s") * 1.000001 + 0.001),
                name="usage_day_sane",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.chip_type_id} {self.day}"
