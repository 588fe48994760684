"""The inventory's revision: the database raises it with every change to the topology's structure
(and with nothing else), so the cached snapshot a cycle plans on follows the inventory without
counting every GPU each cycle."""

import pytest
from django.db import connection

from cluster.models import GPU, Datacenter, InventoryRevision, Node, Rack
from cluster.snapshot import topology_cache


def _revision() -> int:
    return InventoryRevision.objects.get(pk=1).revision


def _rack_of(snap, node: Node) -> int:
    """The database id of the rack the snapshot places ``node`` in."""
    index = list(snap.node_id).index(node.pk)
    return int(snap.rack_id[snap.node_rack[index]])


def test_states_leave_the_revision_and_structure_changes_raise_it(small_cluster):
    before = _revision()
    node = Node.objects.filter(is_spare=False).first()
    Node.objects.filter(pk=node.pk).update(state="cordoned")
    GPU.objects.filter(node=node).update(health="warning", state="down")
    assert _revision() == before  # states are read every cycle anyway

    other = Rack.objects.exclude(pk=node.rack_id).filter(pod=node.rack.pod).first()
    Node.objects.filter(pk=node.pk).update(rack=other)
    moved = _revision()
    assert moved > before
    Datacenter.objects.filter(name="dc2").update(name="dc2-east")
    renamed = _revision()
    assert renamed > moved
    GPU.objects.filter(node=node, index=7).delete()
    assert _revision() > renamed


def test_a_node_moved_to_another_rack_is_planned_in_its_new_rack(small_cluster):
    """Counting rows did not see a node move (the same rows, the same newest ids); the revision
    does, and the next snapshot places the node in its new rack."""
    node = Node.objects.filter(is_spare=False).first()
    assert _rack_of(topology_cache.current(), node) == node.rack_id
    other = Rack.objects.exclude(pk=node.rack_id).filter(pod=node.rack.pod).first()
    Node.objects.filter(pk=node.pk).update(rack=other)
    assert _rack_of(topology_cache.current(), node) == other.pk


@pytest.mark.django_db(transaction=True)
def test_an_emptied_revision_table_is_written_again_by_the_next_change(small_cluster):
    """A test's flush empties every table, the revision's too: the next change writes it again."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {InventoryRevision._meta.db_table}")
    key = topology_cache._structure_key()
    assert key[0] is None
    node = Node.objects.filter(is_spare=False).first()
    Node.objects.filter(pk=node.pk).update(hostname=node.hostname + "-renamed")
    assert _revision() >= 1
    assert topology_cache._structure_key() != key
    assert node.hostname + "-renamed" in topology_cache.current().node_hostname
