from django.db import models

from cluster.choices import engine_choices
from engine.faults import FAULT_SOURCES, Action

FaultSource = engine_choices(
    "FaultSource",
    FAULT_SOURCES,
    {
        "xid": "XID",
        "job_hang": "Job-reported hang",
        "host_maintenance": "Unplanned host maintenance",
    },
)


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


FaultAction = engine_choices("FaultAction", Action, {a.value: a.value.replace("_", " ") for a in Action})
