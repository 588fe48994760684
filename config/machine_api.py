"""The API calls of machine clients (pipelines, tenants' scripts, agents), served on a shorter
path: a request under ``/api/`` that carries ``Authorization: Token ...`` or ``Authorization:
Node ...`` runs Django's own handler, URL routes and DRF views (the same authentication,
permissions, throttles, validation and error answers), but without the middleware that only a
browser needs (static files, sessions, the session's user, messages), and synchronously on a
small pool of threads that keep their database connections.

Django's ASGI handler starts a thread for every request, moves it between the event loop and
threads several times (once for each change between async and sync middleware, and for each
request signal), and takes a database connection from the pool and checks it on every request;
for a job submit that was half of the server's time. Everything else (browsers, anonymous calls,
other authorization schemes) goes through Django as before: the answer never depends on which path
served it (``tests/test_machine_api.py`` sends the same requests both ways).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl, urlencode

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpResponse
from django.urls import get_resolver, set_script_prefix

from scheduling.trigger import assignments_version

# what only a browser's request uses: the machine path leaves these out
BROWSER_MIDDLEWARE = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    }
)
# the authorization schemes the API's authentication classes answer on their own (a failure is
# final there: the session is never consulted), so leaving the session out changes no answer
SCHEMES = (b"token ", b"node ")


def _scheme(scope) -> bytes | None:
    """The request's authorization scheme, lowercased with its space (b"token "), or None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            for scheme in SCHEMES:
                if value[: len(scheme)].lower() == scheme:
                    return scheme
            return None
    return None


def machine_request(scope) -> bool:
    if scope["type"] != "http" or not scope["path"].startswith("/api/"):
        return False
    return _scheme(scope) is not None


POLL_PATH = "/api/v1/agent/assignments/"
POLL_EVERY_S = 0.2
MAX_WAIT_S = 25.0


