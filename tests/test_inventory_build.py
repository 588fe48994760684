"""Building clusters: structure, database constraints, replace semantics, and the 100k preset."""

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.db.models import Count

from cluster.builder import build_cluster, known_chip_names
from cluster.models import GPU, ChipType, Datacenter, DatacenterLink, NicPort, Node, Pod, Rack, Region
from cluster.snapshot import load_topology
from engine.presets import preset_document
from engine.states import NODE_STATE_CODE
from engine.topology_spec import parse_topology
from tests.conftest import SMALL_TOPOLOGY


def test_small_cluster_has_every_level(small_cluster):
    assert (small_cluster.regions, small_cluster.datacenters, small_cluster.pods) == (1, 2, 3)
    assert (small_cluster.racks, small_cluster.nodes, small_cluster.gpus) == (5, 11, 76)
    assert DatacenterLink.objects.count() == 1
    node = Node.objects.get(hostname="dc1-p01-r01-n01")
    assert node.chip_type.name == "H100-SXM"
    assert list(node.gpus.values_list("index", flat=True)) == list(range(8))
    assert Pod.objects.get(name="a100").racks.get().nodes.first().gpus.count() == 4


def test_gpu_identities_are_unique_and_stable(small_cluster):
    before = list(GPU.objects.order_by("node__hostname", "index").values_list("uuid", "serial"))
    assert len({u for u, _ in before}) == len(before) and len({s for _, s in before}) == len(before)
    assert all(u.startswith("GPU-") for u, _ in before)
    build_cluster(parse_topology(SMALL_TOPOLOGY, known_chip_names()), replace=True)
    after = list(GPU.objects.order_by("node__hostname", "index").values_list("uuid", "serial"))
    assert before == after


def test_the_database_refuses_a_second_gpu_with_the_same_index(small_cluster):
    gpu = GPU.objects.select_related("node").first()
    with pytest.raises(IntegrityError), transaction.atomic():
        GPU.objects.create(node=gpu.node, index=gpu.index, uuid="GPU-dup", serial="dup")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Rack.objects.create(pod=Pod.objects.first(), name=Pod.objects.first().racks.first().name),
        lambda: Pod.objects.create(datacenter=Datacenter.objects.first(), name="p01"),
        lambda: Datacenter.objects.create(region=Region.objects.first(), name="dc1"),
        lambda: Node.objects.create(
            rack=Rack.objects.first(), hostname="dc1-p01-r01-n01", chip_type=ChipType.objects.first()
        ),
        lambda: Node.objects.create(
            rack=Rack.objects.first(), hostname="x", chip_type=ChipType.objects.first(), state="exploded"
        ),
        lambda: Node.objects.create(
            rack=Rack.objects.first(), hostname="y", chip_type=ChipType.objects.first(), gpus_per_node=0
        ),
        lambda: DatacenterLink.objects.create(
            a=Datacenter.objects.order_by("-id").first(),
            b=Datacenter.objects.order_by("id").first(),
            latency_ms=1,
            lanes=1,
        ),
        lambda: GPU.objects.filter(pk=GPU.objects.first().pk).update(health="fine"),
    ],
    ids=[
        "rack-name",
        "pod-name",
        "datacenter-name",
        "hostname",
        "node-state",
        "gpus-per-node",
        "link-order",
        "gpu-health",
    ],
)
def test_the_database_refuses_what_must_never_happen(small_cluster, make):
    with pytest.raises(IntegrityError), transaction.atomic():
        make()


def test_same_names_are_fine_under_different_parents(small_cluster):
    other = Region.objects.create(name="east")
    Datacenter.objects.create(region=other, name="dc1")  # dc1 exists in region north
    assert Datacenter.objects.filter(name="dc1").count() == 2


def test_building_over_an_existing_cluster_needs_replace(small_cluster):
    with pytest.raises(CommandError, match="already holds a cluster"):
        call_command("build_cluster", "demo")
    call_command("build_cluster", "demo", "--if-empty")
    assert GPU.objects.count() == 76
    call_command("build_cluster", "demo", "--replace")
    assert GPU.objects.count() == 3072


def test_snapshot_matches_the_database(small_cluster):
    Node.objects.filter(hostname="dc1-p01-r01-n02").update(state="cordoned")
    GPU.objects.filter(node__hostname="dc1-p02-r01-n01", index=3).update(health="critical")
    snap = load_topology()
    assert snap.num_gpus == 76 and snap.num_nodes == 11
    assert list(snap.count_by("datacenter")) == [64, 12]
    assert snap.count_by("pod").tolist() == [32, 32, 12]
    node = snap.node_hostname.index("dc1-p01-r01-n02")
    assert snap.node_state[node] == NODE_STATE_CODE["cordoned"]
    usable = snap.usable()
    assert int(usable.sum()) == 76 - 8 - 1
    # spare nodes (one per H100 pod) are kept for recovery: new work is never placed on them
    schedulable = snap.schedulable()
    assert int(schedulable.sum()) == 76 - 8 - 1 - 2 * 8
    assert not schedulable[snap.node_spare[snap.gpu_node]].any()
    assert snap.count_by_chip(schedulable) == {
        **dict.fromkeys(snap.chip_names, 0),
        "H100-SXM": 55 - 16,
        "A100-80G": 12,
    }
    # every GPU's domain chain agrees with the database
    db_dc = dict(GPU.objects.values_list("id", "node__rack__pod__datacenter_id"))
    dc_of_gpu = snap.datacenter_id[snap.gpu_domain("datacenter")]
    assert all(db_dc[int(g)] == int(d) for g, d in zip(snap.gpu_id, dc_of_gpu, strict=True))


@pytest.mark.slow
def test_the_100k_preset_builds_a_100k_gpu_cluster(db):
    result = build_cluster(parse_topology(preset_document("100k"), known_chip_names()))
    assert (result.gpus, result.nodes, result.racks, result.pods, result.datacenters, result.regions) == (
        100_000,
        12_500,
        2_500,
        100,
        3,
        1,
    )
    assert GPU.objects.count() == 100_000
    per_node = set(Node.objects.annotate(n=Count("gpus")).values_list("n", flat=True).distinct())
    assert per_node == {8}
    # the fabric's inventory: one 400 Gb/s rail port per GPU, rails 0..7 on every node
    assert NicPort.objects.count() == 100_000
    assert set(NicPort.objects.values_list("rail", flat=True).distinct()) == set(range(8))
    assert set(NicPort.objects.values_list("rate_gbps", flat=True).distinct()) == {400.0}
    chips = dict(Node.objects.values_list("chip_type__name").annotate(n=Count("id")))
    assert chips == {
        "H100-SXM": 6250,  # 50 pods: 25 in bj1, 20 in bj2, 5 in bj3
        "H200": 1875,
        "A100-80G": 1250,
        "B200": 1250,
        "Ascend-910B": 625,
        "MI300X": 1250,
    }
    assert Node.objects.filter(is_spare=True).count() == 200  # two spares per pod

    snap = load_topology()
    assert snap.num_gpus == 100_000
    assert snap.count_by("datacenter").tolist() == [40_000, 40_000, 20_000]  # three campuses
    assert set(snap.count_by("pod").tolist()) == {1_000}
    assert set(snap.count_by("rack").tolist()) == {40}
    # GPUs are ordered by node, so each node's 8 GPUs are contiguous
    assert np.all(np.diff(snap.gpu_node) >= 0)
