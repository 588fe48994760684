from django.db import models

from engine.faults import Action


class FaultSource(models.TextChoices):
    XID = "xid", "XID"
    HEALTH_CHECK = "health_check", "Health check"
    HEARTBEAT_LOSS = "heartbeat_loss", "Heartbeat loss"
    JOB_HANG = "job_hang", "Job-reported hang"
    LINK_DOWN = "link_down", "Link down"
    HOST_MAINTENANCE = "host_maintenance", "Unplanned host maintenance"
    OPERATOR = "operator", "Operator"


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


FaultAction = models.TextChoices(
    "FaultAction", [(a.name, (a.value, a.value.replace("_", " "))) for a in Action]
)
