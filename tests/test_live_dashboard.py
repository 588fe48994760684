"""The live telemetry websocket and page: only viewers connect; a full frame on connect; each new
frame fanned out once to the group; "resync" brings a full frame back."""

import numpy as np
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from engine.frames import (
    FRAME_METRICS,
    apply_message,
    decode_frame,
    delta_message,
    encode_frame,
    snapshot_message,
)
from monitoring.telemetry.consumers import GROUP, TelemetryConsumer
from monitoring.telemetry.livestore import FRAME_KEY, live_store, reset_store


@pytest.fixture
def frame_in_store(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    reset_store()
    frame = {
        m: np.full(16, i, dtype=np.uint8)
        for i, m in enumerate(("util", "memory", "temperature", "power", "health"))
    }
    data = encode_frame(7, 123.0, frame)
    live_store().put(FRAME_KEY, data)
    yield data
    live_store().delete(FRAME_KEY)
    reset_store()


async def _connect(user):
    communicator = WebsocketCommunicator(TelemetryConsumer.as_asgi(), "/ws/telemetry/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


@pytest.mark.django_db(transaction=True)
def test_anonymous_users_and_users_without_a_role_are_refused(frame_in_store, outsider):
    async def run():
        for user in (AnonymousUser(), outsider):
            communicator, connected, code = await _connect(user)
            assert not connected and code == 4403
            await communicator.disconnect()

    async_to_sync(run)()


@pytest.mark.django_db(transaction=True)
def test_a_viewer_gets_a_snapshot_then_group_frames_and_can_resync(frame_in_store, viewer):
    async def run():
        communicator, connected, _ = await _connect(viewer)
        assert connected
        snapshot = await communicator.receive_from()
        assert snapshot[:1] == b"S"
        full = apply_message(None, snapshot)
        seq, t, values = decode_frame(full)
        assert seq == 7 and t == 123.0 and len(values["util"]) == 16 and values["temperature"][0] == 2
        newer = encode_frame(8, 128.0, {k: v + 1 for k, v in values.items()})
        delta = delta_message(full, newer)
        await get_channel_layer().group_send(GROUP, {"type": "telemetry.frame", "frame": delta})
        pushed = await communicator.receive_from()
        assert pushed[:1] == b"D"
        seq, _, values = decode_frame(apply_message(full, pushed))
        assert seq == 8 and values["temperature"][0] == 3
        await communicator.send_to(text_data="resync")
        again = await communicator.receive_from()
        assert again[:1] == b"S" and decode_frame(apply_message(None, again))[0] == 7  # the store's newest
        await communicator.disconnect()

    async_to_sync(run)()


def test_the_live_page_needs_a_role_and_loads_plotly_locally(small_cluster, viewer, outsider):
    assert Client().get("/live/").status_code == 302
    client = Client()
    client.force_login(outsider)
    assert client.get("/live/").status_code == 403
    client.force_login(viewer)
    page = client.get("/live/").content.decode()
    assert "/ws/telemetry/" in page and 'src="/static/vendor/plotly/plotly-cartesian.min.js"' in page


def test_the_layout_endpoint_places_every_gpu(small_cluster, viewer_client):
    layout = viewer_client.get("/api/v1/telemetry/layout/").json()
    assert layout["gpus"] == 76 and sum(layout["rack_gpu_count"]) == 76
    assert len(layout["racks"]) == len(layout["rack_gpu_start"])
    assert layout["node_gpu_start"][0] == 0 and len(layout["hostnames"]) == len(layout["node_gpu_start"])


def test_deltas_rebuild_the_frame_and_refuse_the_wrong_base():
    rng = np.random.default_rng(0)
    frames = [
        encode_frame(i, float(i), {m: rng.integers(0, 100, 1000).astype(np.uint8) for m in FRAME_METRICS})
        for i in (1, 2, 3)
    ]
    current = apply_message(None, snapshot_message(frames[0]))
    assert current == frames[0]
    current = apply_message(current, delta_message(frames[0], frames[1]))
    assert current == frames[1]
    with pytest.raises(ValueError, match="resync"):
        apply_message(frames[0], delta_message(frames[1], frames[2]))


def test_a_100k_gpu_frame_travels_under_150_kb():
    from engine.chips import BY_NAME
    from engine.presets import preset_document
    from engine.synthetic import snapshot_from_spec
    from engine.topology_spec import parse_topology
    from sim.fleet import Fleet

    topo = snapshot_from_spec(parse_topology(preset_document("100k"), set(BY_NAME)))
    fleet = Fleet(topo, seed=1)
    util = np.where(np.random.default_rng(2).random(topo.num_gpus) < 0.7, 0.92, 0.0).astype(np.float32)
    fleet.step(0.0, util)
    first = encode_frame(1, 0.0, fleet.frame())
    fleet.step(5.0, util)
    second = encode_frame(2, 5.0, fleet.frame())
    assert len(first) == 21 + 5 * 100_000
    assert len(snapshot_message(first)) < 150_000 and len(delta_message(first, second)) < 150_000


@pytest.mark.redis
def test_three_hundred_dashboards_joining_at_once_all_get_the_frame():
    """On the Redis pub/sub layer, 300 channels joining the group at once (a wall of dashboards after
    a server restart) each receive the one broadcast."""
    import asyncio

    from channels.layers import channel_layers

    async def burst():
        layer = channel_layers.make_backend("default")
        names = await asyncio.gather(*(layer.new_channel() for _ in range(300)))
        await asyncio.gather(*(layer.group_add("dashboard-burst", n) for n in names))
        await layer.group_send("dashboard-burst", {"type": "telemetry.frame", "frame": b"x"})
        got = await asyncio.gather(*(asyncio.wait_for(layer.receive(n), 10) for n in names))
        await asyncio.gather(*(layer.group_discard("dashboard-burst", n) for n in names))
        await layer.flush()
        return got

    received = asyncio.run(burst())
    assert len(received) == 300 and all(m["frame"] == b"x" for m in received)
