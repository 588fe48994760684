"""Live telemetry over websockets: /ws/telemetry/.

A client gets a compressed snapshot of the newest frame on connect ("S", sim.fleet) and a
compressed delta for each newer frame after it ("D": the change from the frame it names), at most
once per second. A client whose frame is not the one a delta names (a gap, a reconnect) sends the
text "resync" and gets a snapshot again. Each delta is encoded once and fanned out to the group
"telemetry": with Redis the simulated fleet (or a node agent's collector) publishes it to the
channel layer; on the embedded default one broadcaster per server process reads the live store
once a second and publishes to the in-memory layer.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from cluster.roles import is_viewer
from engine.frames import decode_frame, delta_message, snapshot_message
from monitoring.livestore import FRAME_KEY, live_store

GROUP = "telemetry"
_broadcaster: dict[str, asyncio.Task] = {}


def _latest() -> bytes | None:
    return live_store().get(FRAME_KEY)


async def _broadcast_forever() -> None:
    """Embedded default: publish each new frame of the live store to the group, once. The frame
    already there at start went to each client as its snapshot."""
    layer = get_channel_layer()
    previous = await sync_to_async(_latest)()
    while True:
        await asyncio.sleep(1.0)
        data = await sync_to_async(_latest)()
        if data and (previous is None or decode_frame(data)[0] != decode_frame(previous)[0]):
            message = delta_message(previous, data) if previous else snapshot_message(data)
            previous = data
            await layer.group_send(GROUP, {"type": "telemetry.frame", "frame": message})


def ensure_broadcaster() -> None:
    _broadcaster["clients"] = _broadcaster.get("clients", 0) + 1
    if settings.REDIS_URL:
        return  # the publisher writes to the shared channel layer itself
    task = _broadcaster.get("task")
    if task is None or task.done():
        _broadcaster["task"] = asyncio.get_running_loop().create_task(_broadcast_forever())


def release_broadcaster() -> None:
    """The last client of this process left: stop reading the store."""
    _broadcaster["clients"] = max(0, _broadcaster.get("clients", 0) - 1)
    task = _broadcaster.get("task")
    if _broadcaster["clients"] == 0 and task is not None:
        task.cancel()
        _broadcaster.pop("task", None)


class TelemetryConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await database_sync_to_async(is_viewer)(user):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        self.counted = True
        ensure_broadcaster()
        await self._send_snapshot()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)
        if getattr(self, "counted", False):
            release_broadcaster()

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "resync":
            await self._send_snapshot()

    async def _send_snapshot(self):
        data = await sync_to_async(_latest)()
        if data:
            await self.send(bytes_data=snapshot_message(data))

    async def telemetry_frame(self, event):
        await self.send(bytes_data=event["frame"])
