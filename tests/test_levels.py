"""The operator's levels (engine.levels) and the aggregated view of the live frame a level at a
time (GET /api/v1/telemetry/levels/): the numbers an operator reads at the top of a 100k-GPU
cluster are the ones its GPUs add up to."""

from __future__ import annotations

import numpy as np
import pytest

from engine.levels import LEVELS, Hierarchy, aggregate, aggregate_all


@pytest.fixture
def tiny():
    """2 datacenters; 3 pods (dc0: p0, p1; dc1: p2); 4 racks (p0: r0; p1: r1, r2; p2: r3); 6 nodes
    of 2 GPUs, listed out of rack order (node 5 sits in rack 0)."""
    node_rack = np.array([0, 1, 2, 3, 3, 0])
    return Hierarchy(
        gpu_node=np.repeat(np.arange(6), 2),
        node_rack=node_rack,
        rack_pod=np.array([0, 1, 1, 2]),
        pod_datacenter=np.array([0, 0, 1]),
        num_datacenters=2,
    )


def test_every_gpu_sits_in_one_cell_of_every_level_and_the_cells_add_up(tiny):
    for level in LEVELS:
        assert tiny.gpus(level).sum() == 12
    assert tiny.cell_of_gpu("rack").tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 0, 0]
    assert tiny.cell_of_gpu("datacenter").tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert tiny.within("rack", "pod", 1).tolist() == [1, 2]
    assert tiny.within("node", "datacenter", 0).tolist() == [0, 1, 2, 5]
    assert tiny.within("gpu", "node", 5).tolist() == [10, 11]
    assert tiny.ancestors("gpu", 11) == [("datacenter", 0), ("pod", 0), ("rack", 0), ("node", 5), ("gpu", 11)]
    with pytest.raises(ValueError, match="not above"):
        tiny.within("pod", "rack", 0)
    with pytest.raises(ValueError, match="no pod 7"):
        tiny.within("rack", "pod", 7)
    with pytest.raises(ValueError, match="unknown level 'row'"):
        tiny.size("row")


def test_each_aggregate_matches_the_gpus_it_stands_for(tiny):
    util = np.array([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 0, 95], dtype=np.uint8)
    health = np.array([0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 0, 3], dtype=np.uint8)
    rack = tiny.cell_of_gpu("rack")
    for r in range(4):
        mine = util[rack == r].astype(float)
        assert aggregate(tiny, "rack", util, "mean")[r] == pytest.approx(mine.mean())
        assert aggregate(tiny, "rack", util, "max")[r] == mine.max()
        assert aggregate(tiny, "rack", util, "above", threshold=80)[r] == pytest.approx(
            100 * (mine >= 80).mean()
        )
        assert aggregate(tiny, "rack", util, "unhealthy", health=health)[r] == (health[rack == r] > 0).sum()
    every = aggregate_all(tiny, util, "max")
    assert every["datacenter"].tolist() == [95, 100] and every["gpu"].tolist() == util.tolist()
    with pytest.raises(ValueError, match="unknown aggregate 'median'"):
        aggregate(tiny, "pod", util, "median")
    with pytest.raises(ValueError, match="11 values for 12 GPUs"):
        aggregate(tiny, "pod", util[:11], "mean")


def test_a_cell_without_gpus_has_no_value_not_zero(tiny):
    empty_pod = Hierarchy(tiny.gpu_node, tiny.node_rack, tiny.rack_pod, np.array([0, 0, 1, 1]), 2)
    util = np.full(12, 50, dtype=np.uint8)
    assert np.isnan(aggregate(empty_pod, "pod", util, "mean")[3])
    assert np.isnan(aggregate(empty_pod, "pod", util, "max")[3])


@pytest.fixture
def live_frame(small_cluster, settings, tmp_path):
    """A frame of known values in the live store: GPU i's utilization is i % 100, its health is
    bad on every seventh GPU."""
    from cluster.snapshot import topology_cache
    from engine.frames import FRAME_METRICS, encode_frame
    from monitoring.telemetry.livestore import FRAME_KEY, live_store, reset_store

    settings.DATA_DIR = tmp_path
    reset_store()
    n = topology_cache.structure().num_gpus
    values = {m: np.zeros(n, dtype=np.uint8) for m in FRAME_METRICS}
    values["util"] = (np.arange(n) % 100).astype(np.uint8)
    values["health"] = (np.arange(n) % 7 == 0).astype(np.uint8)
    live_store().put(FRAME_KEY, encode_frame(11, 5.0, values))
    yield values
    live_store().delete(FRAME_KEY)
    reset_store()


