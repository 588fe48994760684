"""Real nodes through the agent API (in process): enrolment and credentials, what a node
credential may reach, report checks, telemetry and faults from reports, assignments with the
launch environment, exit codes, failed starts with backoff, heartbeat loss, measured recovery."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from cluster.agents import create_enrolment_token, enrol
from cluster.models import AuditRecord, EnrolmentToken, Node, NodeCredential
from monitoring.models import FaultEvent
from monitoring.telemetry import ingest
from monitoring.telemetry.livestore import live_store, reset_store
from scheduling.cycle import run_cycle
from scheduling.models import Job, JobEvent, JobProcess

REPORT = "/api/v1/agent/report/"
ASSIGNMENTS = "/api/v1/agent/assignments/"


@pytest.fixture(autouse=True)
def clean_reports():
    reset_store()
    ingest.clear_reports()
    yield
    ingest.clear_reports()


def _agent(node: Node) -> tuple[APIClient, NodeCredential]:
    _, secret = create_enrolment_token(actor="test", node=node)
    credential, key = enrol(secret, hostname=node.hostname, address=f"10.0.0.{node.pk}")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    return client, credential


def _report(client, seq: int, capture, **body):
    with capture(execute=True):
        return client.post(REPORT, {"seq": seq, **body}, format="json")


@pytest.fixture
def node(small_cluster):
    return Node.objects.filter(is_spare=False, chip_type__name="H100-SXM").order_by("id").first()


# --- enrolment and credentials ---------------------------------------------------------------


def test_an_operator_makes_a_one_time_token_and_the_agent_trades_it_for_a_credential(
    node, operator_client, anonymous_client
):
    made = operator_client.post("/api/v1/enrolment-tokens/", {"ttl_s": 600}, format="json")
    assert made.status_code == 201, made.content
    secret = made.json()["token"]
    assert not EnrolmentToken.objects.filter(key_hash=secret).exists()  # only its digest is kept
    body = {"token": secret, "hostname": node.hostname, "gpus": 8}
    first = anonymous_client.post("/api/v1/agent/enrol/", body, format="json")
    assert first.status_code == 201 and first.json()["hostname"] == node.hostname
    again = anonymous_client.post("/api/v1/agent/enrol/", body, format="json")
    assert again.status_code == 403 and "was used" in again.json()["token"][0]
    credential = NodeCredential.objects.get(node=node)
    assert credential.key_hash != first.json()["credential"] and credential.revoked_at is None
    listed = operator_client.get("/api/v1/node-credentials/").json()["results"]
    assert [c["node"] for c in listed] == [node.hostname] and "key_hash" not in listed[0]


def test_enrolment_refuses_unknown_hosts_wrong_gpu_counts_and_expired_tokens(small_cluster, anonymous_client):
    _, secret = create_enrolment_token(actor="test")
    url = "/api/v1/agent/enrol/"
    unknown = anonymous_client.post(url, {"token": secret, "hostname": "nowhere-1"}, format="json")
    assert unknown.status_code == 400 and "no node 'nowhere-1'" in unknown.json()["hostname"][0]
    node = Node.objects.filter(chip_type__name="A100-80G").first()  # 4 GPUs in the inventory
    wrong = anonymous_client.post(url, {"token": secret, "hostname": node.hostname, "gpus": 8}, format="json")
    assert wrong.status_code == 400 and "has 8 GPUs" in wrong.json()["gpus"][0]
    token = EnrolmentToken.objects.get()
    token.expires_at = timezone.now() - timedelta(seconds=1)
    token.save()
    late = anonymous_client.post(url, {"token": secret, "hostname": node.hostname}, format="json")
    assert late.status_code == 403 and "expired" in late.json()["token"][0]
    assert not NodeCredential.objects.exists()


def test_the_management_command_prints_a_token_for_one_node(node, capsys):
    call_command("enrolment_token", "--node", node.hostname, "--ttl", "600")
    secret = capsys.readouterr().out.split("enrolment_token=")[1].split()[0]
    credential, _ = enrol(secret, hostname="ignored-because-the-token-names-the-node")
    assert credential.node == node


def test_a_node_credential_reaches_only_its_own_endpoints(node, small_cluster):
    client, _ = _agent(node)
    assert client.get(ASSIGNMENTS).status_code == 200
    for url in (
        "/api/v1/nodes/",
        "/api/v1/jobs/",
        "/api/v1/queues/",
        "/api/v1/faults/",
        "/api/v1/overview/",
        "/api/v1/node-credentials/",
        "/api/v1/enrolment-tokens/",
        f"/api/v1/nodes/{node.pk}/",
    ):
        assert client.get(url).status_code == 403, url
    assert client.post("/api/v1/nodes/", {}, format="json").status_code == 403
    assert client.post(f"/api/v1/nodes/{node.pk}/cordon/", {}, format="json").status_code == 403
    assert client.post("/api/v1/enrolment-tokens/", {}, format="json").status_code == 403


def test_a_revoked_credential_is_refused_at_once_and_audited(
    node, operator_client, django_capture_on_commit_callbacks
):
    client, credential = _agent(node)
    assert _report(client, 1, django_capture_on_commit_callbacks).status_code == 200
    answer = operator_client.post(f"/api/v1/node-credentials/{credential.pk}/revoke/", {"reason": "stolen"})
    assert answer.status_code == 200 and answer.json()["revoked_at"]
    refused = _report(client, 2, django_capture_on_commit_callbacks)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert client.get(ASSIGNMENTS).status_code == 401
    assert AuditRecord.objects.filter(action="revoke", object_name=node.hostname, reason="stolen").exists()


# --- reports ---------------------------------------------------------------------------------


def _gpus(n=8, **extra):
    return [
        {
            "index": i,
            "util": 90,
            "memory_used_mib": 40000,
            "memory_total_mib": 80000,
            "temperature_c": 70,
            "power_w": 350,
            "power_limit_w": 700,
            **extra,
        }
        for i in range(n)
    ]


def test_bad_reports_get_a_clear_4xx_naming_the_problem_and_write_nothing(
    node, django_capture_on_commit_callbacks
):
    client, credential = _agent(node)
    cases = [
        ({"seq": 1, "gpus": [{"index": 8}]}, 400, "gpus[0].index", "outside 0..7"),
        ({"seq": 1, "gpus": [{"index": 0}, {"index": 0}]}, 400, "gpus[1].index", "twice"),
        ({"seq": 1, "gpus": [{"index": 0, "util": "hot"}]}, 400, "gpus[0].util", "number"),
        ({"seq": 1, "xids": [{"gpu": 9, "xid": 79, "at": 1}]}, 400, "xids[0].gpu", "outside"),
        (
            {"seq": 1, "processes": [{"job": 999999, "generation": "ab", "state": "running"}]},
            400,
            "processes[0].job",
            "no job 999999",
        ),
        ({"seq": 1, "node": "someone-else"}, 400, "node", "unknown field"),
        ({"gpus": []}, 400, "seq", "whole number"),
    ]
    for body, code, field, text in cases:
        with django_capture_on_commit_callbacks(execute=True):
            answer = client.post(REPORT, body, format="json")
        assert answer.status_code == code, (body, answer.content)
        assert text in answer.json()[field][0], answer.json()
    with django_capture_on_commit_callbacks(execute=True):
        malformed = client.post(REPORT, b"{not json", content_type="application/json")
    assert malformed.status_code == 400 and "JSON" in json.dumps(malformed.json())
    huge = client.post(REPORT, {"seq": 1, "pad": "x" * 300_000}, format="json")
    assert huge.status_code == 413 and "limit is 262144" in huge.json()["body"][0]
    credential.refresh_from_db()
    assert credential.last_seq == 0 and credential.last_used_at is None
    assert not FaultEvent.objects.exists() and ingest.latest_reports([node.pk]) == {}


def test_readings_reach_the_live_store_and_a_repeated_sequence_number_changes_nothing(
    node, django_capture_on_commit_callbacks
):
    client, credential = _agent(node)
    first = _report(client, 5, django_capture_on_commit_callbacks, gpus=_gpus())
    assert first.json() == {"accepted": True, "seq": 5, "faults": 0}
    stored = ingest.latest_reports([node.pk])[node.pk]
    assert stored["seq"] == 5 and stored["gpus"][3]["util"] == 90
    again = _report(
        client,
        5,
        django_capture_on_commit_callbacks,
        gpus=_gpus(util=10),
        xids=[{"gpu": 0, "xid": 79, "at": 1.0}],
    )
    older = _report(client, 4, django_capture_on_commit_callbacks, gpus=_gpus(util=10))
    assert again.json()["accepted"] is False and older.json()["accepted"] is False
    assert (
        ingest.latest_reports([node.pk])[node.pk]["gpus"][3]["util"] == 90 and not FaultEvent.objects.exists()
    )
    credential.refresh_from_db()
    assert credential.last_seq == 5


def test_the_telemetry_frame_shows_the_agents_readings(node, django_capture_on_commit_callbacks, settings):
    from cluster.snapshot import topology_cache
    from engine.frames import decode_frame
    from monitoring.telemetry.livestore import FRAME_KEY

    settings.SIMULATED_FLEET = False
    client, _ = _agent(node)
    _report(client, 1, django_capture_on_commit_callbacks, gpus=_gpus())
    assert ingest.compose_frame() == 8
    _, _, frame = decode_frame(live_store().get(FRAME_KEY))
    snap = topology_cache.current()
    mine = snap.gpu_node == list(snap.node_id).index(node.pk)
    assert set(frame["util"][mine]) == {90} and set(frame["power"][mine]) == {50}
    assert set(frame["memory"][mine]) == {50} and frame["util"][~mine].max() == 0


def test_xids_and_health_changes_become_faults_handled_by_the_fault_task(
    queues, node, eager_celery, django_capture_on_commit_callbacks
):
    client, _ = _agent(node)
    _report(client, 1, django_capture_on_commit_callbacks, gpus=_gpus(ecc_uncorrected_volatile=0))
    worse = _gpus(ecc_uncorrected_volatile=0)
    worse[2]["ecc_uncorrected_volatile"] = 3
    answer = _report(
        client,
        2,
        django_capture_on_commit_callbacks,
        gpus=worse,
        xids=[{"gpu": 5, "xid": 79, "at": timezone.now().timestamp() - 2}],
    )
    assert answer.json()["faults"] == 2
    xid = FaultEvent.objects.get(source="xid")
    assert xid.gpu.index == 5 and xid.xid == 79 and xid.action == "reboot_node"
    assert 1.5 < (xid.detected_at - xid.at).total_seconds() < 60  # measured: seen at the report
    health = FaultEvent.objects.get(source="health_check")
    assert health.gpu.index == 2 and "rose from 0 to 3" in health.description
    node.refresh_from_db()
    assert node.state == "down"


# --- jobs on real nodes ------------------------------------------------------------------------


@pytest.fixture
def launched(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    """A 16-GPU job with a command, placed on two nodes, both enrolled (cycles the job's end or
    requeue asks for run inline)."""
    answer = operator_client.post(
        "/api/v1/jobs/",
        {
            "queue": "vision",
            "gpus": 16,
            "chip_types": ["H100-SXM"],
            "topology": "pod",
            "command": "python train.py",
            "env": {"LR": "0.1"},
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.state == "running"
    nodes = list(
        Node.objects.filter(gpus__allocations__job=job, gpus__allocations__active=True)
        .distinct()
        .order_by("id")
    )
    assert len(nodes) == 2
    return job, [(n, *_agent(n)) for n in nodes]


def test_the_assignment_carries_the_launch_environment(launched):
    job, agents = launched
    seen = []
    for rank, (_node, client, _) in enumerate(agents):
        answer = client.get(ASSIGNMENTS).json()
        assert [a["job"] for a in answer["assignments"]] == [job.pk]
        a = answer["assignments"][0]
        env = a["env"]
        assert a["command"] == "python train.py" and a["rank"] == rank and a["gpus"] == list(range(8))
        assert env["MASTER_ADDR"] == f"10.0.0.{agents[0][0].pk}" and env["WORLD_SIZE"] == "16"
        assert env["NNODES"] == "2" and env["NODE_RANK"] == env["RANK"] == str(rank)
        assert env["LOCAL_WORLD_SIZE"] == "8" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert env["MYRIAD_JOB_ID"] == str(job.pk) and env["LR"] == "0.1"
        seen.append((a["generation"], env["MASTER_PORT"]))
    assert seen[0] == seen[1]


def test_a_job_may_not_override_the_launch_variables(queues, operator_client):
    answer = operator_client.post(
        "/api/v1/jobs/",
        {"queue": "vision", "gpus": 8, "command": "x", "env": {"WORLD_SIZE": "2"}},
        format="json",
    )
    assert answer.status_code == 400 and "set by the platform" in answer.json()["env"][0]
    assert not Job.objects.exists()


def _process(job, generation, state, **extra):
    return {"job": job.pk, "generation": generation, "state": state, **extra}


def test_every_rank_running_launches_the_job_and_exit_codes_end_it(
    launched, django_capture_on_commit_callbacks
):
    job, agents = launched
    generation = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]["generation"]
    (_, first, _), (_, second, _) = agents
    _report(
        first, 1, django_capture_on_commit_callbacks, processes=[_process(job, generation, "running", pid=10)]
    )
    job.refresh_from_db()
    assert job.launched_generation == ""  # one node of two
    _report(
        second,
        1,
        django_capture_on_commit_callbacks,
        processes=[_process(job, generation, "running", pid=11)],
    )
    job.refresh_from_db()
    assert job.launched_generation == generation
    assert JobEvent.objects.filter(job=job, kind="launched").count() == 1
    _report(
        first,
        2,
        django_capture_on_commit_callbacks,
        processes=[_process(job, generation, "exited", exit_code=0, log_tail="done\n")],
    )
    job.refresh_from_db()
    assert job.state == "running"  # the other rank still runs
    _report(
        second,
        2,
        django_capture_on_commit_callbacks,
        processes=[_process(job, generation, "exited", exit_code=0)],
    )
    job.refresh_from_db()
    assert job.state == "finished" and not job.allocations.filter(active=True).exists()
    assert first.get(ASSIGNMENTS).json()["assignments"] == []


def test_a_non_zero_exit_fails_the_job_with_the_code_and_the_last_lines(
    launched, operator_client, django_capture_on_commit_callbacks
):
    job, agents = launched
    generation = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]["generation"]
    tail = "".join(f"step {i}\n" for i in range(50)) + "CUDA error: out of memory\n"
    _report(
        agents[1][1],
        1,
        django_capture_on_commit_callbacks,
        processes=[_process(job, generation, "exited", exit_code=3, log_tail=tail)],
    )
    job.refresh_from_db()
    assert job.state == "failed"
    failed = JobEvent.objects.get(job=job, kind="failed")
    assert f"exit code 3 on {agents[1][0].hostname} (rank 1)" in failed.reason
    assert failed.reason.endswith("CUDA error: out of memory") and "step 10\n" not in failed.reason
    detail = operator_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["processes"][0]["exit_code"] == 3 and detail["processes"][0]["log_tail"] == tail


def test_a_start_that_misses_a_node_is_requeued_with_backoff_naming_the_node(
    launched, settings, django_capture_on_commit_callbacks
):
    job, agents = launched
    generation = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]["generation"]
    _report(
        agents[0][1], 1, django_capture_on_commit_callbacks, processes=[_process(job, generation, "running")]
    )
    late = timezone.now() + timedelta(seconds=settings.LAUNCH_READY_TIMEOUT_S + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert ingest.launch.check_launches(late) == [job.pk]
    job.refresh_from_db()
    assert job.state == "pending" and job.start_failures == 1
    assert abs((job.requeue_at - late).total_seconds() - 60) < 1
    event = JobEvent.objects.filter(job=job, kind="requeued").latest("at")
    assert (
        event.data["nodes_not_started"] == [agents[1][0].hostname] and agents[1][0].hostname in event.reason
    )
    assert agents[0][1].get(ASSIGNMENTS).json()["assignments"] == []  # stopped everywhere
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=late + timedelta(seconds=30))
    job.refresh_from_db()
    assert job.state == "pending"  # still backing off
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=late + timedelta(seconds=61))
    job.refresh_from_db()
    assert job.state == "running"
    assert ingest.launch.backoff_s(2) == 120 and ingest.launch.backoff_s(20) == 3600


def test_a_silent_node_gets_a_heartbeat_loss_fault_once(
    node, eager_celery, django_capture_on_commit_callbacks, settings, monkeypatch
):
    client, credential = _agent(node)
    _report(client, 1, django_capture_on_commit_callbacks)
    later = timezone.now() + timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S + 5)
    monkeypatch.setattr(ingest, "_UP_SINCE", timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert ingest.watch(later)["heartbeat_lost"] == [node.hostname]
        assert ingest.watch(later + timedelta(seconds=10))["heartbeat_lost"] == []
    fault = FaultEvent.objects.get(source="heartbeat_loss")
    assert fault.node == node and fault.action == "reboot_node"
    node.refresh_from_db()
    assert node.state == "down"
    _report(client, 2, django_capture_on_commit_callbacks)  # back: the next loss counts again
    credential.refresh_from_db()
    assert credential.heartbeat_lost_at is None


def test_the_control_plane_does_not_blame_nodes_for_its_own_outage(
    node, settings, monkeypatch, django_capture_on_commit_callbacks
):
    client, _ = _agent(node)
    _report(client, 1, django_capture_on_commit_callbacks)
    later = timezone.now() + timedelta(seconds=settings.AGENT_HEARTBEAT_TIMEOUT_S + 5)
    monkeypatch.setattr(ingest, "_UP_SINCE", later - timedelta(seconds=2))  # it just came back
    assert ingest.watch(later)["heartbeat_lost"] == []


def test_a_node_reports_checkpoints_only_for_jobs_on_it(launched, small_cluster):
    job, agents = launched
    body = {"step": 100, "progress_s": 600.0, "kind": "async"}
    assert agents[0][1].post(f"/api/v1/jobs/{job.pk}/checkpoints/", body, format="json").status_code == 201
    other = Node.objects.exclude(pk__in=[n.pk for n, _, _ in agents]).filter(is_spare=False).first()
    outsider, _ = _agent(other)
    assert outsider.post(f"/api/v1/jobs/{job.pk}/checkpoints/", body, format="json").status_code == 403
    job.refresh_from_db()
    assert job.progress_s == 600.0


def test_an_operator_asks_a_running_job_to_save(launched, operator_client):
    job, agents = launched
    answer = operator_client.post(f"/api/v1/jobs/{job.pk}/request-checkpoint/", {"reason": "upgrade"})
    assert answer.status_code == 200
    asked = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]["checkpoint_requested_at"]
    assert asked and abs(asked - timezone.now().timestamp()) < 60


def test_a_faulted_job_on_real_nodes_gets_its_recovery_measured(
    launched, eager_celery, django_capture_on_commit_callbacks
):
    job, agents = launched
    generation = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]["generation"]
    for seq, (_, client, _) in enumerate(agents, start=1):
        _report(
            client, seq, django_capture_on_commit_callbacks, processes=[_process(job, generation, "running")]
        )
    broken = agents[1][0]
    _report(
        agents[1][1],
        5,
        django_capture_on_commit_callbacks,
        xids=[{"gpu": 0, "xid": 79, "at": timezone.now().timestamp() - 1}],
    )
    fault = FaultEvent.objects.get(source="xid")
    assert fault.job == job and fault.recovery_s is None  # not modelled: measured when it runs again
    assert not JobEvent.objects.filter(job=job, kind="recovered").exists()
    moved = agents[0][1].get(ASSIGNMENTS).json()["assignments"][0]
    assert moved["generation"] != generation  # a new placement: the agents restart it
    _report(
        agents[0][1],
        10,
        django_capture_on_commit_callbacks,
        processes=[_process(job, generation, "exited", exit_code=-15, ended_at=timezone.now().timestamp())],
    )
    job.refresh_from_db()
    assert job.state == "running"  # an old placement's exit ends nothing
    new_nodes = Node.objects.filter(gpus__allocations__job=job, gpus__allocations__active=True).distinct()
    assert broken not in new_nodes
    clients = {n.pk: c for n, c, _ in agents}
    for n in new_nodes:
        client = clients.get(n.pk) or _agent(n)[0]
        _report(
            client,
            20,
            django_capture_on_commit_callbacks,
            processes=[_process(job, moved["generation"], "running")],
        )
    fault.refresh_from_db()
    steps = fault.data["measured"]
    assert fault.recovery_s == steps["running_s"] > 0 and steps["processes_stopped_s"] is not None
    assert steps["detected_s"] <= steps["placed_s"] <= steps["running_s"]
    recovered = JobEvent.objects.get(job=job, kind="recovered")
    assert recovered.data["measured"] is True and recovered.data["restart_s"] >= 0
    assert JobProcess.objects.filter(job=job).count() == 4  # two nodes, two placements


# --- per-rank progress --------------------------------------------------------------------------


def test_progress_rides_with_the_readings_and_bad_progress_names_its_field(
    node, django_capture_on_commit_callbacks
):
    client, _ = _agent(node)
    good = {"job": 7, "generation": "abc", "step": 12, "step_at": 1.7e9, "recent": [1.0, 1.1]}
    r = _report(client, 1, django_capture_on_commit_callbacks, progress=[good], sent_at=1.7e9)
    assert r.status_code == 200 and r.json()["accepted"]
    entry = ingest.latest_reports([node.pk])[node.pk]
    assert entry["progress"][0]["step"] == 12 and entry["sent_at"] == 1.7e9
    for bad, field in (
        ({**good, "step": -1}, "progress[0].step"),
        ({**good, "generation": ""}, "progress[0].generation"),
        ({**good, "recent": [1.0] * 17}, "progress[0].recent"),
        ({**good, "recent": ["fast"]}, "progress[0].recent[0]"),
    ):
        r = _report(client, 2, django_capture_on_commit_callbacks, progress=[bad])
        assert r.status_code == 400 and field in r.json(), (field, r.json())
    assert ingest.latest_reports([node.pk])[node.pk]["seq"] == 1  # nothing refused was kept
