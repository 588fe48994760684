"""A minimal HTTP/1.1 client for the load generators: keep-alive connections on loopback, no
library between the benchmark's clock and the socket (the generator shares the machine's cores
with the server, so its own cost per request must stay small)."""

from __future__ import annotations

import asyncio


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
