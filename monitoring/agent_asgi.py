"""The agents' report path served straight from ASGI: ``POST /api/v1/agent/report/`` runs
``monitoring.reports.handle_report`` on a small pool of threads that keep their database
connections, skipping Django's middleware and per-request connection set-up; every other request
goes to Django. A body over AGENT_REPORT_MAX_BYTES is refused before it is read in full."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import DatabaseError, connection

REPORT_PATH = "/api/v1/agent/report/"


class AgentReports:
    def __init__(self, app):
        self.app = app
        self.pool = ThreadPoolExecutor(settings.AGENT_INGEST_THREADS, thread_name_prefix="agent-reports")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != REPORT_PATH:
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            return await _answer(send, 405, {"detail": f'Method "{scope["method"]}" not allowed.'})
        headers = dict(scope["headers"])
        limit = settings.AGENT_REPORT_MAX_BYTES
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            return await _answer(send, 400, {"body": ["Content-Length is not a number"]})
        if declared > limit:
            return await _answer(
                send, 413, {"body": [f"the report is {declared} bytes; the limit is {limit}"]}
            )
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await _answer(send, 413, {"body": [f"the report is over the limit of {limit} bytes"]})
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        loop = asyncio.get_running_loop()
        code, answer = await loop.run_in_executor(self.pool, _handle, authorization, body)
        extra = [(b"www-authenticate", b"Node")] if code == 401 else []
        return await _answer(send, code, answer, extra)


def _handle(authorization: str, body: bytes) -> tuple[int, dict]:
    from monitoring.reports import handle_report

    try:
        return handle_report(authorization, body)
    except DatabaseError as exc:  # a lost connection: the next report opens a new one
        connection.close()
        return 503, {
            "detail": f"the database did not answer ({exc.__class__.__name__}); send the report again"
        }


async def _answer(send, code: int, payload: dict, extra: list | None = None) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
