"""Brute force and floods: failed logins and API tokens per client address, enrolment per address,
submits per user. Each answers 429 with Retry-After and changes nothing.

Counts live in Django's cache: Redis when MYRIAD_REDIS_URL is set (shared by every web process),
else each process's memory (the embedded default runs one web process).
"""

from __future__ import annotations

import math
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from cluster.outages import best_effort


class _OpenWhileRedisIsDown:
    """A throttle whose counts cannot be read lets the request through (with a warning): an
    outage of the cache must not stop submits."""

    def allow_request(self, request, view) -> bool:
        return best_effort(f"the {self.scope} throttle", super().allow_request, request, view, default=True)


class SubmitThrottle(_OpenWhileRedisIsDown, UserRateThrottle):
    """Job submits per user (MYRIAD_SUBMIT_RATE)."""

    scope = "submit"


class EnrolThrottle(_OpenWhileRedisIsDown, AnonRateThrottle):
    """Enrolment attempts per client address (MYRIAD_ENROL_RATE): a token is not guessed."""

    scope = "enrol"


def client_address(request) -> str:
    """The caller's address: the proxy's forwarded one only behind a configured trusted proxy."""
    meta = getattr(request, "META", request)
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    if forwarded and settings.NUM_PROXIES:
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-min(settings.NUM_PROXIES, len(hops))]
    return meta.get("REMOTE_ADDR", "") or "unknown"


def _key(kind: str, who: str) -> str:
    return f"myriad:failures:{kind}:{who}"


def blocked_for(kind: str, who: str) -> int:
    """Seconds until ``who`` may try ``kind`` again (0: now, and while the counts cannot be read)."""
    until = best_effort("reading a lockout", cache.get, _key(kind, who) + ":until")
    return max(0, math.ceil(until - time.time())) if until else 0


def record_failure(kind: str, who: str) -> int:
    return best_effort("counting a failed attempt", _record_failure, kind, who, default=0)


def _record_failure(kind: str, who: str) -> int:
    """Count a failed attempt; returns the seconds ``who`` is now blocked for (0: not yet).
    ``settings.FAILURE_LIMITS[kind]`` is (attempts, window in seconds)."""
    limit, window = settings.FAILURE_LIMITS[kind]
    key = _key(kind, who)
    cache.add(key, 0, window)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between the two calls
        cache.set(key, 1, window)
        count = 1
    if count < limit:
        return 0
    cache.set(key + ":until", time.time() + window, window)
    return window


def clear_failures(kind: str, who: str) -> None:
    best_effort("clearing failed attempts", cache.delete_many, [_key(kind, who), _key(kind, who) + ":until"])
