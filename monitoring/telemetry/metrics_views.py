"""The scrape endpoints: ``/metrics`` (the control plane) and ``/metrics/gpus`` (every GPU, with
dcgm-exporter's names; ``?shard=K&of=N`` or ``?datacenter=NAME`` for a part of the fleet).

A scrape is let in by a bearer token (MYRIAD_METRICS_TOKEN, Prometheus' ``authorization``
setting) or by its address (MYRIAD_METRICS_ALLOW, networks such as ``10.0.0.0/8``); anything else
gets 401. Plain Django views: a scrape needs neither sessions nor the API's roles. The GPUs' text
is streamed: 145 MB at 100k GPUs, never whole in memory."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import AsyncIterator, Iterator

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from monitoring.telemetry.gpu_metrics import ShardError, gpu_exposition
from monitoring.telemetry.metrics import control_plane_exposition


def _allowed(request) -> bool:
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), token):
        return True
    if settings.METRICS_ALLOW:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        return any(address in network for network in settings.METRICS_ALLOW)
    return False


def _refused() -> HttpResponse:
    how = "a bearer token (MYRIAD_METRICS_TOKEN)" if settings.METRICS_TOKEN else "MYRIAD_METRICS_ALLOW"
    response = HttpResponse(
        json.dumps({"detail": f"metrics need {how}"}), status=401, content_type="application/json"
    )
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _bad(field: str, message: str) -> HttpResponse:
    return HttpResponse(json.dumps({field: [message]}), status=400, content_type="application/json")


@require_GET
def control_plane(request):
    if not _allowed(request):
        return _refused()
    return HttpResponse(control_plane_exposition(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def gpus(request):
    if not _allowed(request):
        return _refused()
    unknown = sorted(set(request.GET) - {"shard", "of", "datacenter"})
    if unknown:
        return _bad(unknown[0], "unknown parameter; use shard and of, or datacenter")
    numbers = {}
    for name in ("shard", "of"):
        raw = request.GET.get(name)
        if raw is None:
            numbers[name] = None
            continue
        try:
            numbers[name] = int(raw)
        except ValueError:
            return _bad(name, f"must be a whole number, not {raw!r}"[:200])
    try:
        pieces = gpu_exposition(numbers["shard"], numbers["of"], request.GET.get("datacenter"))
    except ShardError as exc:
        return _bad(exc.field, exc.message)
    if isinstance(request, ASGIRequest):
        pieces = _in_threads(pieces)
    return StreamingHttpResponse(pieces, content_type=CONTENT_TYPE_LATEST)


async def _in_threads(pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
    """The pieces for the ASGI server, each formatted in a worker thread: the event loop that also
    serves the websockets never waits on one, and the pieces are sent as they come (handed a plain
    iterator, Django would collect them all first)."""
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        yield piece
