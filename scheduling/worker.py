"""The command lines of the stack's processes, shared by `runstack`, tests and benchmarks: a Celery
worker for this project, and the production web server (the systemd unit and compose file in
deploy/ spell out the same flags): uvicorn with uvloop and httptools, ``workers`` processes on one
socket that uvicorn binds itself (on a socket handed to it, uvloop leaves Nagle's algorithm on and
every answer waits for a delayed ACK). `runstack` runs the same server in its own process."""

from __future__ import annotations

import sys


def worker_command(
    *, beat: bool = False, loglevel: str = "info", purge: bool = False, queues: tuple[str, ...] | None = None
) -> list[str]:
    """One worker for ``queues`` (default: every role's queue, as one machine runs it)."""
    from django.conf import settings

    # solo pool: cycles run one at a time anyway (the scheduling lock), and it starts fastest
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--pool=solo",
        f"--loglevel={loglevel}",
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
        "--queues=" + ",".join(queues or settings.CELERY_QUEUE_NAMES),
    ]
    if beat:
        command.append("--beat")
    if purge:
        command.append("--purge")
    return command


APPLICATION = "config.asgi:application"
# how every web process runs, the one-machine stack's included (runstack passes them to uvicorn.run)
SERVER = {"loop": "uvloop", "http": "httptools", "lifespan": "off", "access_log": False}


def web_command(port: int, workers: int = 2, host: str = "127.0.0.1") -> list[str]:
    return [
        *(sys.executable, "-m", "uvicorn", APPLICATION, "--host", host, "--port", str(port)),
        *("--workers", str(workers), "--loop", SERVER["loop"], "--http", SERVER["http"]),
        *("--lifespan", SERVER["lifespan"], "--no-access-log"),  # access_log: False
    ]
