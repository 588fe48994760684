"""The agents' report path served straight from ASGI: ``POST /api/v1/agent/report/`` skips
Django's middleware and per-request connection set-up; every other request goes to Django. A
body over AGENT_REPORT_MAX_BYTES is refused before it is read in full.

Reports are checked on the event loop when the credential is already known; reports of readings
only (nearly all) wait at most one batch and are applied together (``ingest_many``: one statement
and one live-store round trip per batch) on a small pool of threads that keep their database
connections; the rest (a new credential, XIDs, process states) run one by one on that pool."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import DatabaseError, connection

from cluster.api.throttling import blocked_for, record_failure
from monitoring.telemetry.ingest import ingest_many
from monitoring.telemetry.reports import answer, prepare

REPORT_PATH = "/api/v1/agent/report/"


class AgentReports:
    def __init__(self, app):
        self.app = app
        self.pool = ThreadPoolExecutor(settings.AGENT_INGEST_THREADS, thread_name_prefix="agent-reports")
        self.waiting: list = []  # (identity, report, future) for the next batch
        self.flushing = False

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
        step = prepare(authorization, body, db=False)
        if step is None:
            step = await loop.run_in_executor(self.pool, _guarded, prepare, authorization, body)
        if step[0] == "answer":
            code, answer = step[1], step[2]
            if code == 401:  # a credential that failed: counted, and an address past the limit is told so
                code, answer = await loop.run_in_executor(self.pool, _failed_credential, scope, code, answer)
        else:
            code, answer = await self._batched(loop, step[1], step[2])
        extra = [(b"www-authenticate", b"Node")] if code == 401 else []
        if code == 429:
            extra = [(b"retry-after", str(answer["retry_after"]).encode())]
        return await _answer(send, code, answer, extra)

    async def _batched(self, loop, identity, report) -> tuple[int, dict]:
        done = loop.create_future()
        self.waiting.append((identity, report, done))
        if not self.flushing:
            self.flushing = True
            loop.create_task(self._flush(loop))
        return await done

    async def _flush(self, loop) -> None:
        """One batch at a time: the reports that arrive while one is applied form the next."""
        try:
            while self.waiting:
                await asyncio.sleep(0)  # reports already read join this batch
                batch, self.waiting = self.waiting[:MAX_BATCH], self.waiting[MAX_BATCH:]
                pairs = [(identity, report) for identity, report, _ in batch]
                step = await loop.run_in_executor(self.pool, _guarded, _apply, pairs)
                for i, (_, _, done) in enumerate(batch):
                    done.set_result(step[1][i] if step[0] == "answers" else (step[1], step[2]))
        finally:
            self.flushing = False


MAX_BATCH = 500


def _apply(pairs) -> tuple:

    return ("answers", [answer(a) for a in ingest_many(pairs)])


def _guarded(fn, *args) -> tuple:
    try:
        return fn(*args)
    except DatabaseError as exc:  # a lost connection: the next report opens a new one
        connection.close()
        return (
            "answer",
            503,
            {"detail": f"the database did not answer ({exc.__class__.__name__}); send it again"},
        )


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


def _failed_credential(scope, code: int, answer: dict) -> tuple[int, dict]:
    """The lockout of cluster.api.throttling for the report path, which skips Django's views."""

    client = scope.get("client") or ("unknown", 0)
    who = client[0]
    wait = blocked_for("token", who) or record_failure("token", who)
    if wait:
        return 429, {
            "detail": f"too many failed credentials from {who}; try again in {wait} s",
            "retry_after": wait,
        }
    return code, answer
