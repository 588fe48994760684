"""HTTP to the control plane (the standard library's urllib: nothing to install), with a bounded
buffer of reports for outages and retries with exponential backoff and jitter."""

from __future__ import annotations

import collections
import json
import random
import threading
import urllib.error
import urllib.request


class Unreachable(Exception):
    """The control plane did not answer (connection refused, timeout, 5xx)."""


class Refused(Exception):
    """The control plane answered no: a 4xx, with its message."""

    def __init__(self, status: int, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class Client:
    def __init__(self, server: str, credential: str = "", timeout_s: float = 10.0):
        self.server, self.credential, self.timeout_s = server, credential, timeout_s

    def request(self, method: str, path: str, body=None, timeout_s: float | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.credential:
            req.add_header("Authorization", f"Node {self.credential}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer = json.loads(raw or b"null")
            except ValueError:
                answer = raw[:500].decode(errors="replace")
            if exc.code >= 500:
                raise Unreachable(f"HTTP {exc.code}") from exc
            raise Refused(exc.code, answer) from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise Unreachable(str(getattr(exc, "reason", exc))) from exc
        return json.loads(raw or b"null")


class Backoff:
    """Waits that double from ``base`` up to ``cap``, each drawn from [0.5, 1.5) of its value so
    that a thousand agents coming back after an outage do not call at the same moment."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None):
        self.base, self.cap, self.failures = base, cap, 0
        self.rng = rng or random.Random()

    def next(self) -> float:
        wait = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        return wait * (0.5 + self.rng.random())

    def reset(self) -> None:
        self.failures = 0


class ReportBuffer:
    """Reports not yet accepted, oldest first; past ``limit`` the oldest are dropped and counted."""

    def __init__(self, limit: int):
        self.items: collections.deque = collections.deque()
        self.limit, self.dropped = limit, 0
        self.lock = threading.Lock()

    def add(self, report: dict) -> None:
        with self.lock:
            self.items.append(report)
            while len(self.items) > self.limit:
                self.items.popleft()
                self.dropped += 1

    def peek(self) -> dict | None:
        with self.lock:
            return self.items[0] if self.items else None

    def pop(self) -> None:
        with self.lock:
            if self.items:
                self.items.popleft()

    def __len__(self) -> int:
        return len(self.items)
