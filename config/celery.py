"""The Celery application. Broker: Redis when MYRIAD_REDIS_URL is set, else an embedded
file-system broker that needs no server (the worker and beat started by `make demo` share it)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("myriad")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
