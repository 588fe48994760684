from django.db import models  # noqa: F401  (telemetry and fault models arrive with monitoring)
