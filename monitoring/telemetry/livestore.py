"""The live store: the latest telemetry frame of every GPU, one compact blob (never a row per GPU
per sample). Redis when MYRIAD_REDIS_URL is set, else a file under MYRIAD_DATA_DIR written
atomically (rename), so any process of the embedded stack can read the newest frame."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from django.conf import settings

from cluster.outages import LiveStoreDown
from engine.frames import delta_message, snapshot_message

FRAME_KEY = "myriad:telemetry:frame"
STATE_KEY = "myriad:fleet:state"
NETWORK_KEY = "myriad:network:util"
AGENT_REPORT_PREFIX = "myriad:agent:report:"  # + node id: that node's newest report (JSON)
CYCLE_COUNTS_KEY = "myriad:metrics:cycles"  # scheduling cycles' duration histogram, all processes


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

    def swap(self, key: str, data: bytes) -> bytes | None:
        """Write ``data``, returning what was there (one writer per key: a node's reports)."""
        path = os.path.join(self.folder, key.replace(":", "_"))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            old = None
        else:
            try:
                old = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return old

    def swap_many(self, keys: list[str], values: list[bytes]) -> list[bytes | None]:
        return [self.swap(k, v) for k, v in zip(keys, values, strict=True)]

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def delete_prefix(self, prefix: str) -> None:
        start = prefix.replace(":", "_")
        for path in self.folder.glob(start + "*"):
            path.unlink(missing_ok=True)

    def add_counts(self, key: str, amounts: dict[str, float]) -> None:
        """Add to named counters kept under ``key``, atomically across the processes of one
        machine (a lock file), as Redis' HINCRBYFLOAT does across machines."""
        import fcntl
        import json

        path = self.folder / key.replace(":", "_")
        with open(f"{path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counts = self.counts(key)
            for name, amount in amounts.items():
                counts[name] = counts.get(name, 0.0) + amount
            self.put(key, json.dumps(counts).encode())

    def counts(self, key: str) -> dict[str, float]:
        import json

        data = self.get(key)
        return json.loads(data) if data else {}


class RedisStore:
    def __init__(self, url: str):
        import redis

        self.client = redis.Redis.from_url(url)
        self.down = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    def put(self, key: str, data: bytes) -> None:
        self.client.set(key, data)

    def get(self, key: str) -> bytes | None:
        try:
            return self.client.get(key)
        except self.down as exc:
            raise LiveStoreDown(str(exc)) from exc

    def delete(self, key: str) -> None:
        self.client.delete(key)

    def swap(self, key: str, data: bytes) -> bytes | None:
        return self.client.set(key, data, get=True)  # one round trip: write and read back the old

    def swap_many(self, keys: list[str], values: list[bytes]) -> list[bytes | None]:
        """Write each key, returning the old values: one round trip (a pipeline)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key, value in zip(keys, values, strict=True):
            pipe.set(key, value, get=True)
        return pipe.execute()

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for i in range(0, len(keys), 5000):
            out += self.client.mget(keys[i : i + 5000])
        return out

    def delete_prefix(self, prefix: str) -> None:
        for key in self.client.scan_iter(match=prefix + "*", count=1000):
            self.client.delete(key)

    def add_counts(self, key: str, amounts: dict[str, float]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for name, amount in amounts.items():
            pipe.hincrbyfloat(key, name, amount)
        pipe.execute()

    def counts(self, key: str) -> dict[str, float]:
        try:
            return {k.decode(): float(v) for k, v in self.client.hgetall(key).items()}
        except self.down as exc:
            raise LiveStoreDown(str(exc)) from exc


_store = None


def live_store():
    global _store
    if _store is None:
        url = getattr(settings, "REDIS_URL", None)
        _store = RedisStore(url) if url else FileStore(Path(settings.DATA_DIR) / "live")
    return _store


def newest_frame() -> bytes | None:
    """The newest telemetry frame, or None when there is none or the live store does not answer
    (pages then show no live data; the API says why with a 503)."""
    try:
        return live_store().get(FRAME_KEY)
    except LiveStoreDown:
        return None


def reset_store() -> None:
    global _store
    _store = None


def publish_frame(previous: bytes | None, encoded: bytes) -> None:
    """With Redis, hand the change to every dashboard once through the channel layer (on the
    embedded default each server process's broadcaster picks it up from the live store)."""
    if not settings.REDIS_URL:
        return
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        message = delta_message(previous, encoded) if previous else snapshot_message(encoded)
        async_to_sync(layer.group_send)("telemetry", {"type": "telemetry.frame", "frame": message})