def test_the_top_level_adds_up_to_the_frame_and_drilling_down_narrows_it(live_frame, viewer_client):
    from cluster.snapshot import topology_cache

    snap = topology_cache.structure()
    util, health = live_frame["util"].astype(float), live_frame["health"]
    top = viewer_client.get("/api/v1/telemetry/levels/").json()
    assert top["frame"] == 11 and top["level"] == "pod" and top["path"] == []
    assert sum(c["gpus"] for c in top["cells"]) == snap.num_gpus
    pod_of_gpu = snap.rack_pod[snap.node_rack[snap.gpu_node]]
    for cell in top["cells"]:
        mine = pod_of_gpu == list(snap.pod_id).index(cell["id"])
        assert cell["value"] == pytest.approx(util[mine].mean(), abs=0.05)
        assert cell["unhealthy"] == int((health[mine] > 0).sum())
    dc = int(snap.datacenter_id[0])
    pods = viewer_client.get(f"/api/v1/telemetry/levels/?level=pod&within=datacenter:{dc}").json()
    assert 0 < len(pods["cells"]) <= len(top["cells"])
    assert pods["path"] == [{"level": "datacenter", "id": dc, "name": snap.names["datacenter"][0]}]
    node = int(snap.node_id[1])
    gpus = viewer_client.get(f"/api/v1/telemetry/levels/?level=gpu&within=node:{node}&aggregate=max").json()
    mine = np.flatnonzero(snap.gpu_node == 1)
    assert [c["value"] for c in gpus["cells"]] == util[mine].tolist()
    assert [c["id"] for c in gpus["cells"]] == snap.gpu_id[mine].tolist()
    assert [p["level"] for p in gpus["path"]] == ["datacenter", "pod", "rack", "node"]
    hot = viewer_client.get("/api/v1/telemetry/levels/?level=datacenter&aggregate=above&threshold=90").json()
    dc_of_gpu = snap.pod_datacenter[pod_of_gpu]
    assert hot["cells"][0]["value"] == pytest.approx(100 * (util[dc_of_gpu == 0] >= 90).mean(), abs=0.05)


@pytest.mark.parametrize(
    "query, field",
    [
        ("level=row", "level"),
        ("metric=fan", "metric"),
        ("aggregate=median", "aggregate"),
        ("threshold=300", "threshold"),
        ("threshold=-1", "threshold"),
        ("threshold=²", "threshold"),
        ("threshold=" + "9" * 5000, "threshold"),
        ("job=" + "9" * 30, "job"),
        ("within=pod:" + "9" * 5000, "within"),
        ("within=pod", "within"),
        ("within=pod:x", "within"),
        ("level=pod&within=rack:1", "within"),
    ],
)
def test_a_bad_query_names_its_field(live_frame, viewer_client, query, field):
    r = viewer_client.get(f"/api/v1/telemetry/levels/?{query}")
    assert r.status_code == 400 and field in r.json()


def test_an_unknown_domain_is_404_and_no_frame_yet_is_404(small_cluster, viewer_client, live_frame):
    assert viewer_client.get("/api/v1/telemetry/levels/?level=rack&within=pod:999999").status_code == 404
    from monitoring.telemetry.livestore import FRAME_KEY, live_store

    live_store().delete(FRAME_KEY)
    r = viewer_client.get("/api/v1/telemetry/levels/")
    assert r.status_code == 404 and "no telemetry" in r.json()["detail"]


def test_marks_are_counted_in_the_cells_that_hold_them(tiny):
    assert tiny.up("pod", np.array([0, 3, 5])).tolist() == [0, 2, 0]
    down = np.array([False, False, False, True, True, True])  # nodes 3 and 4 (rack 3), node 5 (rack 0)
    assert tiny.count("rack", down).tolist() == [1, 0, 0, 2]
    assert tiny.count("datacenter", down).tolist() == [1, 2]
    assert tiny.count("node", np.array([1, 10, 11]), of="gpu").tolist() == [1, 0, 0, 0, 0, 2]
    assert tiny.count("gpu", np.array([3]), of="gpu")[3] == 1
    with pytest.raises(ValueError, match="a rack is not inside a node"):
        tiny.count("node", down, of="rack")


