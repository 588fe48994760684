"""The live store: the latest telemetry frame of every GPU, one compact blob (never a row per GPU
per sample). Redis when MYRIAD_REDIS_URL is set, else a file under MYRIAD_DATA_DIR written
atomically (rename), so any process of the embedded stack can read the newest frame."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

FRAME_KEY = "myriad:telemetry:frame"
STATE_KEY = "myriad:fleet:state"
NETWORK_KEY = "myriad:network:util"


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
        (self.folder / key.replace(":", "_")).unlink(missing_ok=True)


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
