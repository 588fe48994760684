"""Live telemetry over websockets: /ws/telemetry/ (every GPU) and /ws/levels/ (one level of the
fleet view, monitoring.telemetry.levels).

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
from monitoring.telemetry.levels import LevelQueryError, parse, view_json
from monitoring.telemetry.livestore import FRAME_KEY, live_store

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


class _FrameConsumer(AsyncWebsocketConsumer):
    """A viewer's websocket woken by every new frame (the group ``telemetry``); anyone else is
    closed with 4403."""

    async def connect(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await database_sync_to_async(is_viewer)(user):
            await self.close(code=4403)
            return False
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        self.counted = True
        ensure_broadcaster()
        return True

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)
        if getattr(self, "counted", False):
            release_broadcaster()


class TelemetryConsumer(_FrameConsumer):
    async def connect(self):
        if await super().connect():
            await self._send_snapshot()

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "resync":
            await self._send_snapshot()

    async def _send_snapshot(self):
        data = await sync_to_async(_latest)()
        if data:
            await self.send(bytes_data=snapshot_message(data))

    async def telemetry_frame(self, event):
        await self.send(bytes_data=event["frame"])


class LevelsConsumer(_FrameConsumer):
    """The fleet view of one level: the client sends the view it shows as JSON (``level``,
    ``within``, ``metric``, ``aggregate``, ``threshold``, ``job``, as the levels API takes them) and
    gets that view as JSON at once and again for every newer frame; each view is made once per
    frame per server process (monitoring.telemetry.levels.view_json), whatever the number of clients. A bad
    view gets ``{"error": {field: [message]}}``."""

    query = None

    async def receive(self, text_data=None, bytes_data=None):
        import json

        try:
            asked = json.loads(text_data or "")
            if not isinstance(asked, dict):
                raise ValueError
            self.query = parse({str(k): str(v) for k, v in asked.items() if v is not None})
        except ValueError as exc:
            self.query = None
            field, message = (
                (exc.field, exc.message)
                if isinstance(exc, LevelQueryError)
                else ("view", "must be a JSON object")
            )
            await self.send(text_data=json.dumps({"error": {field: [message]}}))
            return
        await self._send_view(None)

    async def telemetry_frame(self, event):
        if self.query is not None:
            await self._send_view(int.from_bytes(event["frame"][6:10], "little"))  # the new frame's number

    async def _send_view(self, seq):
        import json

        query = self.query
        try:
            text = await database_sync_to_async(view_json)(seq, query)
        except LevelQueryError as exc:
            text = json.dumps({"error": {exc.field: [exc.message]}})
        if text is not None and query is self.query:
            await self.send(text_data=text)
