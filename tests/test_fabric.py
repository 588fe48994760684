"""The fabric above the NIC ports: each rail leaf's and pod's uplink load, utilization, worst
p99 and CNP rate from the ports below it (engine.fabric), the simulated fleet's ports with
bursts (sim.fabric_traffic), and the agents' reports becoming the fabric figures the API shows."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from cluster.models import Node, Pod
from cluster.snapshot import topology_cache
from engine.chips import BY_NAME
from engine.fabric import FabricSpec, PortLoads, congested_pods, leaf_of, link_loads
from engine.frames import FRAME_METRICS, encode_frame
from engine.presets import preset_document
from engine.states import NODE_STATE_CODE
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from monitoring.models import CongestionRecord
from monitoring.telemetry import congestion, fabric
from monitoring.telemetry.livestore import FRAME_KEY, live_store
from monitoring.telemetry.metrics import control_plane_exposition
from scheduling.models import Job
from sim.fabric_traffic import CNP_PER_S_AT_2X, simulated_ports

LINE = 400e9 / 8


@pytest.fixture(autouse=True)
def no_fabric_left_behind():
    """The fabric figures live in the live store: none outlasts its test (placement reads them)."""
    yield
    store = live_store()
    for key in (fabric.FABRIC_KEY, congestion.CONGESTING_KEY):
        store.delete(key)


@pytest.fixture(scope="module")
def demo():
    return snapshot_from_spec(parse_topology(preset_document("demo"), set(BY_NAME)))


def _ports(topo, nodes, rail_util, cnp=0.0, down=()):
    """Eight ports on each of ``nodes``, port r at ``rail_util[r]`` of the line out (half back),
    its p99 window at that utilization."""
    node = np.repeat(np.asarray(nodes), 8)
    rail = np.tile(np.arange(8), len(nodes))
    util = np.asarray(rail_util, float)[rail]
    return PortLoads(
        node=node,
        rail=rail,
        rate_gbps=np.full(len(node), 400.0),
        tx_bytes_s=util * LINE,
        rx_bytes_s=util * LINE / 2,
        p99=util * 100,
        cnp_per_s=np.full(len(node), cnp),
        down=np.isin(node, list(down)),
    )


def test_rail_leaves_sum_their_ports_and_pods_are_oversubscribed(demo):
    pod0 = np.nonzero(demo.rack_pod[demo.node_rack] == 0)[0]  # the nodes of the first pod
    ports = _ports(demo, pod0, [0.5, 0.1, 0.1, 0.95, 0.1, 0.1, 0.1, 0.1])
    loads = link_loads(demo, ports)
    leaf = loads["leaf"]
    assert len(leaf["util"]) == len(demo.pod_id) * 8  # a leaf per pod and rail
    # leaf (pod 0, rail 3): every node's port 3 at 95%, non-blocking up to the spines
    assert leaf["util"][3] == pytest.approx(0.95) and leaf["p99"][3] == pytest.approx(95)
    assert leaf["ports"][3] == len(pod0) and leaf["util"][8 + 3] == 0  # pod 1 carries nothing
    assert list(np.nonzero(leaf["congested"])[0]) == [3]  # p99 above 90%
    pod = loads["pod"]
    mean = np.mean([0.5, 0.1, 0.1, 0.95, 0.1, 0.1, 0.1, 0.1])
    assert pod["util"][0] == pytest.approx(mean * 2.0)  # 2:1 oversubscribed above the pod
    assert list(np.nonzero(congested_pods(demo, loads))[0]) == [0]


def test_cnp_storms_and_ports_down_mark_their_links(demo):
    nodes = np.nonzero(demo.rack_pod[demo.node_rack] == 2)[0][:4]
    ports = _ports(demo, nodes, [0.2] * 8, cnp=2000.0, down=[int(nodes[0])])
    loads = link_loads(demo, ports, FabricSpec(congested_cnp_per_s=6000))
    leaf = loads["leaf"]
    assert leaf["cnp_per_s"][2 * 8] == pytest.approx(8000) and leaf["congested"][2 * 8]
    assert leaf["down"][2 * 8 : 3 * 8].tolist() == [1] * 8  # the first node's eight ports are down
    calm = link_loads(demo, ports, FabricSpec(congested_cnp_per_s=9000))
    assert not calm["leaf"]["congested"].any()


def test_a_rack_design_puts_every_port_of_a_rack_on_its_switch(demo):
    spec = FabricSpec(design="rack")
    nodes = np.nonzero(demo.node_rack == 5)[0]
    leaves = leaf_of(demo, np.repeat(nodes, 8), np.tile(np.arange(8), len(nodes)), spec)
    assert set(leaves.tolist()) == {5}
    loads = link_loads(demo, _ports(demo, nodes, [0.3] * 8), spec)
    assert len(loads["leaf"]["util"]) == len(demo.rack_id) and loads["leaf"]["util"][5] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="design"):
        FabricSpec(design="mesh")


def test_nothing_reported_is_an_idle_fabric_of_the_right_size(demo):
    loads = link_loads(demo, PortLoads.empty())
    assert len(loads["leaf"]["util"]) == len(demo.pod_id) * 8 and not loads["pod"]["util"].any()


def test_the_simulated_fleet_sends_bursts_not_a_flat_line(demo):
    first = np.arange(64)  # eight nodes' GPUs
    second = np.arange(64, 128)
    jobs = [(first, 0.10 * LINE), (second, 0.40 * LINE)]  # mean 10% and 40% of the line
    ports = simulated_ports(demo, jobs, np.random.default_rng(0))
    assert len(ports) == demo.num_gpus and ports.rail[:8].tolist() == list(range(8))
    quiet = ports.p99[first]
    assert np.all((quiet > 30) & (quiet < 50))  # bursts at ~4x the mean: 40%, not 10%
    assert np.all(ports.cnp_per_s[first] == 0)
    assert np.all(ports.p99[second] == 100)  # bursts want 160% of the line: congested
    assert np.median(ports.cnp_per_s[second]) == pytest.approx(CNP_PER_S_AT_2X * 0.6, rel=0.15)
    assert ports.tx_bytes_s[200:].sum() == 0  # GPUs without a spanning job send nothing


def test_ports_of_a_down_node_are_down_and_carry_nothing():
    down = snapshot_from_spec(parse_topology(preset_document("demo"), set(BY_NAME)))
    down.node_state[0] = NODE_STATE_CODE["down"]
    ports = simulated_ports(down, [(np.arange(16), 0.2 * LINE)], np.random.default_rng(1))
    assert ports.down[:8].all() and not ports.down[8:16].any()
    assert ports.tx_bytes_s[:8].sum() == 0 and ports.tx_bytes_s[8:16].min() > 0


# --- congestion records ----------------------------------------------------------------------


def _entry(snap, hot_leaves=(), p99=95.0, cnp=0.0):
    """A fabric entry as publish writes it, with ``hot_leaves`` ((pod index, rail)) congested."""
    spec = FabricSpec()
    loads = link_loads(snap, PortLoads.empty(), spec)
    leaf = {k: v.tolist() for k, v in loads["leaf"].items() if k != "congested"}
    pod = {k: v.tolist() for k, v in loads["pod"].items() if k != "congested"}
    leaf["congested"], pod["congested"] = [], []
    for pod_index, rail in hot_leaves:
        i = pod_index * 8 + rail
        leaf["p99"][i], leaf["cnp_per_s"][i], leaf["util"][i] = p99, cnp, 0.7
        leaf["congested"].append(i)
    return {
        "pod_ids": snap.pod_id.tolist(),
        "rails": 8,
        "design": "rail",
        "source": "agents",
        "leaf": leaf,
        "pod": pod,
    }


def test_a_link_congested_long_enough_opens_a_record_that_follows_its_peak_and_closes(running_job, settings):

    settings.FABRIC_CONGESTION_MIN_S = 30
    store = live_store()
    store.delete(congestion.CONGESTING_KEY)
    snap = topology_cache.current()
    node = Node.objects.get(gpus__allocations__job=running_job, gpus__allocations__active=True, gpus__index=0)
    pod_index = list(snap.pod_id).index(node.rack.pod_id)
    t0 = timezone.now()
    hot = _entry(snap, [(pod_index, 2)])
    assert congestion.follow(hot, store, t0)["opened"] == 0  # not long enough yet
    assert congestion.follow(hot, store, t0 + timedelta(seconds=20))["opened"] == 0
    assert congestion.follow(hot, store, t0 + timedelta(seconds=31))["opened"] == 1
    record = CongestionRecord.objects.get()
    assert abs((record.started_at - t0).total_seconds()) < 0.01  # from when it was first seen
    assert record.rail == 2 and record.pod_id == node.rack.pod_id and record.ended_at is None
    assert record.jobs == []  # the running job is on one node: none of its traffic crosses the leaf
    hotter = _entry(snap, [(pod_index, 2)], p99=99.0, cnp=12000.0)
    congestion.follow(hotter, store, t0 + timedelta(seconds=40))
    record.refresh_from_db()
    assert record.peak_p99 == 99.0 and record.peak_cnp_per_s == 12000.0
    assert "rail 2 leaf" in str(record)
    assert congestion.follow(_entry(snap), store, t0 + timedelta(seconds=50))["closed"] == 1
    record.refresh_from_db()
    assert (record.ended_at - t0).total_seconds() == pytest.approx(50)
    # a short blip afterwards is not a record
    congestion.follow(hot, store, t0 + timedelta(seconds=60))
    congestion.follow(_entry(snap), store, t0 + timedelta(seconds=70))
    assert CongestionRecord.objects.count() == 1


def test_congestion_records_by_api(running_job, viewer_client, settings):

    settings.FABRIC_CONGESTION_MIN_S = 0
    snap = topology_cache.current()
    store = live_store()
    store.delete(congestion.CONGESTING_KEY)
    congestion.follow(_entry(snap, [(0, 5), (1, 0)]), store)
    listed = viewer_client.get("/api/v1/congestion/?open=true").json()["results"]
    assert sorted(r["rail"] for r in listed) == [0, 5] and all(r["ended_at"] is None for r in listed)
    assert listed[0]["link"].endswith("leaf") and listed[0]["peak_p99"] == 95.0
    congestion.follow(_entry(snap), store)
    assert viewer_client.get("/api/v1/congestion/?open=true").json()["results"] == []
    assert len(viewer_client.get("/api/v1/congestion/").json()["results"]) == 2


def test_metrics_are_per_switch_link_within_their_budget(small_cluster):
    snap = topology_cache.current()
    nodes = np.nonzero(snap.rack_pod[snap.node_rack] == 0)[0][:2]
    ports = _ports(snap, nodes, [0.1, 0.95, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    fabric.publish(snap, ports, "agents", live_store())
    text = control_plane_exposition().decode()
    pod = Pod.objects.get(pk=int(snap.pod_id[0])).name
    assert f'myriad_fabric_link_p99_percent{{level="leaf",pod="{pod}",rail="1"}} 95.0' in text
    assert f'myriad_fabric_link_congested{{level="leaf",pod="{pod}",rail="1"}} 1.0' in text
    assert f'myriad_fabric_link_congested{{level="leaf",pod="{pod}",rail="0"}} 0.0' in text
    fabric_series = [line for line in text.splitlines() if line.startswith("myriad_fabric_link_")]
    links = len(snap.pod_id) * 8 + len(snap.pod_id)  # the leaves and the pod uplinks
    assert len(fabric_series) == 4 * links  # four families per link, nothing per port or per job


def _congest_pods(snap, pod_indexes):
    """A fabric entry in the live store whose rail-0 leaves of ``pod_indexes`` are congested."""
    nodes = np.nonzero(np.isin(snap.rack_pod[snap.node_rack], list(pod_indexes)))[0]
    ports = _ports(snap, nodes, [0.99, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    return fabric.publish(snap, ports, "agents", live_store())


def _submit(client, capture, gpus=16):
    body = {"queue": "vision", "gpus": gpus, "chip_types": ["H100-SXM"], "topology": "pod"}
    with capture(execute=True):
        job_id = client.post("/api/v1/jobs/", body, format="json").json()["id"]
    return Job.objects.get(pk=job_id)


def test_the_scheduler_places_gangs_away_from_congested_pods(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    snap = topology_cache.current()
    h100 = np.nonzero(snap.node_chip == snap.chip_names.index("H100-SXM"))[0]
    h100_pods = sorted({int(snap.rack_pod[snap.node_rack[n]]) for n in h100})
    assert len(h100_pods) >= 2
    # every H100 pod but the last is congested: best fit alone would take the first
    entry = _congest_pods(snap, h100_pods[:-1])
    assert entry["congested_pods"] == h100_pods[:-1]
    job = _submit(operator_client, django_capture_on_commit_callbacks)
    assert job.state == "running"
    pods = set(Pod.objects.filter(racks__nodes__gpus__allocations__job=job).values_list("pk", flat=True))
    assert pods == {int(snap.pod_id[h100_pods[-1]])}
    placed = job.events.get(kind="placed")
    assert "congested" not in placed.reason and placed.data["congested_fabric"] is False


def test_a_gang_placed_across_a_congested_fabric_says_so(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    snap = topology_cache.current()
    _congest_pods(snap, range(len(snap.pod_id)))  # every pod
    job = _submit(operator_client, django_capture_on_commit_callbacks)
    placed = job.events.get(kind="placed")
    assert "across a congested fabric" in placed.reason and placed.data["congested_fabric"] is True


def test_the_fleet_view_shows_the_fabric_of_a_pod_and_its_rail_leaves(small_cluster, viewer_client):
    snap = topology_cache.current()
    live_store().put(
        FRAME_KEY, encode_frame(3, 1.0, {m: np.zeros(snap.num_gpus, np.uint8) for m in FRAME_METRICS})
    )
    entry = _congest_pods(snap, [0])  # pod 0's rail-0 leaf congested
    CongestionRecord.objects.create(pod_id=int(snap.pod_id[0]), rail=0, started_at=timezone.now())
    pods = viewer_client.get("/api/v1/telemetry/levels/?level=pod").json()
    links = pods["fabric"]["links"]
    assert {link["kind"] for link in links} == {"pod uplink"} and len(links) == len(snap.pod_id)
    assert pods["fabric"]["source"] == "agents" and pods["fabric"]["thresholds"]["p99"] == 90
    pod = int(snap.pod_id[0])
    racks = viewer_client.get(f"/api/v1/telemetry/levels/?level=rack&within=pod:{pod}").json()
    leaves = {link["kind"]: link for link in racks["fabric"]["links"]}
    assert (
        len(leaves) == 1 + 8 and leaves["rail 0 leaf"]["congested"] and leaves["rail 0 leaf"]["p99"] == 99.0
    )
    assert leaves["rail 0 leaf"]["congested_since"] is not None and not leaves["rail 1 leaf"]["congested"]
    assert entry["leaf"]["congested"] == [0]
    live_store().delete(FRAME_KEY)
