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
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.urls import set_script_prefix

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


def machine_request(scope) -> bool:
    if scope["type"] != "http" or not scope["path"].startswith("/api/"):
        return False
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value[:5].lower() in SCHEMES or value[:6].lower() in SCHEMES
    return False


class _Handler(ASGIHandler):
    """Django's ASGI handler with the API's middleware, called synchronously (sync middleware and
    views, no adapters between them)."""

    def __init__(self):
        BaseHandler.__init__(self)
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = [m for m in full if m not in BROWSER_MIDDLEWARE]
        try:
            self.load_middleware(is_async=False)
        finally:
            settings.MIDDLEWARE = full

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


class MachineApi:
    """ASGI middleware: machine clients' API requests on the short path, the rest to ``app``."""

    def __init__(self, app):
        self.app = app
        self.handler = _Handler()
        self.pool = ThreadPoolExecutor(settings.API_THREADS, thread_name_prefix="machine-api")

    async def __call__(self, scope, receive, send):
        if not machine_request(scope):
            return await self.app(scope, receive, send)
        try:
            body_file = await self.handler.read_body(receive)
        except RequestAborted:  # the client went away before sending its body
            return None
        loop = asyncio.get_running_loop()
        response, content = await loop.run_in_executor(self.pool, self.handler.serve, scope, body_file)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        cookies = response.cookies.values()
        headers += [(b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in cookies]
        if response.streaming:
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"Content-Length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return None
