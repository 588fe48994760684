"""Job notifications: a job's state changes posted to the webhook URL of the job, else of its queue.

A Celery task on the default queue (``deliver_webhooks``, every MYRIAD_WEBHOOK_INTERVAL_S), never
the cycle: it turns new job events (admitted: ``started``; ``preempted``, ``recovered``,
``finished``, ``failed``) of jobs with a URL into ``WebhookDelivery`` rows, one per event, then
posts the due ones, several at once, each with a timeout. A delivery that gets no 2xx is tried
again after MYRIAD_WEBHOOK_BACKOFF_S, doubling each time up to an hour, MYRIAD_WEBHOOK_MAX_ATTEMPTS
times in all; redirects are not followed. Each post is signed with its queue's secret:
``X-Myriad-Signature: t=<unix seconds>,sha256=<HMAC-SHA256 of "<t>.<body>">``.

The control plane must not become a way into its own network: a URL must be http(s) and every
address its host resolves to public, or inside MYRIAD_WEBHOOK_ALLOW; checked when the URL is given
and again before each post (the name may resolve elsewhere by then). When the URL is given, the
request waits at most MYRIAD_WEBHOOK_RESOLVE_S for the name: the lookup runs on in the background
and its answer (addresses or "does not resolve") is kept RESOLVED_TTL_S, so a slow or unreachable
resolver costs a submit a bounded wait and a burst of submits with one URL one lookup. The check
before a post always resolves afresh.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from scheduling.choices import EventKind
from scheduling.models import JobEvent, Queue, WebhookDelivery

EVENTS = {
    EventKind.ADMITTED: "started",
    EventKind.PREEMPTED: "preempted",
    EventKind.RECOVERED: "recovered",
    EventKind.FINISHED: "finished",
    EventKind.FAILED: "failed",
}
MAX_AGE_S = 3600.0  # events older than this when first seen are not announced (a URL set on an old queue)
LEASE_S = 600.0  # a claimed delivery comes back after this if its worker died
MAX_BACKOFF_S = 3600.0
THREADS = 8
BATCH = 100
State = WebhookDelivery.State
UPDATED = ("attempts", "last_status", "last_error", "state", "delivered_at", "next_attempt_at")


RESOLVED_TTL_S = 60.0  # a name's answer is kept this long for the checks of given URLs
RESOLVED_MAX = 4096


class WebhookURLError(ValueError):
    pass


def _resolve(host: str, port: int) -> list[str] | None:
    """The host's addresses now, however long the resolver takes; None when it does not resolve."""
    try:
        return [i[4][0] for i in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)]
    except (socket.gaierror, UnicodeError, OSError):
        return None


class _Lookup:
    def __init__(self):
        self.done = threading.Event()
        self.found: list[str] | None = None


class _Resolver:
    """Name lookups for the checks of given URLs: each runs on a thread of its own pool, a caller
    waits for it at most its bound, and the answer is kept RESOLVED_TTL_S (also after the caller
    stopped waiting, so the next check of the name finds it)."""

    def __init__(self):
        self.answers: dict[tuple[str, int], tuple[float, list[str] | None]] = {}  # -> (until, addresses)
        self.after_fork()

    def after_fork(self) -> None:
        """A forked process (a pre-forking worker) has none of its parent's lookup threads: it
        starts a pool of its own and waits for no lookup its parent had under way."""
        self.lock = threading.Lock()
        self.asked: dict[tuple[str, int], _Lookup] = {}
        self.pool: ThreadPoolExecutor | None = None

    def addresses(self, host: str, port: int, wait_s: float) -> list[str] | None:
        """The host's addresses; None when it does not resolve. TimeoutError past ``wait_s``."""
        key = (host, port)
        with self.lock:
            kept = self.answers.get(key)
            if kept is not None and kept[0] > time.monotonic():
                return kept[1]
            lookup = self.asked.get(key)
            if lookup is None:
                lookup = self.asked[key] = _Lookup()
                if self.pool is None:
                    self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-resolve")
                self.pool.submit(self._look_up, key, lookup)
        if not lookup.done.wait(wait_s):
            raise TimeoutError
        return lookup.found

    def _look_up(self, key: tuple[str, int], lookup: _Lookup) -> None:
        lookup.found = _resolve(*key)
        with self.lock:
            if len(self.answers) >= RESOLVED_MAX:
                self.answers.clear()
            self.answers[key] = (time.monotonic() + RESOLVED_TTL_S, lookup.found)
            self.asked.pop(key, None)
        lookup.done.set()

    def forget(self) -> None:
        with self.lock:
            self.answers.clear()


RESOLVER = _Resolver()
os.register_at_fork(after_in_child=RESOLVER.after_fork)


