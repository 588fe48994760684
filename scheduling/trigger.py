"""Ask for a scheduling cycle without flooding the workers, and tell agents their assignments changed.

A burst of 10,000 submits must not queue 10,000 cycles: the first submit leaves a marker and
queues one cycle; later submits see the marker and do nothing. The cycle removes the marker
before it reads the pending jobs, so a job committed after that read queues the next cycle.
The marker lives in Redis when MYRIAD_REDIS_URL is set, else in a file under MYRIAD_DATA_DIR;
it expires after a minute in case a worker died holding it (beat runs cycles regardless).

A cycle that submits and changes ask for starts at least MYRIAD_CYCLE_MIN_INTERVAL_S after the
previous one ended (as Slurm's ``sched_min_interval`` spaces its main loop): under a steady stream
of submits cycles do not run back to back (each reads every pending job: at 15,000 pending one
costs a third of a second of a core, more while the web servers share it). A quiet cluster's cycle
starts at once; a cycle that stopped at its start limit asks for the next at once. A cycle task
carries the requests made before it was sent or put off (``asked_at``): one that finds a cycle has
started since then has nothing left to carry and ends, so put-off tasks do not pile up.

The cycle itself is queued by whoever listens to ``scheduling.signals.cycle_wanted`` (the Celery
task, connected in SchedulingConfig.ready), so asking for one imports no task.

Agents long-poll a version number that grows whenever any node's assignments may have changed
(``assignments_changed`` after the commit, ``assignments_version``), in Redis or a file.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction

from cluster.outages import best_effort
from scheduling.signals import cycle_wanted

MARKER_TTL_S = 60
_KEY = "myriad:scheduling:cycle-requested"
VERSION_KEY = "myriad:agent:assignments-version"


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


def _moment_path(moment: str) -> Path:
    return Path(settings.DATA_DIR) / f"scheduling-cycle.{moment}"


def _note(moment: str) -> None:
    """Keep the time of a requested cycle's ``moment`` ("started", "ended"): in Redis, else as a
    file's modification time (the kernel's coarse clock, a few ms behind: never ahead)."""
    if settings.REDIS_URL:
        _redis().set(f"myriad:scheduling:cycle-{moment}", repr(time.time()), ex=3600)
    else:
        _moment_path(moment).touch()


def _when(moment: str) -> float | None:
    """The last time kept for ``moment`` (None: none yet)."""
    if settings.REDIS_URL:
        kept = _redis().get(f"myriad:scheduling:cycle-{moment}")
        return float(kept) if kept else None
    try:
        return _moment_path(moment).stat().st_mtime
    except FileNotFoundError:
        return None


def note_cycle_started() -> None:
    """Called as a requested cycle clears the marker, before it reads: what was asked until now is
    in what it reads (``started_since``)."""
    _note("started")


def started_since(moment: float) -> bool:
    """Whether a requested cycle has started since ``moment`` (a Unix time): one that has read what
    was asked before it."""
    started = _when("started")
    return started is not None and started > moment


def note_cycle_ended() -> None:
    """Called as a requested cycle ends: the next one waits the minimum interval from now."""
    _note("ended")


def seconds_until_allowed() -> float:
    """How long until the next requested cycle may start (0: now)."""
    interval = settings.CYCLE_MIN_INTERVAL_S
    if interval <= 0:
        return 0.0
    ended = _when("ended")
    if ended is None:
        return 0.0
    return max(0.0, min(interval, ended + interval - time.time()))


def request_cycle(*, at_once: bool = False) -> None:
    """Queue one scheduling cycle after the current transaction commits, unless one is queued; it
    starts once the minimum interval since the last cycle ended has passed (``at_once``: now, even
    when a cycle is already queued)."""

    def enqueue() -> None:
        if mark_requested() or at_once:
            wait = 0.0 if at_once else seconds_until_allowed()
            cycle_wanted.send(sender=request_cycle, at_once=at_once, countdown=wait)

    # without Redis the job is still saved: the workers' own timers run the cycle (scheduling.tasks)
    transaction.on_commit(lambda: best_effort("asking for a scheduling cycle", enqueue))


def assignments_changed() -> None:
    """Tell waiting agents that assignments may have changed (after the current commit)."""
    transaction.on_commit(lambda: best_effort("telling agents their assignments changed", _bump_version))


def _version_path() -> Path:
    return Path(settings.DATA_DIR) / "assignments.version"


def _bump_version() -> None:
    if settings.REDIS_URL:
        _redis().incr(VERSION_KEY)
        return
    with open(_version_path(), "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        value = int(f.read() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(value).encode())


def assignments_version() -> int:
    """A number that grows whenever any node's assignments may have changed (agents long-poll it)."""
    if settings.REDIS_URL:  # while Redis is down agents see no change and poll again at their timeout
        read = _redis().get
        return int(best_effort("reading the assignments' version", read, VERSION_KEY, default=0) or 0)
    try:
        return int(_version_path().read_bytes() or 0)
    except (FileNotFoundError, ValueError):
        return 0
