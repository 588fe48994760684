"""The command line of a Celery worker for this project, shared by `runstack`, tests and benchmarks."""

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
