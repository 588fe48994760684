"""A node's network ports through the agent API (in process): the port list at enrolment and in
reports, summaries kept with the node's newest report and shown by the API, and the reports
refused with the field named and nothing written (a malformed port list, a port the node does
not have, counters going back without a reset)."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from cluster.agents import create_enrolment_token
from cluster.models import AuditRecord, NicPort, Node, NodeCredential
from cluster.snapshot import topology_cache
from monitoring.models import FaultEvent
from monitoring.telemetry import fabric, ingest, netreports
from monitoring.telemetry.livestore import live_store, reset_store
from myriad_agent import fake_sysfs
from myriad_agent.network import NetSampler
from myriad_agent.nics import discover

REPORT = "/api/v1/agent/report/"
LINE_BYTES = 400e9 / 8
PORTS = [
    {"name": "mlx5_0/1", "kind": "ib", "rail": 0, "rate_gbps": 400.0},
    {"name": "mlx5_1/1", "kind": "ib", "rail": 1, "rate_gbps": 400.0},
    {"name": "eth0", "kind": "eth", "rail": 2, "rate_gbps": 100.0},
]


@pytest.fixture(autouse=True)
def clean_reports():
    reset_store()
    ingest.clear_reports()
    live_store().delete(fabric.FABRIC_KEY)
    yield
    ingest.clear_reports()
    live_store().delete(fabric.FABRIC_KEY)  # placement reads it: none outlasts its test


@pytest.fixture
def node(small_cluster):
    return Node.objects.filter(is_spare=False, chip_type__name="H100-SXM").order_by("id").first()


def _enrol(node, anonymous_client, ports=PORTS):
    _, secret = create_enrolment_token(actor="test", node=node)
    body = {"token": secret, "hostname": node.hostname, "gpus": 8, "ports": ports}
    answer = anonymous_client.post("/api/v1/agent/enrol/", body, format="json")
    client = APIClient()
    if answer.status_code == 201:
        client.credentials(HTTP_AUTHORIZATION=f"Node {answer.json()['credential']}")
    return client, answer


def _port(name, xmit_words, **extra):
    return {
        "port": name,
        "state": "active",
        "rate_gbps": 400.0,
        "windows": 500,
        "tx_bytes": 4_000_000,
        "rx_bytes": 2_000_000,
        "util": {"mean": 11.2, "p50": 2.1, "p99": 96.5, "max": 99.0},
        "bursts": 50,
        "cnp_sent_per_s": 12.5,
        "xmit_wait_share": 0.02,
        "counters": {"port_xmit_data": xmit_words, "port_rcv_data": 500_000},
        "flaps": [],
        "reset": False,
        **extra,
    }


def _send(client, seq, ports, capture, **net):
    with capture(execute=True):
        return client.post(REPORT, {"seq": seq, "net": {"ports": ports, **net}}, format="json")


def test_the_port_list_comes_at_enrolment_and_reports_fill_in_each_ports_figures(
    node, anonymous_client, viewer_client, django_capture_on_commit_callbacks
):
    client, answer = _enrol(node, anonymous_client)
    assert answer.status_code == 201, answer.content
    assert list(NicPort.objects.filter(node=node).values_list("name", "kind", "rail")) == [
        ("mlx5_0/1", "ib", 0),
        ("mlx5_1/1", "ib", 1),
        ("eth0", "eth", 2),
    ]
    sent = _send(client, 1, [_port("mlx5_0/1", 1_000_000)], django_capture_on_commit_callbacks)
    assert sent.status_code == 200 and sent.json()["accepted"], sent.content
    shown = viewer_client.get(f"/api/v1/nodes/{node.pk}/ports/").json()
    by_name = {p["name"]: p for p in shown["ports"]}
    assert by_name["mlx5_0/1"]["latest"]["util"]["p99"] == 96.5
    assert by_name["mlx5_0/1"]["latest"]["bursts"] == 50
    assert by_name["mlx5_1/1"]["latest"] is None and by_name["eth0"]["rate_gbps"] == 100.0


def test_a_report_with_a_new_port_list_replaces_the_nodes_ports(
    node, anonymous_client, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    changed = [{"name": "mlx5_0/1", "kind": "ib", "rail": 0, "rate_gbps": 200.0}]  # one NIC left, slower
    sent = _send(client, 1, [_port("mlx5_0/1", 10)], django_capture_on_commit_callbacks, inventory=changed)
    assert sent.status_code == 200 and sent.json()["accepted"], sent.content
    assert list(NicPort.objects.filter(node=node).values_list("name", "rate_gbps")) == [("mlx5_0/1", 200.0)]
    gone = _send(client, 2, [_port("mlx5_1/1", 10)], django_capture_on_commit_callbacks)
    assert gone.status_code == 400 and "no port 'mlx5_1/1'" in gone.json()["net.ports[0].port"][0]


@pytest.mark.parametrize(
    ("ports", "field", "words"),
    [
        ("eth0", "net.ports", "must be a list"),
        ([{"state": "active"}], "net.ports[0].port", "must be the port's name"),
        ([_port("mlx5_9/1", 5)], "net.ports[0].port", "no port 'mlx5_9/1'"),
        ([_port("mlx5_0/1", 5), _port("mlx5_0/1", 6)], "net.ports[1].port", "appears twice"),
        ([_port("mlx5_0/1", 5, util={"p99": 140})], "net.ports[0].util.p99", "outside"),
        (
            [_port("mlx5_0/1", 5, counters={"port_xmit_data": -1})],
            "net.ports[0].counters.port_xmit_data",
            "outside",
        ),
        ([_port("mlx5_0/1", 5, counters={"made_up": 1})], "net.ports[0].counters.made_up", "unknown counter"),
        ([_port("mlx5_0/1", 5, errors={"symbol_error": 1.5})], "net.ports[0].errors.symbol_error", "whole"),
        ([_port("mlx5_0/1", 5, flaps=["soon"])], "net.ports[0].flaps[0]", "must be a number"),
        ([_port("mlx5_0/1", 5, state="sideways")], "net.ports[0].state", "not a port state"),
        ([_port("mlx5_0/1", 5, colour="red")], "net.ports[0].colour", "unknown field"),
    ],
)
def test_a_malformed_port_summary_is_refused_by_field_and_changes_nothing(
    node, anonymous_client, django_capture_on_commit_callbacks, ports, field, words
):
    client, _ = _enrol(node, anonymous_client)
    answer = _send(client, 1, ports, django_capture_on_commit_callbacks)
    assert answer.status_code == 400, answer.content
    assert words in answer.json()[field][0]
    assert NodeCredential.objects.get(node=node).last_seq == 0  # the report was not accepted
    assert ingest.latest_reports([node.pk]) == {}


def test_a_bad_port_list_is_refused_at_enrolment_and_in_a_report(
    node, anonymous_client, django_capture_on_commit_callbacks
):
    bad = [{"name": "mlx5_0/1", "kind": "token-ring", "rail": 0, "rate_gbps": 400}]
    _, refused = _enrol(node, anonymous_client, ports=bad)
    assert refused.status_code == 400 and "ports[0].kind" in refused.json()["ports"][0]
    assert not NodeCredential.objects.filter(node=node).exists()
    built = list(NicPort.objects.filter(node=node).values_list("name", flat=True))
    assert built == [f"mlx5_{r}/1" for r in range(8)]  # the inventory's rail ports, unchanged
    client, _ = _enrol(node, anonymous_client)
    twice = PORTS + [PORTS[0]]
    answer = _send(client, 1, [], django_capture_on_commit_callbacks, inventory=twice)
    assert answer.status_code == 400 and "appears twice" in answer.json()["net.inventory[3].name"][0]
    assert NicPort.objects.filter(node=node).count() == 3


def test_counters_going_back_need_a_reset_flag(node, anonymous_client, django_capture_on_commit_callbacks):
    client, _ = _enrol(node, anonymous_client)
    capture = django_capture_on_commit_callbacks
    assert _send(client, 1, [_port("mlx5_0/1", 1_000_000)], capture).status_code == 200
    back = _send(client, 2, [_port("mlx5_0/1", 400)], capture)
    assert back.status_code == 400
    assert "went back from 1000000 to 400" in back.json()["net.ports[0].counters.port_xmit_data"][0]
    assert NodeCredential.objects.get(node=node).last_seq == 1
    reset = _send(client, 2, [_port("mlx5_0/1", 400, reset=True)], capture)
    assert reset.status_code == 200 and reset.json()["accepted"]
    onward = _send(client, 3, [_port("mlx5_0/1", 900)], capture)
    assert onward.status_code == 200 and onward.json()["accepted"]


def test_a_port_that_keeps_flapping_cordons_its_node(
    node, anonymous_client, eager_celery, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    capture = django_capture_on_commit_callbacks
    t = 1_800_000_000.0
    for seq, flaps in enumerate([[t], [t + 60.0], []], start=1):
        answer = _send(client, seq, [_port("mlx5_1/1", 100 * seq, flaps=flaps)], capture)
        assert answer.status_code == 200 and answer.json()["faults"] == 0
    node.refresh_from_db()
    assert node.state == "ready"  # two flaps in the hour: under the limit of three
    third = _send(client, 4, [_port("mlx5_1/1", 500, flaps=[t + 120.0, t + 120.5])], capture)
    assert third.status_code == 200 and third.json()["faults"] == 1
    fault = FaultEvent.objects.get(node=node)
    assert fault.source == "nic_link_flap" and fault.action == "cordon_node"
    assert "mlx5_1/1 flapped 4 times" in fault.description and fault.data["port"] == "mlx5_1/1"
    node.refresh_from_db()
    assert node.state == "cordoned" and "flapped" in node.state_reason
    # the count starts again: one more flap is not a second fault
    again = _send(client, 5, [_port("mlx5_1/1", 600, flaps=[t + 200.0])], capture)
    assert again.json()["faults"] == 0 and FaultEvent.objects.filter(node=node).count() == 1


def test_flaps_more_than_an_hour_apart_are_not_a_fault(
    node, anonymous_client, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    t = 1_800_000_000.0
    for seq, at in enumerate([t, t + 2000.0, t + 4000.0, t + 6000.0], start=1):
        report = _port("mlx5_0/1", 10 * seq, flaps=[at])
        with django_capture_on_commit_callbacks(execute=True):
            answer = client.post(
                REPORT, {"seq": seq, "sent_at": at + 1, "net": {"ports": [report]}}, format="json"
            )
        assert answer.json()["faults"] == 0
    assert not FaultEvent.objects.exists()


def test_a_port_going_down_takes_the_node_to_repair(
    node, anonymous_client, eager_celery, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    capture = django_capture_on_commit_callbacks
    assert _send(client, 1, [_port("mlx5_0/1", 10)], capture).json()["faults"] == 0
    down = _send(client, 2, [_port("mlx5_0/1", 10, state="down")], capture)
    assert down.json()["faults"] == 1
    fault = FaultEvent.objects.get(node=node)
    assert fault.source == "nic_port_down" and fault.action == "repair_node"
    node.refresh_from_db()
    assert node.state == "down"
    still = _send(client, 3, [_port("mlx5_0/1", 10, state="down")], capture)  # no second fault
    assert still.json()["faults"] == 0 and FaultEvent.objects.count() == 1


def test_an_operator_records_a_nodes_trace_and_the_agent_sends_its_10_ms_windows(
    node, anonymous_client, operator_client, viewer_client, tmp_path, django_capture_on_commit_callbacks
):
    names = fake_sysfs.build(tmp_path, ib_ports=2, eth=1)
    sampler = NetSampler(discover(tmp_path), 0.01)
    client, _ = _enrol(node, anonymous_client, ports=sampler.inventory())
    record = f"/api/v1/nodes/{node.pk}/ports/record/"
    assert viewer_client.post(record, {}, format="json").status_code == 403
    bad = operator_client.post(record, {"seconds": 0}, format="json")
    assert bad.status_code == 400 and "seconds" in bad.json()
    asked = operator_client.post(record, {"seconds": 2}, format="json")
    assert asked.status_code == 202, asked.content
    assert AuditRecord.objects.filter(action="record network trace", object_id=node.pk).exists()
    poll = client.get("/api/v1/agent/assignments/").json()
    assert poll["trace"] == {"asked_at": asked.json()["asked_at"], "seconds": 2}
    # what the agent does on that answer: its sampler's last 2 s, sent to the trace endpoint
    sampler.open()
    fake = fake_sysfs.FakePorts(tmp_path)
    for k in range(300):
        fake.add_bytes(names[0], int(LINE_BYTES * (0.95 if k % 100 < 10 else 0.02) * 0.01), 0)
        sampler.sample(at=1_000_000.0 + k * 0.01)
    fake.close()
    trace = {"asked_at": poll["trace"]["asked_at"], **sampler.trace(poll["trace"]["seconds"])}
    sent = client.post("/api/v1/agent/trace/", trace, format="json")
    assert sent.status_code == 201 and sent.json()["windows"] == 200, sent.content
    shown = viewer_client.get(f"/api/v1/nodes/{node.pk}/ports/trace/").json()
    series = {p["port"]: p for p in shown["ports"]}
    assert max(series["mlx5_0/1"]["tx_util"]) > 90 and max(series["mlx5_1/1"]["tx_util"]) == 0
    ports = viewer_client.get(f"/api/v1/nodes/{node.pk}/ports/").json()
    assert ports["trace_requested"] is None and ports["trace_received_at"] is not None
    assert "trace" not in client.get("/api/v1/agent/assignments/").json()  # answered: not asked again


def test_a_malformed_trace_is_refused_by_field(node, anonymous_client, viewer_client):
    client, _ = _enrol(node, anonymous_client)
    good = {"asked_at": 1.0, "start": 2.0, "interval_ms": 10, "t_ms": [10, 20]}
    cases = [
        ({**good, "ports": [{"port": "mlx5_7/1", "tx_util": [1, 2]}]}, "ports[0].port"),
        ({**good, "ports": [{"port": "mlx5_0/1", "tx_util": [1]}]}, "ports[0].tx_util"),
        ({**good, "ports": [{"port": "mlx5_0/1", "tx_util": [1, 250]}]}, "ports[0].tx_util[1]"),
        ({**good, "ports": [{"port": "mlx5_0/1", "states": [[0, "melted"]]}]}, "ports[0].states[0]"),
        ({**good, "t_ms": "soon", "ports": []}, "t_ms"),
    ]
    for body, field in cases:
        answer = client.post("/api/v1/agent/trace/", body, format="json")
        assert answer.status_code == 400 and field in answer.json(), (field, answer.content)
    assert viewer_client.get(f"/api/v1/nodes/{node.pk}/ports/trace/").status_code == 404


def test_the_node_page_shows_each_ports_figures_and_an_operator_records_a_trace(
    node, anonymous_client, operator, viewer, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    _send(client, 1, [_port("mlx5_0/1", 10, flaps=[1_800_000_000.0])], django_capture_on_commit_callbacks)
    page = Client()
    page.force_login(viewer)
    html = page.get(f"/nodes/{node.hostname}/").content.decode()
    table = html[html.index('id="node-ports"') : html.index("</table>", html.index('id="node-ports"'))]
    assert "mlx5_0/1" in table and "96.5" in table and "eth0" in table and "no report yet" in table
    assert 'value="record_trace"' not in html  # a viewer does not get the button
    assert page.post(f"/nodes/{node.hostname}/", {"action": "record_trace"}).status_code == 403
    page.force_login(operator)
    assert 'value="record_trace"' in page.get(f"/nodes/{node.hostname}/").content.decode()
    done = page.post(f"/nodes/{node.hostname}/", {"action": "record_trace"}, follow=True)
    assert "asked the agent for its last 60 s" in done.content.decode()
    assert "Trace asked for at" in done.content.decode()
    assert client.get("/api/v1/agent/assignments/").json()["trace"]["seconds"] == 60


@override_settings(SIMULATED_FLEET=False)
def test_the_agents_ports_make_the_fabrics_link_loads(
    node, anonymous_client, viewer_client, django_capture_on_commit_callbacks
):
    client, _ = _enrol(node, anonymous_client)
    hot = _port(
        "mlx5_1/1", 10, rail=1, seconds=5.0, util={"mean": 40.0, "p50": 30.0, "p99": 97.0, "max": 99.0}
    )
    calm = _port("mlx5_0/1", 10, rail=0, seconds=5.0, util={"mean": 5.0, "p50": 4.0, "p99": 8.0, "max": 9.0})
    _send(client, 1, [calm, hot], django_capture_on_commit_callbacks)
    assert viewer_client.get("/api/v1/telemetry/fabric/").status_code == 404  # no frame composed yet
    ingest.compose_frame()
    shown = viewer_client.get("/api/v1/telemetry/fabric/").json()
    snap = topology_cache.current()
    ni = list(snap.node_id).index(node.pk)
    pod = int(snap.rack_pod[snap.node_rack[ni]])
    assert shown["source"] == "agents" and shown["ports"] == 2 and shown["rails"] == 8
    assert shown["leaf"]["congested"] == [pod * 8 + 1]  # the rail-1 leaf of the node's pod
    assert shown["leaf"]["p99"][pod * 8 + 1] == 97.0 and shown["leaf"]["p99"][pod * 8] == 8.0
    assert shown["leaf"]["load_gbps"][pod * 8 + 1] == pytest.approx(4_000_000 / 5 * 8 / 1e9, abs=0.01)
    assert shown["congested_pods"] == [pod] and shown["pod_ids"][pod] == node.rack.pod_id


def test_the_strongest_network_evidence_names_its_node(settings):
    settings.FABRIC_CONGESTED_CNP_PER_S = 5000
    quiet = {"port": "mlx5_0/1", "state": "active", "cnp_sent_per_s": 10.0}
    reports = {
        1: {"net": [quiet]},
        2: {"net": [{**quiet, "errors": {"symbol_error": 3}}]},
        3: {"net": [{**quiet, "port": "mlx5_1/1", "cnp_sent_per_s": 12000.0}]},
        4: {"net": [{**quiet, "flaps": [1.0, 2.0]}]},
    }
    assert netreports.evidence([1], reports) is None
    assert netreports.evidence([1, 2, 4], reports) == (2, "port mlx5_0/1 counted errors: symbol_error 3")
    node, text = netreports.evidence([1, 2, 3, 4], reports)
    assert node == 3 and "12,000 CNPs a second" in text
    reports[1]["net"][0] = {**quiet, "state": "down"}
    assert netreports.evidence([1, 2, 3, 4], reports) == (1, "port mlx5_0/1 is down")
    assert netreports.evidence([5], reports) is None  # a node without a report
