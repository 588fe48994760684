from django.db import models  # noqa: F401  (scheduling models arrive with the scheduling engine)
