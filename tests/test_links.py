"""Links between datacenters through the API and the cycle: a job spans only when no datacenter
holds it and it pays, takes its share of the link, is re-planned when lanes are lost and stops
when the link goes down; bad input is refused by field and writes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from cluster.builder import build_cluster, known_chip_names
from cluster.models import AuditRecord, ChipType, Datacenter, DatacenterLink
from engine.topology_spec import parse_topology
from monitoring.models import FaultEvent
from scheduling.cycle import run_cycle
from scheduling.models import Queue, QueueQuota
from scheduling.services import submit_job

POD = {"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8}
TWO_SITES = {
    "regions": [
        {
            "name": "north",
            "datacenters": [{"name": "bj1", "pods": [POD]}, {"name": "bj2", "pods": [POD]}],
        }
    ],
    "links": [{"between": ["bj1", "bj2"], "distance_km": 40, "lanes": 8, "lane_gbps": 400}],
}
MODEL = {"preset": "llama3-8b"}


@pytest.fixture
def two_sites(db):
    build_cluster(parse_topology(TWO_SITES, known_chip_names()))
    queue = Queue.objects.create(name="train")
    QueueQuota.objects.create(queue=queue, chip_type=ChipType.objects.get(name="H100-SXM"), nominal=64)
    return DatacenterLink.objects.get()


def _spanning_job(**kw):
    fields = {"queue": Queue.objects.get(name="train"), "gpus": 48, "topology": "region", "model": MODEL}
    fields.update(kw)
    return submit_job(**fields)


def test_a_link_reads_as_lanes_latency_state_and_load(two_sites, viewer_client):
    body = viewer_client.get("/api/v1/links/").json()["results"][0]
    assert (body["a_name"], body["b_name"]) == ("bj1", "bj2")
    assert body["lanes"] == 8 and body["bandwidth_gbps"] == 3200 and body["capacity_gbps"] == 3200
    assert body["latency_ms"] == pytest.approx(0.2)  # 40 km at 5 us per km
    assert body["state"] == "up" and body["load_gbps"] == 0 and body["utilization"] == 0


# a 13B model with 256 sequences of 2,048 tokens a step: at 48 GPUs its sends at a pipeline cut
# overlap its steps, where its gradients' all-reduce across the link is partly exposed
CUT_MODEL = {"params": 13e9, "layers": 40, "hidden": 5120, "seq_len": 2048, "batch_tokens": 256 * 2048}


def test_a_job_no_datacenter_holds_spans_takes_its_share_and_says_why(two_sites, viewer, viewer_client):
    job = _spanning_job(model=CUT_MODEL)
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running"
    placed = job.events.get(kind="placed")
    assert "spans bj1+bj2 over bj1<->bj2: " in placed.reason and "% slower" in placed.reason
    assert "no datacenter has an estimated time to hold it" in placed.reason
    ((a, b, load),) = job.link_loads
    assert {a, b} == set(Datacenter.objects.values_list("pk", flat=True)) and load > 0
    assert [s["datacenter"] for s in job.plan["sites"]] == ["bj1", "bj2"]
    # more than 1% faster with its pipeline cut at the link: each datacenter holds whole stages of
    # every replica, in proportion to its GPUs, and both the placement and the plan say which
    # stages run where
    assert job.plan["cut"] == "stages"
    stages = [s["stages"] for s in job.plan["sites"]]
    assert sum(stages) == job.plan["pp"] and all(n >= 1 for n in stages)
    where = f"stages 1-{stages[0]} in bj1, {stages[0] + 1}"
    assert where in placed.reason and where in job.events.get(kind="planned").reason
    browser = Client()
    browser.force_login(viewer)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="plan-sites"' in page and "the pipeline cut at the links" in page
    assert f"<td>bj1</td><td>{job.plan['sites'][0]['gpus']}</td><td>1-{stages[0]}</td>" in page
    link = viewer_client.get(f"/api/v1/links/{two_sites.pk}/").json()
    assert link["load_gbps"] == pytest.approx(load * 8 / 1e9, rel=1e-3) and link["utilization"] > 0
    detail = viewer_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert any("spans bj1+bj2" in e["reason"] for e in detail["events"])


def test_a_job_that_fits_one_datacenter_never_crosses_a_link(two_sites):
    job = _spanning_job(gpus=32)
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running" and job.link_loads is None
    assert "spans" not in job.events.get(kind="placed").reason


def test_with_the_policy_never_the_job_waits_inside_one_datacenter(two_sites, settings):
    settings.SPAN_POLICY = "never"
    job = _spanning_job()
    run_cycle()
    job.refresh_from_db()
    assert job.state == "pending" and "datacenter" in job.pending_reason


def test_lanes_lost_re_plan_the_job_crossing_and_marking_down_stops_it_once(
    two_sites, operator_client, django_capture_on_commit_callbacks, eager_celery
):
    job = _spanning_job()
    run_cycle()
    job.refresh_from_db()
    step_before = job.plan["step_s"]
    url = f"/api/v1/links/{two_sites.pk}/"
    response = operator_client.post(
        f"{url}lanes-lost/", {"lanes_lost": 7, "reason": "wavelength 3-9 dark"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "degraded" and response.json()["capacity_gbps"] == 400
    job.refresh_from_db()
    assert job.plan["step_s"] > step_before
    replanned = job.events.filter(kind="planned").latest("id")
    assert (
        "re-planned, link bj1 <-> bj2 has 1 of 8 lanes" in replanned.reason
        and "s/step (+" in replanned.reason
    )
    assert AuditRecord.objects.filter(action="lanes_lost", reason="wavelength 3-9 dark").count() == 1

    with django_capture_on_commit_callbacks(execute=True):
        first = operator_client.post(f"{url}mark-down/", {"reason": "fibre cut at km 17"}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        again = operator_client.post(f"{url}mark-down/", {"reason": "fibre cut at km 17"}, format="json")
    assert first.status_code == again.status_code == 200
    assert again.json()["state"] == "down" and again.json()["capacity_gbps"] == 0
    assert FaultEvent.objects.filter(link=two_sites, source="link_down").count() == 1
    assert AuditRecord.objects.filter(action="mark_down").count() == 1
    job.refresh_from_db()
    assert job.state != "running" or not job.link_loads  # its collectives hung: it was interrupted
    assert job.events.filter(kind__in=["interrupted", "requeued", "fault"]).exists()

    # with the link down nothing spans it: the job waits for one datacenter
    run_cycle()
    job.refresh_from_db()
    assert job.link_loads is None
    up = operator_client.post(f"{url}mark-up/", {"reason": "spliced"}, format="json")
    assert up.json()["state"] == "degraded"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"lanes": 0}, "lanes"),
        ({"distance_km": 100, "latency_ms": 0.3}, "latency_ms"),
        ({"same": True}, "b"),
        ({"a": 999_999}, "a"),
        ({"lane_gbps": 0}, "lane_gbps"),
    ],
    ids=["no-lanes", "faster-than-light", "to-itself", "unknown-datacenter", "no-rate"],
)
def test_a_bad_link_is_refused_by_field_and_writes_nothing(two_sites, operator_client, body, field):
    a, b = Datacenter.objects.order_by("pk")
    third = Datacenter.objects.create(region=a.region, name="bj3")
    payload = {"a": a.pk, "b": third.pk, "distance_km": 20, "lanes": 4}
    if body.pop("same", False):
        payload["b"] = a.pk
    payload.update(body)
    before = DatacenterLink.objects.count(), AuditRecord.objects.count()
    response = operator_client.post("/api/v1/links/", payload, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert (DatacenterLink.objects.count(), AuditRecord.objects.count()) == before


def test_a_link_marked_with_more_lanes_lost_than_it_has_is_refused(two_sites, operator_client):
    response = operator_client.post(
        f"/api/v1/links/{two_sites.pk}/lanes-lost/", {"lanes_lost": 9}, format="json"
    )
    assert response.status_code == 400 and "lanes_lost" in response.json()
    two_sites.refresh_from_db()
    assert two_sites.lanes_lost == 0 and AuditRecord.objects.count() == 0


def test_the_topology_spec_refuses_a_link_faster_than_light():
    doc = {
        **TWO_SITES,
        "links": [{"between": ["bj1", "bj2"], "distance_km": 100, "latency_ms": 0.1, "lanes": 8}],
    }
    with pytest.raises(Exception, match=r"links\[0\]\.latency_ms: 0.1 ms is below what light in fibre needs"):
        parse_topology(doc, {"H100-SXM"})
    doc = {**TWO_SITES, "links": [{"between": ["bj1", "bj2"], "lanes": 0}]}
    with pytest.raises(Exception, match=r"links\[0\]\.lanes: must be a whole number above 0"):
        parse_topology(doc, {"H100-SXM"})


def test_prometheus_shows_each_links_load_capacity_and_state(two_sites, operator_client, settings):
    from tests.test_metrics import TOKEN, samples, scrape, value

    settings.METRICS_TOKEN = TOKEN
    _spanning_job()
    run_cycle()
    found = samples(scrape("/metrics").content)
    assert value(found, "myriad_link_utilization_ratio", link="bj1<->bj2") > 0
    assert value(found, "myriad_link_capacity_gbps", link="bj1<->bj2") == 3200
    assert value(found, "myriad_link_state", link="bj1<->bj2", state="up") == 1
    operator_client.post(f"/api/v1/links/{two_sites.pk}/lanes-lost/", {"lanes_lost": 2}, format="json")
    found = samples(scrape("/metrics").content)
    assert value(found, "myriad_link_state", link="bj1<->bj2", state="degraded") == 1
    assert value(found, "myriad_link_capacity_gbps", link="bj1<->bj2") == 2400


def test_the_fleet_view_lists_the_links_between_its_datacenters(
    two_sites, viewer_client, operator_client, settings, tmp_path
):
    import numpy as np

    from cluster.snapshot import topology_cache
    from engine.frames import FRAME_METRICS, encode_frame
    from monitoring.telemetry.livestore import FRAME_KEY, live_store, reset_store

    settings.DATA_DIR = tmp_path
    reset_store()
    n = topology_cache.structure().num_gpus
    live_store().put(FRAME_KEY, encode_frame(3, 5.0, {m: np.zeros(n, dtype=np.uint8) for m in FRAME_METRICS}))
    _spanning_job()
    run_cycle()
    operator_client.post(
        f"/api/v1/links/{two_sites.pk}/lanes-lost/", {"lanes_lost": 4, "reason": "amplifier"}, format="json"
    )
    top = viewer_client.get("/api/v1/telemetry/levels/?level=datacenter").json()
    (link,) = top["sites"]
    assert link["name"] == "bj1 <-> bj2" and link["state"] == "degraded" and link["reason"] == "amplifier"
    assert link["lanes"] == "4 of 8 x 400 Gb/s" and link["capacity_gbps"] == 1600
    assert link["jobs"] == 1 and link["load_gbps"] > 0 and link["util"] > 0
    pods = viewer_client.get("/api/v1/telemetry/levels/?level=pod").json()
    assert "sites" not in pods
    live_store().delete(FRAME_KEY)
    reset_store()


def test_a_mixed_chip_job_across_the_link_takes_its_share_and_says_why(db, viewer_client):
    """A job split over two chip types that only the two datacenters together hold: the span
    decision names both parts and where they run, and the job takes its share of the link."""
    h200 = {**POD, "chip_type": "H200"}
    spec = {
        "regions": [
            {
                "name": "north",
                "datacenters": [{"name": "bj1", "pods": [POD]}, {"name": "bj2", "pods": [h200]}],
            }
        ],
        "links": [{"between": ["bj1", "bj2"], "distance_km": 40, "lanes": 8, "lane_gbps": 400}],
    }
    build_cluster(parse_topology(spec, known_chip_names()))
    queue = Queue.objects.create(name="train")
    for chip in ("H100-SXM", "H200"):
        QueueQuota.objects.create(queue=queue, chip_type=ChipType.objects.get(name=chip), nominal=64)
    job = submit_job(
        queue=queue,
        gpus=48,
        chip_types=["H100-SXM", "H200"],
        mixed_chips=True,
        topology="region",
        model=MODEL,
    )
    run_cycle()
    job.refresh_from_db()
    assert job.state == "running"
    placed = job.events.get(kind="placed")
    assert "spans bj1+bj2 over bj1<->bj2: " in placed.reason
    assert "no datacenter has an estimated time to hold it" in placed.reason
    assert "32 H100-SXM + 16 H200" in placed.reason and "GPUs: 32 in bj1, 16 in bj2" in placed.reason
    ((a, b, load),) = job.link_loads
    assert {a, b} == set(Datacenter.objects.values_list("pk", flat=True)) and load > 0
    link = viewer_client.get(f"/api/v1/links/{DatacenterLink.objects.get().pk}/").json()
    assert link["load_gbps"] > 0
