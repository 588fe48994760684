"""The real services: channel layer (Redis when configured) and concurrent node actions (PostgreSQL)."""

import threading

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from cluster.builder import build_cluster, known_chip_names
from cluster.models import Node
from cluster.services import apply_node_action
from engine.states import InvalidTransition
from engine.topology_spec import parse_topology
from tests.conftest import SMALL_TOPOLOGY


def test_the_configured_channel_layer_delivers_group_messages():
    layer = get_channel_layer()
    expected = "RedisPubSubChannelLayer" if settings.REDIS_URL else "InMemoryChannelLayer"
    assert type(layer).__name__ == expected

    async def round_trip():
        channel = await layer.new_channel()
        await layer.group_add("inventory-test", channel)
        await layer.group_send("inventory-test", {"type": "frame", "seq": 7})
        message = await layer.receive(channel)
        await layer.group_discard("inventory-test", channel)
        return message

    assert async_to_sync(round_trip)() == {"type": "frame", "seq": 7}


@pytest.mark.redis
def test_celery_uses_redis_when_configured():
    from config.celery import app

    assert app.conf.broker_url == settings.REDIS_URL
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_operators_cordoning_one_node_at_once_only_one_wins():
    build_cluster(parse_topology(SMALL_TOPOLOGY, known_chip_names()))
    node = Node.objects.get(hostname="dc1-p01-r01-n01")
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def act(name: str) -> None:
        try:
            barrier.wait()
            apply_node_action([node], "cordon", actor=name)
            outcomes.append("ok")
        except InvalidTransition:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(f"op{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused"]
    node.refresh_from_db()
    assert node.state == "cordoned"