def _internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def check_url(url: str, *, fresh: bool = False) -> None:
    """WebhookURLError unless ``url`` is http(s) and its host resolves only to public addresses or
    to addresses MYRIAD_WEBHOOK_ALLOW names. ``fresh``: resolve now, however long it takes (before
    a post); otherwise the kept answer, or a lookup waited for at most MYRIAD_WEBHOOK_RESOLVE_S."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookURLError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise WebhookURLError("names no host")
    if parts.username or parts.password:
        raise WebhookURLError("must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookURLError("has a port that is not a number from 0 to 65535") from None
    if fresh:
        found = _resolve(parts.hostname, port)
    else:
        wait_s = settings.WEBHOOK_RESOLVE_S
        try:
            found = RESOLVER.addresses(parts.hostname, port, wait_s)
        except TimeoutError:
            raise WebhookURLError(
                f"its host {parts.hostname!r} did not resolve within {wait_s:g} s"
            ) from None
    if found is None:
        raise WebhookURLError(f"its host {parts.hostname!r} does not resolve")
    for address in found:
        ip = ipaddress.ip_address(address.split("%")[0])
        if _internal(ip) and not any(ip in net for net in settings.WEBHOOK_ALLOW):
            raise WebhookURLError(
                f"its host {parts.hostname} is {ip}, a loopback, private or link-local address "
                "that MYRIAD_WEBHOOK_ALLOW does not name"
            )


def ensure_secret(queue: Queue) -> None:
    """A queue whose jobs post webhooks has a secret to sign them with."""
    if not queue.webhook_secret:
        Queue.objects.filter(pk=queue.pk, webhook_secret="").update(webhook_secret=secrets.token_hex(32))
        queue.refresh_from_db(fields=["webhook_secret"])


def rotate_secret(queue: Queue) -> str:
    queue.webhook_secret = secrets.token_hex(32)
    queue.save(update_fields=["webhook_secret", "updated_at"])
    return queue.webhook_secret


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},sha256={digest}"


def enqueue(now: datetime | None = None) -> int:
    """Deliveries for the job events not yet announced: of jobs with a URL (their own or their
    queue's), newer than the newest event already announced and than MAX_AGE_S."""
    now = now or timezone.now()
    after = WebhookDelivery.objects.aggregate(m=Max("event_id"))["m"] or 0
    events = list(
        JobEvent.objects.filter(
            id__gt=after, at__gte=now - timedelta(seconds=MAX_AGE_S), kind__in=list(EVENTS)
        )
        .filter(~Q(job__webhook_url="") | ~Q(job__queue__webhook_url=""))
        .select_related("job__queue")
        .order_by("id")[:5000]
    )
    rows = []
    for e in events:
        job = e.job
        rows.append(
            WebhookDelivery(
                job=job,
                event=e,
                kind=EVENTS[e.kind],
                url=job.webhook_url or job.queue.webhook_url,
                payload={
                    "event": EVENTS[e.kind],
                    "event_id": e.pk,
                    "at": e.at.isoformat(),
                    "reason": e.reason,
                    "job": {"id": job.pk, "name": job.name, "queue": job.queue.name, "gpus": job.gpus},
                },
                next_attempt_at=now,
                created_at=now,
            )
        )
    for queue in {e.job.queue_id: e.job.queue for e in events}.values():
        ensure_secret(queue)
    WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)  # one per event, whoever ran first
    return len(rows)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect could point inside: it is the receiver's error


def _opener():
    return urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def _post(url: str, body: bytes, headers: dict) -> tuple[int | None, str]:
    """(HTTP status or None, error text) of one post."""
    try:
        check_url(url, fresh=True)
    except WebhookURLError as exc:
        return None, f"refused: {exc}"
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _opener().open(request, timeout=settings.WEBHOOK_TIMEOUT_S) as answer:
            return answer.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, (str(reason) or type(reason).__name__)[:255]


def backoff_s(attempts: int) -> float:
    return min(settings.WEBHOOK_BACKOFF_S * 2 ** (attempts - 1), MAX_BACKOFF_S)


def deliver_due(now: datetime | None = None) -> dict:
    """Post the due deliveries (claimed first, so two workers never post one twice)."""
    now = now or timezone.now()
    with transaction.atomic():
        due = WebhookDelivery.objects.filter(state=State.PENDING, next_attempt_at__lte=now)
        if connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True)
        ids = list(due.order_by("next_attempt_at", "id").values_list("id", flat=True)[:BATCH])
        WebhookDelivery.objects.filter(id__in=ids).update(next_attempt_at=now + timedelta(seconds=LEASE_S))
    claimed = list(WebhookDelivery.objects.filter(id__in=ids).select_related("job__queue").order_by("id"))
    posts = []
    for d in claimed:
        body = json.dumps(d.payload, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "myriad-webhooks",
            "X-Myriad-Event": d.kind,
            "X-Myriad-Delivery": str(d.pk),
            "X-Myriad-Signature": sign(d.job.queue.webhook_secret, int(time.time()), body),
        }
        posts.append((d.url, body, headers))
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        answers = list(pool.map(lambda p: _post(*p), posts))
    counts = {"delivered": 0, "retrying": 0, "failed": 0}
    for d, (code, error) in zip(claimed, answers, strict=True):
        d.attempts += 1
        d.last_status, d.last_error = code, error
        if code is not None and 200 <= code < 300:
            d.state, d.delivered_at = State.DELIVERED, timezone.now()
            counts["delivered"] += 1
        elif d.attempts >= settings.WEBHOOK_MAX_ATTEMPTS or error.startswith("refused"):
            d.state = State.FAILED
            counts["failed"] += 1
        else:
            d.next_attempt_at = now + timedelta(seconds=backoff_s(d.attempts))
            counts["retrying"] += 1
        d.save(
            update_fields=[
                "attempts",
                "last_status",
                "last_error",
                "state",
                "delivered_at",
                "next_attempt_at",
            ]
        )
    return counts
