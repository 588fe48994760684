"""Brute force and floods: failed logins and API tokens per client address, enrolment per address,
submits per user. Each answers 429 with Retry-After and changes nothing.

Counts live in Django's cache: Redis when MYRIAD_REDIS_URL is set (shared by every web process),
else each process's memory (the embedded default runs one web process).

Rates (submits per user, enrolments per address) are counted as a sliding window over two fixed
windows (the previous window's count weighted by how much of it the sliding window still covers,
plus the current one's): a constant cost per request and one round trip to Redis, where DRF's own
throttle reads and writes the whole list of a user's request times (6,000 of them at 6000/min).
"""

from __future__ import annotations

import math
import threading
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from cluster.api.memo import MISSING, Memo
from cluster.outages import best_effort

_local = threading.Lock()


def _count(key: str, window: int, duration: int) -> tuple[int, int]:
    """Adds one to ``key``'s count in ``window``; returns (the previous window's count, this
    window's count with the one added). One round trip on Redis."""
    current, previous = cache.make_key(f"{key}:{window}"), cache.make_key(f"{key}:{window - 1}")
    if settings.REDIS_URL:
        client = cache._cache.get_client(write=True)
        pipe = client.pipeline(transaction=True)
        pipe.incr(current).expire(current, 2 * duration).get(previous)
        now, _, before = pipe.execute()
        return int(before or 0), int(now)
    with _local:  # this process's memory: one web process, its threads in turn
        cache.add(f"{key}:{window}", 0, 2 * duration)
        now = cache.incr(f"{key}:{window}")
        return int(cache.get(f"{key}:{window - 1}") or 0), now


def _take_back(key: str, window: int) -> None:
    """A refused request does not count."""
    if settings.REDIS_URL:
        cache._cache.get_client(write=True).decr(cache.make_key(f"{key}:{window}"))
    else:
        with _local:
            cache.decr(f"{key}:{window}")


class SlidingWindowThrottle(SimpleRateThrottle):
    """At most ``rate`` (N per second, minute, hour or day) in any window of that length, counted
    from two fixed windows: the previous one's count weighted by the part of it still inside the
    sliding window, plus the current one's. A refused request is not counted; ``wait()`` is the
    time until one more would be allowed. A throttle whose counts cannot be read lets the request
    through (with a warning): an outage of the cache must not stop submits."""

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        return best_effort(f"the {self.scope} throttle", self._allow, default=True)

    def _allow(self) -> bool:
        n, duration = self.num_requests, self.duration
        now = self.timer()
        window = int(now // duration)
        elapsed = now / duration - window  # the part of the current window gone, 0..1
        previous, current = _count(self.key, window, duration)
        if previous * (1 - elapsed) + current <= n:
            return True
        _take_back(self.key, window)
        current -= 1
        if current + 1 <= n:  # allowed once enough of the previous window has slid out
            gone = 1 - (n - current - 1) / previous
            self._wait = (gone - elapsed) * duration
        else:  # not before the next window, once enough of this one has slid out
            gone = 1 - (n - 1) / current if current else 0
            self._wait = (1 - elapsed + gone) * duration
        return False

    def wait(self) -> float:
        return max(getattr(self, "_wait", 0.0), 0.001)


class SubmitThrottle(SlidingWindowThrottle, UserRateThrottle):
    """Job submits per user (MYRIAD_SUBMIT_RATE)."""

    scope = "submit"


class EnrolThrottle(SlidingWindowThrottle, AnonRateThrottle):
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


# (kind, who) whose lockout was read as not set. Every request with a token checks the lockout
# first, a round trip to Redis that is an eighth of a submit's time; a clear answer is taken as
# still clear for CLEAR_MEMO_S. A failure in this process forgets it at once, so a lockout reached
# here blocks the next request; one reached through another web process is seen here within
# CLEAR_MEMO_S.
CLEAR_MEMO_S = 1.0
_clear = Memo(CLEAR_MEMO_S)


def blocked_for(kind: str, who: str) -> int:
    """Seconds until ``who`` may try ``kind`` again (0: now, and while the counts cannot be read)."""
    if _clear.get((kind, who)) is not MISSING:
        return 0
    until = best_effort("reading a lockout", cache.get, _key(kind, who) + ":until")
    wait = max(0, math.ceil(until - time.time())) if until else 0
    if wait:
        _clear.forget((kind, who))
    else:
        _clear.put((kind, who), True)
    return wait


def record_failure(kind: str, who: str) -> int:
    _clear.forget((kind, who))
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
