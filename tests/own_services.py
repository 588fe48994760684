"""A PostgreSQL server and a Redis server of a test's own: their own ports and data folders, started
and stopped by process id, so a test may stop or restart them without touching the machine's
shared services. PostgreSQL's binaries are Debian's (the postgresql package the machine runs);
as root, the server runs as the ``postgres`` user, as Debian's does."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.browser_stack import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise FileNotFoundError(f"no PostgreSQL {name} under /usr/lib/postgresql")
    return found[-1]


def available() -> bool:
    try:
        _pg_bin("initdb")
    except FileNotFoundError:
        return False
    return shutil.which("redis-server") is not None


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class OwnPostgres:
    def __init__(self):
        # a folder of its own under /tmp: the server's user must reach it (a test's tmp_path is
        # private to root)
        self.folder = Path(tempfile.mkdtemp(prefix="myriad-pg-"))
        self.data = self.folder / "pgdata"
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        log = open(self.folder / "postgres.log", "ab")  # noqa: SIM115 - the server's log, kept
        self.process = subprocess.Popen(
            _as_postgres(
                [
                    _pg_bin("postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.folder),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ]
            ),  # fmt: skip
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait(lambda: self._answers())

    def _answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _wait(self, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the server exited; see {self.folder}")
            time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {timeout} s; see {self.folder}")

    def stop(self) -> None:
        """Fast shutdown (SIGINT): open transactions are rolled back, clients disconnected."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None

    def remove(self) -> None:
        """Stop the server and delete its data folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class OwnRedis:
    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - the server's log, kept
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None
