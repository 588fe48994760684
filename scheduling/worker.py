"""The command line of a Celery worker for this project, shared by `runstack`, tests and benchmarks."""

from __future__ import annotations

import sys


def worker_command(*, beat: bool = False, loglevel: str = "info", purge: bool = False) -> list[str]:
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
    ]
    if beat:
        command.append("--beat")
    if purge:
        command.append("--purge")
    return command
