import contextlib
import logging
import threading
import time

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from cluster.outages import best_effort, redis_errors
from cluster.snapshot import topology_cache
from scheduling import forecast, webhooks
from scheduling.cycle import run_cycle, warm
from scheduling.inference import autoscale_all
from scheduling.store import allocations, layouts
from scheduling.trigger import (
    clear_requested,
    mark_requested,
    note_cycle_ended,
    note_cycle_started,
    seconds_until_allowed,
    started_since,
)

log = logging.getLogger("myriad.scheduling")

# A cycle task put off runs again at its countdown, and Celery runs a task with a countdown on its
# timer thread, beside the task the worker's main thread is running: one turn at a time in this
# process, so the second of two due tasks finds the first one's end and is put off in its turn.
_turn = threading.Lock()
BUSY_RETRY_S = 0.1  # a cycle task that found another cycle running tries again after at least this


@shared_task(ignore_result=True, time_limit=120, soft_time_limit=100)
def run_scheduling_cycle(at_once: bool = False, asked_at: float | None = None) -> dict:
    """One scheduling cycle. Cycles run one at a time (the scheduling lock); the request marker is
    cleared first so jobs submitted while this cycle runs queue the next one. A cycle due before
    the minimum interval since the last one ended (scheduling.trigger) is put off until then, the
    marker kept, so submits meanwhile queue nothing more. So is one that finds another cycle
    running (another worker on the cycle queue: a standby). A task put off carries what was asked
    before ``asked_at``; when a cycle has started since, that cycle read it, and the task ends. The
    start limit's follow-up (``at_once``) waits for the lock and runs. Run inline (eager), it runs
    at once."""
    inline = run_scheduling_cycle.request.is_eager or run_scheduling_cycle.app.conf.task_always_eager
    with contextlib.nullcontext() if inline else _turn:  # inline: inside the caller's turn, if any
        if not (at_once or inline):
            if asked_at is not None and best_effort(
                "reading the last cycle's start", started_since, asked_at, default=False
            ):
                return {"ran": False, "covered": True}
            wait = best_effort("reading the last cycle's end", seconds_until_allowed, default=0.0)
            if wait > 0:
                return _put_off(wait, asked_at)
        best_effort("clearing the cycle request", clear_requested)
        best_effort("noting the cycle's start", note_cycle_started)
        summary = None
        try:
            summary = run_cycle(wait=at_once or inline)
        finally:
            if summary is None or summary.ran:
                best_effort("noting the cycle's end", note_cycle_ended)
        if not summary.ran:  # another cycle holds the lock: after it, the interval
            best_effort("keeping the cycle request", mark_requested)
            return {**_put_off(max(settings.CYCLE_MIN_INTERVAL_S, BUSY_RETRY_S), None), "busy": True}
        return summary.as_dict()


def _put_off(wait: float, asked_at: float | None) -> dict:
    """Send the cycle task again in ``wait`` seconds, carrying what was asked until ``asked_at``
    (default: now)."""
    asked_at = time.time() if asked_at is None else asked_at
    run_scheduling_cycle.apply_async(countdown=wait, kwargs={"asked_at": asked_at})
    return {"ran": False, "put_off_s": round(wait, 3)}


def _cycles_while_broker_is_down(interval_s: float) -> None:
    """While the broker (Redis) does not answer, this worker runs the scheduling cycle itself every
    interval: jobs keep being admitted from the database. The scheduling lock keeps cycles of
    several workers one at a time; a worker that finds the lock taken skips its turn."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=2, socket_timeout=2)
    while True:
        time.sleep(interval_s)
        try:
            client.ping()
        except redis_errors():
            _cycle_without_broker()


def _cycle_without_broker() -> None:
    from django.db import close_old_connections, connection

    try:
        close_old_connections()
        summary = run_cycle(wait=False)
        log.warning("the broker is not answering: this worker ran the cycle itself (%s)", summary.ran)
    except Exception:  # noqa: BLE001 - the next turn tries again; the database may be down too
        log.exception("a cycle run while the broker is down failed")
    finally:
        connection.close()


_timer: list[threading.Thread] = []  # this worker's one timer thread


def _takes_cycles(sender) -> bool:
    """Whether the worker that ``sender`` (its consumer) belongs to consumes the cycle queue."""
    amqp = getattr(getattr(sender, "app", None), "amqp", None)
    return amqp is not None and "cycle" in set(amqp.queues.consume_from or {})


@worker_ready.connect
def start_cycle_timer(sender=None, **_kwargs) -> None:
    """Workers that take scheduling cycles, on a Redis broker, keep a timer for its outages."""
    if not settings.REDIS_URL or not _takes_cycles(sender) or _timer:
        return
    interval = float(settings.SCHEDULING_CYCLE_INTERVAL_S)
    timer = threading.Thread(target=_cycles_while_broker_is_down, args=(interval,), daemon=True)
    _timer.append(timer)
    timer.start()


@worker_ready.connect
def warm_up(sender=None, **_kwargs) -> None:
    """Load the topology snapshot and the active allocations when the worker starts, and in a
    worker that takes cycles the rest of what a cycle reads (queues, running and pending jobs:
    scheduling.cycle.warm), before it says it is ready, so the first cycle after a restart is as
    fast as the others (at 100k GPUs the snapshot takes about half a second to load, the
    allocations about 0.1 s, 10,000 pending jobs about 50 ms)."""

    try:
        allocations.active_pairs()
        if _takes_cycles(sender):
            warm()
        else:
            layouts.layout(topology_cache.current())
    except Exception:  # noqa: BLE001 - an empty or unmigrated database: the first cycle loads it
        log.warning("could not preload the topology", exc_info=True)


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def autoscale_services() -> dict:
    """Replicas of every inference service follow their load profile (Celery beat runs this)."""

    return autoscale_all()


@shared_task(ignore_result=True, time_limit=120, soft_time_limit=100)
def deliver_webhooks() -> dict:
    """Announce new job state changes and post the due webhooks (Celery beat runs this, on the
    default queue: a slow receiver never holds a cycle)."""

    return {"queued": webhooks.enqueue(), **webhooks.deliver_due()}


@shared_task(ignore_result=True, time_limit=120, soft_time_limit=100)
def forecast_starts() -> dict:
    """Every pending job's expected start, played again (Celery beat runs this, on the default
    queue: the play never holds a cycle)."""

    return forecast.refresh().as_dict()
