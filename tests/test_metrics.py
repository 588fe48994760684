"""Prometheus metrics as an operator's Prometheus sees them: scrapes refused without the token or an
allowed address; the control plane's figures following what happens (pending reasons, admissions,
evictions, cycles, GPUs by state, faults); every GPU with dcgm-exporter's names and labels, the
same text prometheus-client writes, split into shards that cover the fleet once."""

from __future__ import annotations

import ipaddress
import threading

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.agents import create_enrolment_token, enrol
from cluster.models import GPU, Node
from cluster.snapshot import topology_cache
from monitoring.models import FaultEvent
from monitoring.telemetry import gpu_metrics, ingest, metrics
from monitoring.telemetry.livestore import CYCLE_COUNTS_KEY, live_store, reset_store
from scheduling.cycle import run_cycle
from scheduling.models import Job

TOKEN = "scrape-secret-1234"


@pytest.fixture(autouse=True)
def metrics_settings(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = []
    settings.SIMULATED_FLEET = False
    reset_store()
    live_store().delete(CYCLE_COUNTS_KEY)
    ingest.clear_reports()
    metrics.reset_totals()
    yield
    ingest.clear_reports()
    live_store().delete(CYCLE_COUNTS_KEY)
    metrics.reset_totals()


def scrape(path: str, token: str | None = TOKEN, **extra):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Client().get(path, **headers, **extra)


def body(response) -> bytes:
    """The scrape's text: the GPUs' is streamed."""
    return b"".join(response.streaming_content) if response.streaming else response.content


def samples(text: bytes) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(found: dict, name: str, **labels) -> float:
    matches = [v for lab, v in found.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert matches, f"no {name} with {labels}"
    return sum(matches)


def test_scrapes_need_the_token_or_an_allowed_address(small_cluster, settings):
    for path in ("/metrics", "/metrics/gpus"):
        assert scrape(path, token=None).status_code == 401
        refused = scrape(path, token="wrong")
        assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
        assert scrape(path).status_code == 200
    settings.METRICS_ALLOW = [ipaddress.ip_network("10.0.0.0/8")]
    assert scrape("/metrics", token=None, REMOTE_ADDR="10.1.2.3").status_code == 200
    assert scrape("/metrics", token=None, REMOTE_ADDR="192.168.1.1").status_code == 401
    assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def _submit(operator_client, queue: str, gpus: int, **extra) -> int:
    body = {"queue": queue, "gpus": gpus, "chip_types": extra.pop("chip_types", ["H100-SXM"]), **extra}
    response = operator_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_the_control_plane_figures_follow_what_happens(queues, operator_client, eager_celery):
    # vision borrows 16 of nlp's H100s; two A100 jobs of legacy pass its 12-GPU quota (no cohort)
    borrower = _submit(operator_client, "vision", 48, topology="any")
    _submit(operator_client, "legacy", 8, chip_types=["A100-80G"])
    second = _submit(operator_client, "legacy", 8, chip_types=["A100-80G"])
    run_cycle()
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_pending_jobs", queue="legacy", reason="quota") == 1
    waiting = operator_client.get(f"/api/v1/jobs/{second}/").json()
    assert waiting["pending_kind"] == "quota"
    assert waiting["pending_reason"].startswith("quota of queue legacy")
    assert value(found, "myriad_pending_jobs", queue="vision") == 0
    assert value(found, "myriad_admitted_jobs_total", queue="vision") == 1
    assert value(found, "myriad_running_jobs", queue="vision") == 1
    assert value(found, "myriad_quota_nominal_gpus", queue="vision", chip="H100-SXM") == 32
    assert value(found, "myriad_quota_used_gpus", queue="vision", chip="H100-SXM") == 48
    assert value(found, "myriad_quota_borrowed_gpus", queue="vision", chip="H100-SXM") == 16
    assert value(found, "myriad_quota_lent_gpus", queue="nlp", chip="H100-SXM") == 16
    assert value(found, "myriad_admission_wait_seconds_count", queue="vision") == 1
    assert value(found, "myriad_cycle_duration_seconds_count") == 1
    assert value(found, "myriad_gpus") == GPU.objects.count()
    busy, idle = (value(found, "myriad_gpus", state=s) for s in ("allocated", "allocated_idle"))
    assert busy + idle == 56

    # nlp reclaims its quota: the borrower is evicted
    _submit(operator_client, "nlp", 16)
    run_cycle()
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_evicted_jobs_total", queue="vision", reason="preempted") == 1
    assert value(found, "myriad_admitted_jobs_total", queue="nlp") == 1
    assert value(found, "myriad_cycle_duration_seconds_count") == 2
    assert Job.objects.get(pk=borrower).state == "pending"

    node = Node.objects.filter(chip_type__name="H100-SXM").first()
    FaultEvent.objects.create(node=node, at=timezone.now(), source="xid", xid=79, cause="gpu_fell_off_bus")
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_faults_total", cause="gpu_fell_off_bus", source="xid") == 1
    assert "myriad_celery_queue_length" in found and "myriad_ettr_ratio" in found


def test_the_gpu_text_is_what_prometheus_client_writes_and_shards_cover_the_fleet_once(small_cluster):
    fast = scrape("/metrics/gpus")
    assert fast.status_code == 200 and fast["Content-Type"].startswith("text/plain")
    registry = CollectorRegistry(auto_describe=False)

    class Families:
        def collect(self):
            yield from gpu_metrics.gpu_families()

    registry.register(Families())
    text = body(fast)
    assert fast.streaming and text == generate_latest(registry)

    found = samples(text)
    n = GPU.objects.count()
    assert len(found["DCGM_FI_DEV_GPU_UTIL"]) == n
    labels = found["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert set(labels) == {"Hostname", "UUID", "gpu", "modelName", "rack", "pod", "datacenter"}
    gpu = GPU.objects.select_related("node__chip_type", "node__rack").get(uuid=labels["UUID"])
    assert labels["Hostname"] == gpu.node.hostname and labels["gpu"] == str(gpu.index)
    assert labels["modelName"] == gpu.node.chip_type.model and labels["rack"] == gpu.node.rack.name

    seen = []
    for k in range(3):
        part = samples(body(scrape(f"/metrics/gpus?shard={k}&of=3")))
        seen += [lab["UUID"] for lab, _ in part["DCGM_FI_DEV_GPU_UTIL"]]
    assert sorted(seen) == sorted(GPU.objects.values_list("uuid", flat=True))
    dc = topology_cache.current().names["datacenter"][0]
    part = samples(body(scrape(f"/metrics/gpus?datacenter={dc}")))
    assert {lab["datacenter"] for lab, _ in part["DCGM_FI_DEV_GPU_UTIL"]} == {dc}


def test_over_asgi_the_gpu_text_streams_in_pieces_formatted_off_the_event_loop(small_cluster, monkeypatch):
    """As the web server serves it: piece by piece (a 100k-GPU scrape is 145 MB of text), the same
    text as the whole."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    whole = body(scrape("/metrics/gpus"))
    monkeypatch.setattr(gpu_metrics, "CHUNK_GPUS", 5)
    formatted_on, format_samples = set(), gpu_metrics._samples

    def samples_noting_the_thread(*args):
        formatted_on.add(threading.get_ident())
        return format_samples(*args)

    monkeypatch.setattr(gpu_metrics, "_samples", samples_noting_the_thread)
    loop = {}

    async def fetch():
        loop["thread"] = threading.get_ident()
        response = await AsyncClient().get("/metrics/gpus", headers={"authorization": f"Bearer {TOKEN}"})
        return response, [piece async for piece in response.streaming_content]

    response, pieces = async_to_sync(fetch)()
    assert response.status_code == 200 and response.is_async
    per_metric = -(-GPU.objects.count() // 5) + 1  # its pieces of five GPUs, and its header
    assert len(pieces) == per_metric * len(gpu_metrics.GPU_METRICS)
    assert b"".join(pieces) == whole
    assert formatted_on and loop["thread"] not in formatted_on


def test_bad_shard_parameters_get_a_400_naming_the_field(small_cluster):
    for query, field in (
        ("shard=3&of=3", "shard"),
        ("shard=x&of=2", "shard"),
        ("shard=0", "shard"),
        ("of=0&shard=0", "of"),
        ("datacenter=nowhere", "datacenter"),
        ("zone=a", "zone"),
    ):
        response = scrape(f"/metrics/gpus?{query}")
        assert response.status_code == 400, query
        assert field in response.json(), (query, response.json())


def test_a_node_agents_readings_and_an_open_xid_show_on_its_gpus(
    small_cluster, django_capture_on_commit_callbacks
):
    from rest_framework.test import APIClient

    node = Node.objects.filter(chip_type__name="H100-SXM", is_spare=False).order_by("id").first()
    _, secret = create_enrolment_token(actor="test", node=node)
    _, key = enrol(secret, hostname=node.hostname, address="10.0.0.9")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    gpus = [
        {
            "index": i,
            "util": 77,
            "memory_used_mib": 30000,
            "memory_total_mib": 81559,
            "temperature_c": 61,
            "power_w": 412.5,
            "power_limit_w": 700,
            "ecc_corrected_volatile": 3,
            "ecc_uncorrected_volatile": 0,
        }
        for i in range(8)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post("/api/v1/agent/report/", {"seq": 1, "gpus": gpus}, format="json")
    assert answer.status_code == 200
    gpu0 = GPU.objects.get(node=node, index=0)
    FaultEvent.objects.create(node=node, gpu=gpu0, at=timezone.now(), source="xid", xid=48, cause="dbe")
    found = samples(body(scrape("/metrics/gpus")))
    mine = [lab for lab, _ in found["DCGM_FI_DEV_POWER_USAGE"] if lab["Hostname"] == node.hostname]
    assert sorted(lab["gpu"] for lab in mine) == [str(i) for i in range(8)]
    assert value(found, "DCGM_FI_DEV_POWER_USAGE", Hostname=node.hostname, gpu="3") == 412.5
    assert value(found, "DCGM_FI_DEV_FB_USED", Hostname=node.hostname, gpu="3") == 30000
    assert value(found, "DCGM_FI_DEV_FB_FREE", Hostname=node.hostname, gpu="3") == 81559 - 30000
    assert value(found, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Hostname=node.hostname, gpu="3") == 3
    assert value(found, "DCGM_FI_DEV_XID_ERRORS", Hostname=node.hostname, gpu="0") == 48
    assert value(found, "DCGM_FI_DEV_XID_ERRORS", Hostname=node.hostname, gpu="1") == 0


def test_what_the_alerts_page_on_follows_what_happens(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks, settings
):
    """The families docs/alerts reads: XIDs with their action and meaning, agents gone silent,
    lemon nodes per datacenter, running jobs below their policy's ETTR goal, the cycle's budget."""
    from datetime import timedelta

    from cluster.models import NodeCredential
    from scheduling.models import CheckpointPolicy, JobEvent

    settings.CYCLE_BUDGET_S = 1.5
    job = _submit(operator_client, "vision", 8)
    run_cycle()
    assert Job.objects.get(pk=job).state == "running"
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_jobs_below_ettr_goal", queue="vision") == 0
    assert value(found, "myriad_cycle_budget_seconds") == 1.5
    assert value(found, "myriad_agents", state="silent") == 0
    assert value(found, "myriad_lemon_nodes") == 0
    # the catalogue's codes are there at zero before their first fault (a series born at 1 is no
    # increase to Prometheus): XID 79 with the reboot it takes, and none of any other action yet
    assert value(found, "myriad_xid_faults_total", xid="79", action="reboot_node") == 0
    assert value(found, "myriad_xid_faults_total") == 0
    assert not [lab for lab, _ in found["myriad_xid_faults_total"] if lab["action"] == "restart_job"]
    # and so is every fault source's documented cause (the NIC alerts' first fault is an increase)
    assert value(found, "myriad_faults_total", cause="network", source="nic_port_down") == 0
    assert value(found, "myriad_faults_total", cause="network", source="nic_link_flap") == 0

    # two hours running, of which one hour of work was lost to a fault: ETTR ~0.5 < the 0.9 default
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk=job).update(submitted_at=two_hours_ago - timedelta(minutes=1))
    JobEvent.objects.filter(job_id=job, kind__in=["submitted", "admitted"]).update(at=two_hours_ago)
    JobEvent.objects.create(
        job_id=job, kind="faulted", at=timezone.now() - timedelta(hours=1), data={"lost_s": 3600.0}
    )
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_jobs_below_ettr_goal", queue="vision") == 1
    assert value(found, "myriad_jobs_below_ettr_goal", queue="nlp") == 0
    # a policy that asks for less holds the job to less
    relaxed = CheckpointPolicy.objects.create(name="relaxed", ettr_goal=0.4)
    Job.objects.filter(pk=job).update(checkpoint_policy=relaxed)
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_jobs_below_ettr_goal", queue="vision") == 0

    # a GPU falls off the bus (XID 79): the node is rebooted, and the code's meaning comes along
    gpu = GPU.objects.filter(node__chip_type__name="A100-80G").first()
    with django_capture_on_commit_callbacks(execute=True):
        answer = operator_client.post(
            "/api/v1/faults/", {"gpu": gpu.id, "source": "xid", "xid": 79}, format="json"
        )
    assert answer.status_code == 201, answer.content
    found = samples(body(scrape("/metrics")))
    assert (
        value(
            found,
            "myriad_xid_faults_total",
            xid="79",
            action="reboot_node",
            meaning="GPU has fallen off the bus",
        )
        == 1
    )

    # an agent goes silent; a node is quarantined as a lemon
    node = Node.objects.filter(chip_type__name="H100-SXM").order_by("id").last()
    _, secret = create_enrolment_token(actor="test", node=node)
    credential, _ = enrol(secret, hostname=node.hostname, address="10.0.0.9")
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_agents", state="reporting") == 1
    NodeCredential.objects.filter(pk=credential.pk).update(heartbeat_lost_at=timezone.now())
    Node.objects.filter(pk=node.pk).update(is_lemon=True)
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_agents", state="silent") == 1
    assert value(found, "myriad_agents", state="reporting") == 0
    dc = node.rack.pod.datacenter.name
    assert value(found, "myriad_lemon_nodes", datacenter=dc) == 1
    assert value(found, "myriad_lemon_nodes") == 1


def test_admission_waits_count_from_the_last_requeue_and_a_long_history_is_read_in_batches(
    queues, monkeypatch
):
    """The first scrape of a process catches up on every event so far, a batch at a time; a job's
    second admission waited from its requeue, not from its submission (the wait the cycle recorded
    in the admitted event, scheduling.apply); an admitted event older than that record counts from
    the job's submission, as the queue history does."""
    from datetime import timedelta

    from scheduling.apply import _waits
    from scheduling.models import JobEvent, Queue

    t0 = timezone.now() - timedelta(hours=2)
    queue = Queue.objects.get(name="vision")
    for i in range(3):  # each: submitted, admitted after 100 s, requeued, admitted again 30 s later
        job = Job.objects.create(queue=queue, gpus=8, submitted_at=t0 + timedelta(minutes=i))
        for kind, after in (("admitted", 100), ("requeued", 900), ("admitted", 930)):
            at = job.submitted_at + timedelta(seconds=after)
            data = {"wait_s": _waits([job.pk], at)[job.pk]} if kind == "admitted" else {}
            JobEvent.objects.create(job=job, kind=kind, at=at, reason="test", data=data)
    old = Job.objects.create(queue=queue, gpus=8, submitted_at=t0)
    JobEvent.objects.create(job=old, kind="admitted", at=t0 + timedelta(seconds=50), reason="before wait_s")
    monkeypatch.setattr(metrics._Totals, "BATCH", 2)
    metrics.reset_totals()
    found = samples(body(scrape("/metrics")))
    assert value(found, "myriad_admitted_jobs_total", queue="vision") == 7
    assert value(found, "myriad_admission_wait_seconds_count", queue="vision") == 7
    assert value(found, "myriad_admission_wait_seconds_sum", queue="vision") == pytest.approx(
        3 * (100 + 30) + 50
    )
