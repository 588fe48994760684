"""The operator's pages: overview over time, topology drill-down, node page and its actions,
faults, queues with edits and an audit record, checkpoint policies, simulations, job detail."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cluster.models import AuditRecord, Node, Rack
from monitoring.models import ClusterSample, FaultEvent, Simulation
from scheduling.models import CheckpointPolicy, Job, QueueQuota


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


PAGES = [
    "/overview/",
    "/topology/",
    "/live/",
    "/faults/",
    "/jobs/",
    "/queues/",
    "/checkpoint-policies/",
    "/simulations/",
]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_needs_a_login_and_a_role(queues, outsider, viewer, url):
    assert Client().get(url).status_code == 302
    assert _client(outsider).get(url).status_code == 403
    assert _client(viewer).get(url).status_code == 200


def _run_job(client, django_capture_on_commit_callbacks, gpus=16, queue="vision"):
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(
            "/api/v1/jobs/",
            {"queue": queue, "gpus": gpus, "chip_types": ["H100-SXM"], "topology": "pod", "name": "train"},
            format="json",
        )
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


def test_overview_samples_chart_over_time_and_agree_with_the_api(
    queues, viewer, viewer_client, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    from monitoring.tasks import sample_cluster
    from monitoring.telemetry.overview import take_sample

    now = timezone.now()
    take_sample(now - timedelta(hours=3))
    job = _run_job(operator_client, django_capture_on_commit_callbacks)
    assert job.state == "running"
    sample_cluster()
    week = viewer_client.get("/api/v1/overview/history/", {"window": "week"}).json()
    assert len(week["at"]) == 2
    assert week["allocated"][0] == 0 and week["allocated"][-1] + week["allocated_idle"][-1] == 16
    assert week["running_jobs"] == [0, 1]
    hour = viewer_client.get("/api/v1/overview/history/", {"window": "hour"}).json()
    assert len(hour["at"]) == 1  # the older sample is outside the last hour
    bad = viewer_client.get("/api/v1/overview/history/", {"window": "year"})
    assert bad.status_code == 400 and "window" in bad.json()
    s = ClusterSample.objects.latest("at")
    assert s.free + s.allocated + s.allocated_idle + s.cordoned + s.down + s.repairing == s.gpus == 76
    api = viewer_client.get("/api/v1/overview/").json()
    assert [q["name"] for q in api["queues"] if q["running"]] == ["vision"]
    page = _client(viewer).get("/overview/").content.decode()
    assert f'<span class="num" id="running">{api["running_jobs"]}</span>' in page
    assert "ETTR, last 24 h" in page and 'id="queue-health"' in page


def test_topology_drills_down_to_a_node_with_counts_by_state(queues, viewer, operator):
    node = Node.objects.filter(chip_type__name="H100-SXM").order_by("id").first()
    Node.objects.filter(pk=node.pk).update(state="down", state_reason="XID 79: fell off the bus")
    client = _client(viewer)
    top = client.get("/topology/").content.decode()
    assert "north / dc1" in top and "north / dc2" in top
    assert "<td>north</td><td>2</td><td>76</td><td>0</td>" in top  # the region line
    dc = node.rack.pod.datacenter
    pod_page = client.get(f"/topology/datacenter/{dc.pk}/").content.decode()
    assert node.rack.pod.name in pod_page
    rack_page = client.get(f"/topology/pod/{node.rack.pod.pk}/").content.decode()
    assert f"/topology/rack/{node.rack.pk}/" in rack_page
    nodes_page = client.get(f"/topology/rack/{node.rack.pk}/").content.decode()
    assert node.hostname in nodes_page and "XID 79: fell off the bus" in nodes_page
    assert client.get("/topology/shelf/1/").status_code == 404
    node_page = client.get(f"/nodes/{node.hostname}/").content.decode()
    assert "Why down:" in node_page and 'id="node-actions"' not in node_page  # viewers get no actions
    assert (
        'name="action" value="repair"' in _client(operator).get(f"/nodes/{node.hostname}/").content.decode()
    )


def test_operator_cordons_a_node_from_its_page_and_the_audit_records_it(queues, viewer, operator):
    node = Node.objects.filter(chip_type__name="H100-SXM", is_spare=False).order_by("id").first()
    assert _client(viewer).post(f"/nodes/{node.hostname}/", {"action": "cordon"}).status_code == 403
    node.refresh_from_db()
    assert node.state == "ready"
    client = _client(operator)
    r = client.post(f"/nodes/{node.hostname}/", {"action": "cordon", "reason": "fan noise"}, follow=True)
    node.refresh_from_db()
    assert node.state == "cordoned"
    page = r.content.decode()
    assert "Why cordoned:" in page and "fan noise" in page and "ready → cordoned" in page
    rec = AuditRecord.objects.get(object_type="node", object_id=node.pk)
    assert rec.actor == operator.username and rec.changes == {"state": ["ready", "cordoned"]}
    again = client.post(f"/nodes/{node.hostname}/", {"action": "cordon"}, follow=True).content.decode()
    assert "cannot cordon a node that is cordoned" in again
    assert AuditRecord.objects.filter(object_type="node").count() == 1


def test_faults_page_shows_racks_over_time_lemons_and_open_faults(
    queues, viewer, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    job = _run_job(operator_client, django_capture_on_commit_callbacks)
    gpu = job.gpus_held.filter(active=True).select_related("gpu__node__rack").first().gpu
    with django_capture_on_commit_callbacks(execute=True):
        r = operator_client.post(
            "/api/v1/faults/",
            {"source": "xid", "gpu": gpu.pk, "xid": 79},
            format="json",
        )
    assert r.status_code == 201, r.content
    Node.objects.filter(pk=gpu.node_id).update(is_lemon=True)
    page = _client(viewer).get("/faults/").content.decode()
    assert "1 faults in the last week" in page
    fault = FaultEvent.objects.get()
    assert f'cause={fault.cause}">{fault.cause}</a></td><td>1</td>' in page  # by cause
    rack = gpu.node.rack
    label = f"{rack.pod.datacenter.name}-{rack.pod.name}/{rack.name}"
    assert f'<td><a href="/topology/rack/{rack.pk}/">{label}</a></td><td>1</td>' in page
    assert "XID 79" in page and f">{job.pk} train</a>" in page  # the open fault names the job it hit
    assert (
        f'<a href="/nodes/{gpu.node.hostname}/">{gpu.node.hostname}</a></td><td>{gpu.node.rack.name}' in page
    )
    day = _client(viewer).get("/faults/", {"window": "day", "cause": "no-such-cause"}).content.decode()
    assert "0 faults (no-such-cause)" in day


def test_operator_edits_a_queue_quota_and_the_queue_page_shows_it(queues, viewer, operator):
    vision = queues["vision"]
    form = {
        "description": "",
        "priority": "5",
        "weight": "2",
        "reclaim_within_cohort": "never",
        "within_queue": "never",
        "quota_rows": "2",
        "quota-0-chip_type": "H100-SXM",
        "quota-0-nominal": "48",
        "quota-0-borrowing_limit": "",
        "quota-0-lending_limit": "8",
        "quota-1-chip_type": "",
        "reason": "new grant",
    }
    assert _client(viewer).post(f"/queues/{vision.pk}/edit/", form).status_code == 403
    assert _client(viewer).get(f"/queues/{vision.pk}/edit/").status_code == 403
    assert QueueQuota.objects.get(queue=vision).nominal == 32
    client = _client(operator)
    page = client.post(f"/queues/{vision.pk}/edit/", form, follow=True).content.decode()
    quota = QueueQuota.objects.get(queue=vision)
    assert (quota.nominal, quota.lending_limit) == (48, 8)
    assert (
        '<td class="nominal">48</td>' in page and "H100-SXM.nominal: 32 → 48" in page and "new grant" in page
    )
    rec = AuditRecord.objects.get(object_type="queue")
    assert rec.actor == operator.username and rec.changes["priority"] == [0, 5]
    # bad input names the field and changes nothing
    bad = client.post(f"/queues/{vision.pk}/edit/", {**form, "quota-0-lending_limit": "99", "weight": "0"})
    text = bad.content.decode()
    assert bad.status_code == 200 and "Nothing was saved" in text
    assert (
        "lending_limit: cannot be more than nominal" in text and "weight: must be greater than zero" in text
    )
    assert QueueQuota.objects.get(queue=vision).lending_limit == 8
    assert AuditRecord.objects.filter(object_type="queue").count() == 1


def test_queue_changes_by_api_are_audited_too(queues, operator_client):
    r = operator_client.patch(f"/api/v1/queues/{queues['nlp'].pk}/", {"priority": 9}, format="json")
    assert r.status_code == 200
    operator_client.post(f"/api/v1/queues/{queues['nlp'].pk}/stop/")
    actions = list(
        AuditRecord.objects.filter(object_type="queue").order_by("at", "id").values_list("action", "changes")
    )
    assert actions == [("update", {"priority": [0, 9]}), ("stop", {"stopped": [False, True]})]


def test_checkpoint_policies_page_shows_recommended_next_to_chosen_and_edits(queues, viewer, operator):
    policy = CheckpointPolicy.objects.create(name="hourly", kind="periodic", interval_s=3600)
    page = _client(viewer).get("/checkpoint-policies/").content.decode()
    assert '<td class="chosen">3600 s</td>' in page and "recommended" in page
    assert "/checkpoint-policies/new/" not in page
    client = _client(operator)
    bad = client.post(
        "/checkpoint-policies/new/",
        {"name": "x", "kind": "async", "interval_s": "-5", "triggered_success": "0.9"},
    )
    assert "interval_s: must be greater than zero" in bad.content.decode()
    assert not CheckpointPolicy.objects.filter(name="x").exists()
    client.post(
        f"/checkpoint-policies/{policy.pk}/edit/",
        {"name": "hourly", "kind": "periodic", "interval_s": "1800", "triggered_success": "0.95"},
    )
    policy.refresh_from_db()
    assert policy.interval_s == 1800
    rec = AuditRecord.objects.get(object_type="checkpoint policy")
    assert rec.changes == {"interval_s": [3600.0, 1800.0]}


def test_simulations_page_starts_a_run_and_shows_its_progress(queues, viewer, operator, monkeypatch):
    started = []
    monkeypatch.setattr("monitoring.tasks.run_simulation_task.delay", lambda pk: started.append(pk))
    client = _client(operator)
    bad = client.post("/simulations/", {"cluster": "nowhere", "days": "7", "seed": "0"})
    assert "cluster: unknown cluster" in bad.content.decode() and not Simulation.objects.exists()
    r = client.post("/simulations/", {"name": "what if", "cluster": "demo", "days": "1", "seed": "3"})
    sim = Simulation.objects.get()
    assert r.status_code == 302 and r.url == f"/simulations/{sim.pk}/"
    assert sim.created_by == operator.username and (sim.days, sim.seed) == (1.0, 3)
    listing = _client(viewer).get("/simulations/").content.decode()
    assert "what if" in listing and 'id="simulation-form"' not in listing  # viewers cannot start one
    assert "queued" in _client(viewer).get(f"/simulations/{sim.pk}/").content.decode()


def test_job_page_shows_timeline_placement_and_lets_operators_suspend(
    queues, viewer, operator, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    job = _run_job(operator_client, django_capture_on_commit_callbacks)
    rack = Rack.objects.get(pk=job.gpus_held.filter(active=True).first().gpu.node.rack_id)
    page = _client(viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert '"state": "pending"' in page and '"state": "running"' in page  # timeline segments
    assert f'<a href="/topology/rack/{rack.pk}/">{rack.name}</a></td><td>16</td>' in page
    assert 'id="job-actions"' not in page
    assert _client(viewer).post(f"/jobs/{job.pk}/", {"action": "suspend"}).status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        _client(operator).post(f"/jobs/{job.pk}/", {"action": "suspend", "reason": "maintenance"})
    job.refresh_from_db()
    assert job.state == "suspended" and job.allocated_gpus == 0
    assert 'value="resume"' in _client(operator).get(f"/jobs/{job.pk}/").content.decode()


def test_the_node_page_shows_what_a_drain_or_a_mark_down_would_hit_before_either(
    queues, viewer, operator, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    job = _run_job(operator_client, django_capture_on_commit_callbacks)
    node = job.gpus_held.filter(active=True).select_related("gpu__node").first().gpu.node
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=1200))
    page = _client(operator).get(f"/nodes/{node.hostname}/").content.decode()
    assert 'id="node-impact"' in page and f"{job.pk} " in page
    row = page.split('id="node-impact"')[1].split("</table>")[0]
    assert "Lost if marked down" in row and "Where it would go" in row
    assert "1200 s" in row or "1201 s" in row  # the work since it started, lost by a mark-down
    assert 'id="node-impact"' not in _client(viewer).get(f"/nodes/{node.hostname}/").content.decode()
