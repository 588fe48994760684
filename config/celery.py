"""The Celery application. Broker: Redis when MYRIAD_REDIS_URL is set, else an embedded
file-system broker that needs no server (the worker and beat started by `make demo` share it)."""

import gc
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("myriad")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_ready.connect
@signals.worker_process_init.connect
def _freeze_loaded(**kwargs) -> None:
    """What the worker has loaded by now lives as long as the process: keep it out of the cyclic
    collector's passes (as the web process does, config/asgi.py)."""
    gc.freeze()
