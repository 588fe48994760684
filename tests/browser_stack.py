"""A whole Myriad stack for browser tests and the first-paint benchmark: its own database (a SQLite
file, or a fresh PostgreSQL database next to the configured one), Redis database when Redis is
configured, a built cluster, logins, and `manage.py runstack` (ASGI server, Celery worker and beat,
simulated fleet) on a free port. Chromium is Debian's, driven by Playwright; nothing is downloaded."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORDS = {"operator": "operator-pw-1", "viewer": "viewer-pw-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _postgres_copy(url: str, suffix: str) -> str:
    """A fresh database beside the configured one (dropped and created again)."""
    import psycopg

    base, name = url.rsplit("/", 1)
    name = f"{name.split('?')[0]}_{suffix}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


def _redis_other_db(url: str) -> str:
    """A Redis database of the stack's own, emptied: eight below the configured one (the test
    processes of a parallel run take the databases below the configured one, so each process's
    stacks get a database no other process uses)."""
    m = re.match(r"^(redis://[^/]+)(?:/(\d+))?$", url)
    if not m:
        return url
    db = int(m.group(2) or 0)
    other = (db + 8) % 16
    import redis

    redis.Redis.from_url(f"{m.group(1)}/{other}").flushdb()
    return f"{m.group(1)}/{other}"


def stop_group(process: subprocess.Popen, wait_s: float = 20) -> None:
    """SIGTERM to a process started in its own session, SIGKILL if it is still there after ``wait_s``."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


@dataclass
class Stack:
    url: str
    env: dict
    process: subprocess.Popen
    tokens: dict = field(default_factory=dict)
    port: int = 0
    log: Path | None = None

    def stop(self) -> None:
        stop_group(self.process)

    def start(self) -> None:
        """Start the server processes again on the same port and database (after ``stop``)."""
        self.process = _serve(self.env, self.port, self.log)
        _wait_up(self)


def manage(env: dict, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def _serve(env: dict, port: int, log: Path) -> subprocess.Popen:
    logfile = open(log, "ab")  # noqa: SIM115 - the stack's output, kept for failures
    return subprocess.Popen(
        [sys.executable, "manage.py", "runstack", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=logfile,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_up(stack: Stack) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if stack.process.poll() is not None:
            raise RuntimeError(f"runstack exited with {stack.process.returncode}; see {stack.log}")
        try:
            urllib.request.urlopen(f"{stack.url}/accounts/login/", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    stack.stop()
    raise RuntimeError("the stack did not answer within 90 s")


def start_stack(
    data_dir: Path,
    cluster: str = "demo",
    *,
    fleet_tick_s: int = 1,
    simulated_fleet: bool = True,
    log: Path | None = None,
    extra_env: dict | None = None,
    name: str = "browser",
) -> Stack:
    """``name`` keeps each kind of stack's PostgreSQL database apart."""
    env = {**os.environ, "MYRIAD_DATA_DIR": str(data_dir), "MYRIAD_DEBUG": "1"}
    env.update(
        MYRIAD_SIMULATED_FLEET="1" if simulated_fleet else "0",
        MYRIAD_FLEET_TICK_S=str(fleet_tick_s),
        MYRIAD_SAMPLE_INTERVAL_S="5",
        MYRIAD_CYCLE_INTERVAL_S="2",
    )
    env.update(extra_env or {})
    if env.get("MYRIAD_DATABASE_URL"):
        env["MYRIAD_DATABASE_URL"] = _postgres_copy(env["MYRIAD_DATABASE_URL"], name)
    if env.get("MYRIAD_REDIS_URL"):
        env["MYRIAD_REDIS_URL"] = _redis_other_db(env["MYRIAD_REDIS_URL"])
    data_dir.mkdir(parents=True, exist_ok=True)
    manage(env, "migrate", "--noinput")
    manage(env, "build_cluster", cluster, "--if-empty")
    manage(env, "seed_queues")
    tokens = {}
    for role, password in PASSWORDS.items():
        out = manage(env, "create_login", role, "--role", role, "--password", password)
        tokens[role] = re.search(r"api_token=(\w+)", out).group(1)
    port = free_port()
    log = log or data_dir / "stack.log"
    stack = Stack(
        url=f"http://127.0.0.1:{port}",
        env=env,
        process=_serve(env, port, log),
        tokens=tokens,
        port=port,
        log=log,
    )
    _wait_up(stack)
    return stack