def test_overlays_mark_nodes_faults_and_a_jobs_gpus_at_every_level(live_frame, viewer_client, queues):
    from django.utils import timezone

    from cluster.models import Node
    from monitoring.models import FaultEvent
    from scheduling.cycle import run_cycle
    from scheduling.services import submit_job

    nodes = list(Node.objects.order_by("id"))
    Node.objects.filter(pk=nodes[0].pk).update(state="down", is_lemon=True)
    FaultEvent.objects.create(node=nodes[0], at=timezone.now(), source="xid", xid=79)
    FaultEvent.objects.create(
        node=nodes[1], at=timezone.now(), source="xid", xid=43, cleared_at=timezone.now()
    )
    job = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name="overlay")
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running"
    for level in ("datacenter", "pod", "rack", "node"):
        view = viewer_client.get(f"/api/v1/telemetry/levels/?level={level}&job={job.pk}").json()
        assert sum(c.get("job_gpus", 0) for c in view["cells"]) == 8, level
        marks = [c["marks"] for c in view["cells"]]
        assert sum(m.get("down", 0) for m in marks) == 1 and sum(m.get("lemon", 0) for m in marks) == 1
        assert sum(m.get("open_faults", 0) for m in marks) == 1  # the cleared one is not open
    assert view["job"]["state"] == "running" and view["job"]["allocated_gpus"] == 8
    assert "would_fit" not in view["job"]  # only a pending job is told where it could run
    waiting = submit_job(
        queue=queues["vision"], gpus=16, chip_types=["H100-SXM"], topology="any", name="next"
    )
    pending = viewer_client.get(f"/api/v1/telemetry/levels/?job={waiting.pk}").json()["job"]
    assert pending["state"] == "pending" and pending["would_fit"].startswith("room now in")
    assert (
        sum(
            c.get("job_gpus", 0)
            for c in viewer_client.get(f"/api/v1/telemetry/levels/?job={waiting.pk}").json()["cells"]
        )
        == 0
    )
    down = next(c for c in view["cells"] if c["id"] == nodes[0].pk)
    assert down["marks"] == {"down": 1, "lemon": 1, "open_faults": 1, "faults_24h": 1}
    gpus = viewer_client.get(f"/api/v1/telemetry/levels/?level=gpu&within=node:{nodes[0].pk}").json()
    assert all(c["marks"]["down"] == 1 for c in gpus["cells"])  # a GPU carries its node's marks
    assert viewer_client.get("/api/v1/telemetry/levels/?job=999999").status_code == 404
    assert "job" in viewer_client.get("/api/v1/telemetry/levels/?job=x").json()


def test_one_box_finds_a_domain_a_node_a_gpu_and_a_job_and_says_where_they_are(small_cluster, viewer_client):
    from django.utils import timezone

    from cluster.models import GPU, Node
    from scheduling.models import Job, Queue

    node = Node.objects.order_by("id").first()
    gpu = GPU.objects.filter(node=node).order_by("index").last()
    queue = Queue.objects.create(name="find-me")
    job = Job.objects.create(queue=queue, gpus=8, name="llama-finetune", submitted_at=timezone.now())

    def results(q):
        r = viewer_client.get("/api/v1/telemetry/levels/find/", {"q": q})
        assert r.status_code == 200
        return r.json()["results"]

    hit = next(h for h in results(node.hostname) if h["kind"] == "node")
    assert hit == {"kind": "node", "label": node.hostname, "level": "gpu", "within": f"node:{node.pk}"}
    hit = results(gpu.uuid[:12])[0]
    assert hit["kind"] == "gpu" and hit["within"] == f"node:{node.pk}" and gpu.uuid in hit["label"]
    assert [h["job"] for h in results("llama-fine") if h["kind"] == "job"] == [job.pk]
    assert [h["job"] for h in results(str(job.pk)) if h["kind"] == "job"] == [job.pk]
    pod = node.rack.pod
    pods = [h for h in results(pod.name) if h["kind"] == "pod"]
    assert any(h["within"] == f"pod:{pod.pk}" and h["level"] == "rack" for h in pods)
    assert results("   ") == []
    assert viewer_client.get("/api/v1/telemetry/levels/find/", {"q": "x" * 201}).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_levels_websocket_sends_the_view_asked_for_and_again_for_each_new_frame(live_frame, viewer):
    import json

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer
    from channels.testing import WebsocketCommunicator

    from engine.frames import delta_message, encode_frame
    from monitoring.telemetry.consumers import GROUP, LevelsConsumer
    from monitoring.telemetry.livestore import FRAME_KEY, live_store

    async def run():
        ws = WebsocketCommunicator(LevelsConsumer.as_asgi(), "/ws/levels/")
        ws.scope["user"] = viewer
        assert (await ws.connect())[0]
        await ws.send_to(text_data=json.dumps({"level": "datacenter", "aggregate": "max"}))
        first = json.loads(await ws.receive_from())
        assert first["frame"] == 11 and first["level"] == "datacenter"
        assert max(c["value"] for c in first["cells"]) == live_frame["util"].max()
        old = live_store().get(FRAME_KEY)
        newer = encode_frame(12, 6.0, {**live_frame, "util": np.full(len(live_frame["util"]), 3, np.uint8)})
        live_store().put(FRAME_KEY, newer)
        await get_channel_layer().group_send(
            GROUP, {"type": "telemetry.frame", "frame": delta_message(old, newer)}
        )
        pushed = json.loads(await ws.receive_from())
        assert pushed["frame"] == 12 and {c["value"] for c in pushed["cells"]} == {3}
        await ws.send_to(text_data=json.dumps({"level": "row"}))
        assert json.loads(await ws.receive_from()) == {
            "error": {"level": [f"must be one of {', '.join(LEVELS)}"]}
        }
        await ws.send_to(text_data="[1, 2]")
        assert "view" in json.loads(await ws.receive_from())["error"]
        await ws.disconnect()

    async_to_sync(run)()