class _VersionWatch:
    """The agents' long poll waits here, on the event loop, not on a pool thread: one task per
    process reads the assignments' version every 0.2 s and wakes every poll waiting on a change,
    so a thousand waiting agents hold no thread and cost one read, and other machine calls never
    queue behind them."""

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool = pool
        self.version: int | None = None
        self.changed: asyncio.Event | None = None
        self.task: asyncio.Task | None = None

    async def wait(self, seen: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            self.changed = asyncio.Event()
            self.version = await loop.run_in_executor(None, assignments_version)
            self.task = loop.create_task(self._follow())
        deadline = loop.time() + timeout
        while self.version == seen:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(POLL_EVERY_S)
            version = await loop.run_in_executor(None, assignments_version)
            if version != self.version:
                self.version = version
                woken, self.changed = self.changed, asyncio.Event()
                woken.set()


def _long_poll(scope) -> tuple[int, float] | None:
    """(version seen, seconds to wait) of an agent's long poll, or None (the view judges it)."""
    if scope["path"] != POLL_PATH or scope.get("method") != "GET":
        return None
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    try:
        seen, wait = int(query.get("version", "-1")), float(query.get("wait", "0"))
    except ValueError:
        return None
    if not 0 < wait <= 3600:
        return None
    return seen, min(wait, MAX_WAIT_S)


# paths whose resolution a web process remembers (then it forgets them all and starts again)
RESOLVED_PATHS = 4096


class _Handler(ASGIHandler):
    """Django's ASGI handler with the API's middleware, called synchronously (sync middleware and
    views, no adapters between them)."""

    def __init__(self):
        BaseHandler.__init__(self)
        self.resolved: dict = {}  # (resolver, path) -> its ResolverMatch
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = [m for m in full if m not in BROWSER_MIDDLEWARE]
        try:
            self.load_middleware(is_async=False)
        finally:
            settings.MIDDLEWARE = full

    def resolve_request(self, request):
        """Django's resolution of the request's path, remembered per path: machine clients call the
        same few paths over and over, and Django tries the URL patterns in order each time (a
        hundred before ``/api/v1/jobs/``, a tenth of a submit's time). The match depends on the
        path and the URL configuration alone; a new configuration (tests) is a new resolver."""
        if hasattr(request, "urlconf"):  # a middleware chose another configuration
            return super().resolve_request(request)
        resolver, path = get_resolver(), request.path_info
        match = self.resolved.get((resolver, path))
        if match is None:
            match = resolver.resolve(path)  # a path that matches nothing raises: never remembered
            if len(self.resolved) >= RESOLVED_PATHS:
                self.resolved.clear()
            self.resolved[(resolver, path)] = match
        request.resolver_match = match
        return match

    def serve(self, scope, body_file):
        """The response to one request, its body rendered, on the calling (pool) thread."""
        set_script_prefix(settings.FORCE_SCRIPT_NAME or scope.get("root_path", "") or "/")
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
        # none of the API's answers streams; one that ever does is rendered here
        content = b"".join(response.streaming_content) if response.streaming else response.content
        # the request's own resources (uploaded files); not response.close(), whose request_finished
        # signal would hand this thread's database connection back to the pool
        for closer in response._resource_closers:
            closer()
        body_file.close()
        return response, content


RETRY_AFTER_S = 1


def busy(why: str) -> HttpResponse:
    """The answer to a request the server sheds: 503 with Retry-After, and nothing done."""
    body = json.dumps(
        {"detail": f"the server is busy ({why}); nothing was done: retry after {RETRY_AFTER_S} s"}
    )
    response = HttpResponse(body, status=503, content_type="application/json")
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class MachineApi:
    """ASGI middleware: machine clients' API requests on the short path, the rest to ``app``.

    Overload sheds instead of queueing: a tenant's request (``Token``) that finds
    ``MYRIAD_API_MAX_IN_FLIGHT`` of them already waiting or running in this process, or that
    waited ``MYRIAD_API_QUEUE_TIMEOUT_S`` for a thread, is answered 503 with ``Retry-After`` at
    once and changes nothing, so the requests the server does take keep their latency. The node
    agents' calls (``Node``) are never shed: their number is bounded by the nodes, and the agents'
    reports are the control plane's own data."""

    def __init__(self, app):
        self.app = app
        self.handler = _Handler()
        self.pool = ThreadPoolExecutor(settings.API_THREADS, thread_name_prefix="machine-api")
        self.watch = _VersionWatch(self.pool)
        self.in_flight = 0  # tenants' requests waiting for or on a pool thread (event loop only)
        self.shed = {"in_flight": 0, "queue_timeout": 0}  # requests shed since start, by rule

    def _serve_in_time(self, scope, body_file, queued_at: float | None):
        """Serve on a pool thread, unless the request waited past the queue timeout for it."""
        if queued_at is not None and time.monotonic() - queued_at > settings.API_QUEUE_TIMEOUT_S:
            self.shed["queue_timeout"] += 1
            body_file.close()
            response = busy(f"waited over {settings.API_QUEUE_TIMEOUT_S:g} s for a thread")
            return response, response.content
        return self.handler.serve(scope, body_file)

    async def __call__(self, scope, receive, send):
        if not machine_request(scope):
            return await self.app(scope, receive, send)
        try:
            body_file = await self.handler.read_body(receive)
        except RequestAborted:  # the client went away before sending its body
            return None
        loop = asyncio.get_running_loop()
        poll = _long_poll(scope)
        if poll is not None:  # wait here for a change, then answer at once (wait=0) on a thread
            await self.watch.wait(*poll)
            query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
            scope = {**scope, "query_string": urlencode({**query, "wait": "0"}).encode()}
        sheddable = poll is None and _scheme(scope) == b"token "
        if not sheddable:
            response, content = await loop.run_in_executor(
                self.pool, self._serve_in_time, scope, body_file, None
            )
        elif self.in_flight >= settings.API_MAX_IN_FLIGHT:
            self.shed["in_flight"] += 1
            body_file.close()
            response = busy(f"{self.in_flight} requests ahead in this server process")
            content = response.content
        else:
            self.in_flight += 1
            try:
                response, content = await loop.run_in_executor(
                    self.pool, self._serve_in_time, scope, body_file, time.monotonic()
                )
            finally:
                self.in_flight -= 1
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        cookies = response.cookies.values()
        headers += [(b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in cookies]
        if response.streaming:
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"Content-Length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return None
