"""Ask for a scheduling cycle without flooding the workers.

A burst of 10,000 submits must not queue 10,000 cycles: the first submit leaves a marker and
queues one cycle; later submits see the marker and do nothing. The cycle removes the marker
before it reads the pending jobs, so a job committed after that read queues the next cycle.
The marker lives in Redis when MYRIAD_REDIS_URL is set, else in a file under MYRIAD_DATA_DIR;
it expires after a minute in case a worker died holding it (beat runs cycles regardless).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction

from cluster.outages import best_effort

MARKER_TTL_S = 60
_KEY = "myriad:scheduling:cycle-requested"


_clients: dict[str, object] = {}


def _redis():
    import redis

    client = _clients.get(settings.REDIS_URL)
    if client is None:  # one connection pool per process, not one per request
        client = _clients[settings.REDIS_URL] = redis.Redis.from_url(settings.REDIS_URL)
    return client


def _marker_path() -> Path:
    return Path(settings.DATA_DIR) / "scheduling-cycle.requested"


def mark_requested() -> bool:
    """True when this call set the marker (so it must queue the cycle)."""
    if settings.REDIS_URL:
        return bool(_redis().set(_KEY, "1", nx=True, ex=MARKER_TTL_S))
    path = _marker_path()
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < MARKER_TTL_S:
                return False
            path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        return mark_requested()
    os.close(fd)
    return True


def clear_requested() -> None:
    if settings.REDIS_URL:
        _redis().delete(_KEY)
    else:
        _marker_path().unlink(missing_ok=True)


def request_cycle() -> None:
    """Queue one scheduling cycle after the current transaction commits, unless one is queued."""

    def enqueue() -> None:
        if mark_requested():
            from scheduling.tasks import run_scheduling_cycle

            run_scheduling_cycle.delay()

    # without Redis the job is still saved: the workers' own timers run the cycle (scheduling.tasks)
    transaction.on_commit(lambda: best_effort("asking for a scheduling cycle", enqueue))
