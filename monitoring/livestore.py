"""The live store: the latest telemetry frame of every GPU, one compact blob (never a row per GPU
per sample). Redis when MYRIAD_REDIS_URL is set, else a file under MYRIAD_DATA_DIR written
atomically (rename), so any process of the embedded stack can read the newest frame."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from django.conf import settings

FRAME_KEY = "myriad:telemetry:frame"
STATE_KEY = "myriad:fleet:state"
NETWORK_KEY = "myriad:network:util"
AGENT_REPORTS_KEY = "myriad:agent:reports"  # node id -> that node's newest report (JSON)


class FileStore:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, data: bytes) -> None:
        path = self.folder / key.replace(":", "_")
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def get(self, key: str) -> bytes | None:
        path = self.folder / key.replace(":", "_")
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        path = self.folder / key.replace(":", "_")
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    # a hash is a folder of one file per field
    def hset(self, key: str, field: str, data: bytes) -> None:
        folder = self.folder / key.replace(":", "_")
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{field}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / field)

    def hget(self, key: str, field: str) -> bytes | None:
        try:
            return (self.folder / key.replace(":", "_") / field).read_bytes()
        except FileNotFoundError:
            return None

    def hgetall(self, key: str) -> dict[str, bytes]:
        folder = self.folder / key.replace(":", "_")
        out = {}
        if folder.is_dir():
            for path in folder.iterdir():
                if not path.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):  # removed since the listing
                        out[path.name] = path.read_bytes()
        return out


class RedisStore:
    def __init__(self, url: str):
        import redis

        self.client = redis.Redis.from_url(url)

    def put(self, key: str, data: bytes) -> None:
        self.client.set(key, data)

    def get(self, key: str) -> bytes | None:
        return self.client.get(key)

    def delete(self, key: str) -> None:
        self.client.delete(key)

    def hset(self, key: str, field: str, data: bytes) -> None:
        self.client.hset(key, field, data)

    def hget(self, key: str, field: str) -> bytes | None:
        return self.client.hget(key, field)

    def hgetall(self, key: str) -> dict[str, bytes]:
        return {k.decode(): v for k, v in self.client.hgetall(key).items()}


_store = None


def live_store():
    global _store
    if _store is None:
        url = getattr(settings, "REDIS_URL", None)
        _store = RedisStore(url) if url else FileStore(Path(settings.DATA_DIR) / "live")
    return _store


def reset_store() -> None:
    global _store
    _store = None