def test_a_drain_preview_names_what_a_drain_would_hit_and_the_drain_follows_it(
    queues, viewer_client, operator_client
):
    from django.utils import timezone

    from cluster.models import AuditRecord, Node
    from scheduling.cycle import run_cycle
    from scheduling.models import AllocatedGPU
    from scheduling.services import submit_job

    job = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="node", name="victim")
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running"
    job.started_at = timezone.now() - timezone.timedelta(seconds=3600)
    job.last_checkpoint_at = timezone.now() - timezone.timedelta(seconds=600)
    job.save(update_fields=["started_at", "last_checkpoint_at"])
    node = Node.objects.get(gpus__allocations__job=job, gpus__allocations__active=True, gpus__index=0)
    rack = node.rack
    seen = viewer_client.get(f"/api/v1/drain-preview/?within=rack:{rack.pk}").json()
    assert seen["domain"]["level"] == "rack" and seen["nodes"] == rack.nodes.count()
    assert seen["gpus_allocated"] == AllocatedGPU.objects.filter(active=True, gpu__node__rack=rack).count()
    hit = next(j for j in seen["jobs"] if j["id"] == job.pk)
    assert hit["gpus_here"] == hit["gpus"] == 8
    assert 590 <= hit["since_checkpoint_s"] <= 700  # since its last checkpoint, not since it started
    assert hit["lost_s"] == (0 if hit["saved_first"] else hit["since_checkpoint_s"])
    assert hit["would_go"].startswith(("room now in", "no room now"))
    # the viewer may look, not drain; the operator drains with a reason, audited
    body = {"within": f"rack:{rack.pk}", "reason": "swap the rack's PDU"}
    assert viewer_client.post("/api/v1/drain-preview/", body, format="json").status_code == 403
    no_reason = operator_client.post("/api/v1/drain-preview/", {"within": f"rack:{rack.pk}"}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()
    assert Node.objects.filter(rack=rack, state="draining").count() == 0  # nothing changed
    done = operator_client.post("/api/v1/drain-preview/", body, format="json").json()
    assert sorted(done["drained"]) == sorted(rack.nodes.values_list("hostname", flat=True))
    assert set(Node.objects.filter(rack=rack).values_list("state", flat=True)) <= {"draining", "drained"}
    assert "swap the rack's PDU" in Node.objects.get(pk=node.pk).state_reason
    audit = AuditRecord.objects.filter(action="drain", object_type="node", object_id=node.pk).get()
    assert audit.actor == "otto-operator" and "swap the rack's PDU" in audit.reason
    again = operator_client.post("/api/v1/drain-preview/", body, format="json").json()
    assert again["drained"] == [] and set(again["skipped"]) == set(done["drained"])  # left as they are
    for bad, code in (("rack:x", 400), ("datacenter:1", 400), ("rack:999999", 404)):
        assert viewer_client.get(f"/api/v1/drain-preview/?within={bad}").status_code == code


def test_faults_of_the_last_day_colour_the_levels_and_older_ones_do_not(live_frame, viewer_client):
    from datetime import timedelta

    from django.utils import timezone

    from cluster.models import Node
    from monitoring.models import FaultEvent

    node, other = list(Node.objects.order_by("id")[:2])
    now = timezone.now()
    for _ in range(3):
        FaultEvent.objects.create(
            node=node, at=now - timedelta(hours=1), source="xid", xid=79, cleared_at=now
        )
    FaultEvent.objects.create(node=other, at=now - timedelta(hours=30), source="xid", xid=79, cleared_at=now)
    racks = viewer_client.get("/api/v1/telemetry/levels/?level=node&aggregate=faults").json()
    by_id = {c["id"]: c for c in racks["cells"]}
    assert by_id[node.pk]["value"] == 3 and by_id[node.pk]["marks"] == {"faults_24h": 3}
    assert by_id[other.pk]["value"] == 0  # 30 hours ago
    assert by_id[node.pk]["faults_by_hour"][22] == 3 and sum(by_id[node.pk]["faults_by_hour"]) == 3
    top = viewer_client.get("/api/v1/telemetry/levels/?aggregate=faults").json()
    assert sum(c["value"] for c in top["cells"]) == 3
    assert sum(sum(c["faults_by_hour"]) for c in top["cells"]) == 3  # the same hour by hour, per pod
    gpus = viewer_client.get(
        f"/api/v1/telemetry/levels/?level=gpu&within=node:{node.pk}&aggregate=faults"
    ).json()
    assert all(c["faults_by_hour"][22] == 3 for c in gpus["cells"])  # a GPU shows its node's


def test_uplinks_are_labelled_by_the_pod_or_rack_they_belong_to(live_frame, viewer_client):
    import json

    from cluster.snapshot import topology_cache
    from monitoring.telemetry.livestore import NETWORK_KEY, live_store

    snap = topology_cache.structure()
    racks, pods = snap.rack_id.tolist(), snap.pod_id.tolist()
    net = {
        "rack_ids": racks,
        "rack_util": [0.1 * (i + 1) for i in range(len(racks))],
        "pod_ids": pods,
        "pod_util": [1.25] * len(pods),
    }
    live_store().put(NETWORK_KEY, json.dumps(net).encode())
    try:
        top = viewer_client.get("/api/v1/telemetry/levels/").json()
        assert [u["name"] for u in top["uplinks"]] == [c["name"] for c in top["cells"]]
        assert {u["util"] for u in top["uplinks"]} == {125.0}  # over 100: congested
        node = viewer_client.get(
            f"/api/v1/telemetry/levels/?level=gpu&within=node:{int(snap.node_id[0])}"
        ).json()
        rack = int(snap.rack_id[snap.node_rack[0]])
        assert [(u["kind"], u["id"]) for u in node["uplinks"]] == [
            ("pod", pods[snap.rack_pod[snap.node_rack[0]]]),
            ("rack", rack),
        ]
        assert node["uplinks"][1]["util"] == round(100 * net["rack_util"][racks.index(rack)], 1)
    finally:
        live_store().delete(NETWORK_KEY)
    assert viewer_client.get("/api/v1/telemetry/levels/").json()["uplinks"] == []


def test_marking_a_node_down_is_previewed_as_losing_the_unsaved_work_and_takes_no_grace(
    queues, viewer_client, operator_client
):
    from django.utils import timezone

    from cluster.models import Node
    from scheduling.cycle import run_cycle
    from scheduling.services import submit_job

    job = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="node", name="abrupt")
    run_cycle()
    job.refresh_from_db()
    job.started_at = timezone.now() - timezone.timedelta(seconds=900)
    job.save(update_fields=["started_at"])
    node = Node.objects.get(gpus__allocations__job=job, gpus__allocations__active=True, gpus__index=0)
    seen = viewer_client.get(f"/api/v1/drain-preview/?within=node:{node.pk}&action=mark-down").json()
    hit = next(j for j in seen["jobs"] if j["id"] == job.pk)
    assert seen["action"] == "mark-down" and not hit["saved_first"]
    assert hit["lost_s"] == hit["since_checkpoint_s"] >= 890  # no checkpoint: everything since it started
    assert viewer_client.get(f"/api/v1/drain-preview/?within=node:{node.pk}&action=reboot").status_code == 400
    body = {"within": f"node:{node.pk}", "reason": "PSU smoke", "action": "mark-down", "grace_s": 60}
    refused = operator_client.post("/api/v1/drain-preview/", body, format="json")
    assert refused.status_code == 400 and "grace_s" in refused.json()
    done = operator_client.post("/api/v1/drain-preview/", {**body, "grace_s": 0}, format="json").json()
    assert done == {"action": "mark-down", "drained": [node.hostname], "skipped": {}}
    assert Node.objects.get(pk=node.pk).state == "down"
