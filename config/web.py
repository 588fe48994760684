"""The command line of the production web server, shared by tests and benchmarks (the systemd
unit and compose file in deploy/ spell out the same flags): uvicorn with uvloop and httptools,
``workers`` processes on one socket that uvicorn binds itself (on a socket handed to it, uvloop
leaves Nagle's algorithm on and every answer waits for a delayed ACK)."""

from __future__ import annotations

import sys


def web_command(port: int, workers: int = 2, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "config.asgi:application",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--lifespan",
        "off",
        "--no-access-log",
    ]
