"""Behaviour while a backing service is down.

- The database (restarting, failing over): a request that needs it gets 503 with a clear message
  and a Retry-After, not a traceback; the connection is dropped so the next request opens a new
  one once it is back.
- Redis (channel layer, Celery broker, live store, throttle counts): what only speeds things up or
  tells others is skipped with a warning (``best_effort``: the request for a cycle, a cycle's
  published summary, the assignments' version, throttle counts), the scheduling cycle runs from
  the workers' own timers on the database (scheduling.tasks), the live data's readers say it is
  unavailable (``LiveStoreDown``: 503 from the API, "no live data" on pages), and every client
  reconnects when Redis is back."""

from __future__ import annotations

import functools
import json
import logging

from django.db import InterfaceError, OperationalError, connections
from django.http import HttpResponse

log = logging.getLogger("myriad.outages")

RETRY_AFTER_S = 5
LIVE_MESSAGE = "live data is unavailable: the live store (Redis) is not answering; try again shortly"
MESSAGE = "the database is not answering (restarting or failing over); try again in a few seconds"


class LiveStoreDown(Exception):
    """The live store could not be read (Redis not answering)."""


@functools.cache
def redis_errors() -> tuple[type[BaseException], ...]:
    """What a client of a Redis that is down raises (redis-py, and kombu for Celery's broker)."""
    import redis
    from kombu.exceptions import OperationalError as BrokerError

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, BrokerError, LiveStoreDown)


def best_effort(what: str, fn, *args, default=None, **kwargs):
    """``fn(*args, **kwargs)``, or ``default`` with a warning when Redis is not answering."""
    try:
        return fn(*args, **kwargs)
    except redis_errors() as exc:
        log.warning("%s skipped: Redis is not answering (%s)", what, exc)
        return default


def unavailable(request, message: str = MESSAGE) -> HttpResponse:
    """503 with ``message`` (JSON on the API, a short page elsewhere) and a Retry-After."""
    for conn in connections.all(initialized_only=True):
        conn.close_if_unusable_or_obsolete()
    if request.path.startswith("/api/"):
        response = HttpResponse(json.dumps({"detail": message}), status=503, content_type="application/json")
    else:
        response = HttpResponse(
            f"<!doctype html><title>Myriad: service unavailable</title><h1>Service unavailable</h1>"
            f"<p>{message}.</p>",
            status=503,
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class DatabaseOutageMiddleware:
    """Turns a lost database connection anywhere in a view (the API's authentication included),
    or a live store that does not answer, into a 503 that says which."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, OperationalError | InterfaceError):
            log.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
            return unavailable(request)
        if isinstance(exception, LiveStoreDown):
            return unavailable(request, LIVE_MESSAGE)
        return None
