"""A minimal HTTP/1.1 client for the load generators: keep-alive connections on loopback, no
library between the benchmark's clock and the socket (the generator shares the machine's cores
with the server, so its own cost per request must stay small)."""

from __future__ import annotations

import asyncio
import time

import numpy as np


class Connection:
    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def post(self, path: str, authorization: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of one JSON POST on this keep-alive connection."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:  # the server closed the connection without an answer
            self.writer.close()
            self.writer = None
            raise ConnectionError("closed without an answer")
        length, closing, chunked = 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            name, value = name.lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value == "close":
                closing = True
            elif name == "transfer-encoding" and value == "chunked":
                chunked = True
        answer = b""
        if chunked:
            while (size := int((await self.reader.readline()).strip() or b"0", 16)) > 0:
                answer += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readline()
        else:
            answer = await self.reader.readexactly(length)
        if closing:
            self.writer.close()
            self.writer = None
        parts = status_line.split()
        if len(parts) < 2:
            raise RuntimeError(f"unexpected answer line {status_line!r}")
        return int(parts[1]), answer


def connections(port: int, n: int) -> asyncio.Queue:
    """``n`` keep-alive connections to share: take one, send, put it back."""
    pool: asyncio.Queue = asyncio.Queue()
    for _ in range(n):
        pool.put_nowait(Connection(port))
    return pool


async def drive(one, rate: float | None, seconds: float, concurrency: int) -> float:
    """Call ``one(due)`` at ``rate`` per second for ``seconds`` (each call's due time is when it
    should have started, so a server that falls behind shows it: no coordinated omission), or with
    ``rate`` None from ``concurrency`` loops as fast as answers come. Returns the seconds taken."""
    start = time.perf_counter()
    if rate:
        tasks = []
        for i in range(int(rate * seconds)):
            due = start + i / rate
            if (delay := due - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due)))
        await asyncio.gather(*tasks)
    else:

        async def loop() -> None:
            while time.perf_counter() - start < seconds:
                await one(time.perf_counter())

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return time.perf_counter() - start


def latency_figures(seconds: list[float]) -> dict:
    """p50, p99 and max of latencies given in seconds, in milliseconds."""
    ms = np.array(seconds) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
    }
