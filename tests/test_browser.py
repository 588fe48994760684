"""Browser tests: Playwright driving Debian's Chromium against a whole running stack (ASGI server,
Celery worker and beat, simulated fleet) on the demo cluster. Each page is saved as a screenshot
under MYRIAD_SCREENSHOT_DIR (default var/screenshots)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from myriad_agent import fake_sysfs
from myriad_agent.network import NetSampler
from myriad_agent.nics import discover
from tests.browser_stack import CHROMIUM, CHROMIUM_ARGS, PASSWORDS, ROOT, start_stack

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's Chromium at {CHROMIUM}")

SHOTS = Path(os.environ.get("MYRIAD_SCREENSHOT_DIR", ROOT / "var" / "screenshots"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("browser-stack"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _page(browser, stack, role: str):
    context = browser.new_context(base_url=stack.url, viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto("/accounts/login/")
    page.fill("#id_username", role)
    page.fill("#id_password", PASSWORDS[role])
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    return page


def _api(page, stack, path: str, method: str = "get", role: str = "operator", **body):
    headers = {"Authorization": f"Token {stack.tokens[role]}"}
    if method == "get":
        r = page.request.get(stack.url + path, headers=headers)
    else:
        r = page.request.post(stack.url + path, headers=headers, data=body)
    assert r.ok, f"{method} {path}: {r.status} {r.text()}"
    return r.json()


def _running_job(page, stack, **fields) -> dict:
    """An 8-GPU H100 job submitted as the operator, once it runs."""
    body = {"queue": "pretrain", "gpus": 8, "chip_types": ["H100-SXM"], **fields}
    job = _api(page, stack, "/api/v1/jobs/", method="post", **body)
    deadline = time.monotonic() + 30
    while _api(page, stack, f"/api/v1/jobs/{job['id']}/", role="viewer")["state"] != "running":
        assert time.monotonic() < deadline, f"job {job['id']} did not start"
        time.sleep(0.5)
    return job


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_anonymous_visitors_are_sent_to_the_login(browser, stack):
    page = browser.new_context(base_url=stack.url).new_page()
    for url in ("/overview/", "/live/", "/queues/", "/faults/"):
        page.goto(url)
        assert "/accounts/login/" in page.url
    _shot(page, "login")
    page.context.close()


def test_every_page_renders_without_script_errors(browser, stack):
    page = _page(browser, stack, "operator")
    node = _api(page, stack, "/api/v1/nodes/?is_spare=false&page_size=1")["results"][0]["hostname"]
    pages = {
        "overview": "/overview/",
        "topology": "/topology/",
        "faults": "/faults/",
        "jobs": "/jobs/",
        "queues": "/queues/",
        "services": "/services/",
        "policies": "/checkpoint-policies/",
        "simulations": "/simulations/",
        "inventory": "/",
        "node": f"/nodes/{node}/",
        "efficiency": "/efficiency/",
        "usage": "/usage/",
        "queue-history": "/queues/history/",
    }
    for name, url in pages.items():
        r = page.goto(url)
        assert r.status == 200, (url, r.status)
        page.wait_for_load_state("networkidle")
        _shot(page, name)
    assert page.errors == []
    page.context.close()


def test_overview_numbers_match_the_api(browser, stack):
    page = _page(browser, stack, "viewer")
    labels = {
        "free": "free",
        "allocated": "allocated and busy",
        "allocated_idle": "allocated but idle",
        "cordoned": "cordoned or draining",
        "down": "down",
        "repairing": "in repair",
    }

    def read_api():
        api = _api(page, stack, "/api/v1/overview/", role="viewer")
        return {labels[k]: v for k, v in api["counts"].items()}, api["gpus"], api["running_jobs"]

    mismatch = None
    # The fleet ticks every second and jobs arrive and finish: the page is rendered between two API
    # reads, so it must show the state of one of them (a second change in between means: try again).
    for _ in range(20):
        before = read_api()
        page.goto("/overview/")
        after = read_api()
        shown = {
            row.locator("td").nth(0).inner_text(): int(row.locator("td").nth(1).inner_text())
            for row in page.locator("#states tbody tr").all()
        }
        seen = (shown, int(page.locator("#gpus").inner_text()), int(page.locator("#running").inner_text()))
        if seen in (before, after):
            assert sum(shown.values()) == seen[1] == 3072
            break
        mismatch = (seen, before, after)
        time.sleep(0.2)
    else:
        pytest.fail(f"overview page and API disagree: {mismatch}")
    page.context.close()


def test_live_heatmap_shows_one_cell_per_gpu_and_a_table_view(browser, stack):
    page = _page(browser, stack, "viewer")
    page.goto("/live/")
    page.wait_for_function(
        "document.getElementById('status').textContent.startsWith('frame')", timeout=20_000
    )
    cells = page.evaluate(
        "document.getElementById('heat').data[0].z.flat().filter(v => v !== null && v !== undefined).length"
    )
    assert cells == _api(page, stack, "/api/v1/overview/", role="viewer")["gpus"] == 3072
    first = page.locator("#status").inner_text()
    page.wait_for_function(
        f"document.getElementById('status').textContent !== {first!r}", timeout=20_000
    )  # frames keep arriving over the websocket
    page.locator("#rack-table-view summary").focus()
    page.keyboard.press("Enter")  # the table view opens from the keyboard
    page.wait_for_selector("#rack-table tbody tr")
    racks = len(page.evaluate("fetch('/api/v1/telemetry/layout/').then(r => r.json()).then(l => l.racks)"))
    assert page.locator("#rack-table tbody tr").count() == min(100, racks)
    _shot(page, "live")
    assert page.errors == []
    page.context.close()


def test_the_fleet_view_drills_from_the_cluster_to_a_gpu_and_back_by_mouse_and_keyboard(browser, stack):
    page = _page(browser, stack, "viewer")
    pushed = []  # views the server pushed over /ws/levels/

    def watch(ws):
        if ws.url.endswith("/ws/levels/"):
            ws.on("framereceived", lambda payload: pushed.append(payload))

    page.on("websocket", watch)
    page.goto("/live/levels/")

    def at(level: str) -> None:
        page.wait_for_function(
            f"document.getElementById('cells').dataset.level === {level!r}", timeout=20_000
        )

    at("pod")
    top = _api(page, stack, "/api/v1/telemetry/levels/", role="viewer")
    assert page.locator("#cells .cell").count() == len(top["cells"]) == 12  # the demo's pods
    assert sum(c["gpus"] for c in top["cells"]) == 3072
    assert page.locator("#path").inner_text() == "Cluster"
    _shot(page, "fleet-cluster")
    first = page.locator("#status").inner_text()
    page.wait_for_function(f"document.getElementById('status').textContent !== {first!r}", timeout=20_000)
    assert any('"level":"pod"' in str(p) for p in pushed)  # newer frames came over the websocket
    pod = top["cells"][0]
    page.locator("#cells .cell").first.click()  # by mouse
    at("rack")
    assert f"within=pod%3A{pod['id']}" in page.url
    racks = _api(page, stack, f"/api/v1/telemetry/levels/?level=rack&within=pod:{pod['id']}", role="viewer")
    assert page.locator("#cells .cell").count() == len(racks["cells"])
    assert sum(c["gpus"] for c in racks["cells"]) == pod["gpus"]  # the racks add up to their pod
    # inside a pod: its uplink and its eight rail leaves, from the simulated fleet's ports
    page.wait_for_selector("#fabric-view:not([hidden]) #fabric tbody tr")
    fabric = _api(page, stack, f"/api/v1/telemetry/levels/?level=rack&within=pod:{pod['id']}", role="viewer")
    assert page.locator("#fabric tbody tr").count() == len(fabric["fabric"]["links"]) == 1 + 8
    assert page.locator("#fabric tbody tr").nth(1).locator("td").first.inner_text() == "rail 0 leaf"
    _shot(page, "fleet-pod")
    page.locator("#cells .cell").first.focus()
    page.keyboard.press("Enter")  # by keyboard
    at("node")
    _shot(page, "fleet-rack")
    page.locator("#cells .cell").first.focus()
    page.keyboard.press("Enter")
    at("gpu")
    assert page.locator("#cells .cell").count() == 8
    assert (
        page.locator("#path").inner_text().startswith(f"Cluster › {racks['path'][0]['name']} › {pod['name']}")
    )
    _shot(page, "fleet-node")
    page.go_back()  # the browser's back button
    at("node")
    page.keyboard.press("Escape")  # one level up
    at("rack")
    page.locator("#path a", has_text="Cluster").click()  # the path, back to the top
    at("pod")
    page.select_option("#aggregate", "unhealthy")
    page.wait_for_function("location.search.includes('aggregate=unhealthy')")
    page.locator("#table-view summary").focus()
    page.keyboard.press("Enter")
    assert page.locator("#cell-table tbody tr").count() == 12
    _shot(page, "fleet-table")
    page.select_option("#aggregate", "faults")  # faults hour by hour, in the same layout
    page.wait_for_function("document.querySelectorAll('#cells .cell .spark').length === 12")
    assert page.locator("#cells .cell .spark").first.locator("i").count() == 24
    # one box finds a node and jumps to its GPUs
    node = _api(page, stack, "/api/v1/nodes/?is_spare=false&page_size=1", role="viewer")["results"][0]
    page.fill("#find", node["hostname"])
    page.keyboard.press("Enter")
    page.locator("#found a", has_text=f"node: {node['hostname']}").click()
    at("gpu")
    assert f"within=node%3A{node['id']}" in page.url
    # a running job's GPUs are outlined at every level, its summary beside the map
    job = _running_job(page, stack, topology="any", name="overlay-job")
    page.goto(f"/live/levels/?job={job['id']}")
    page.wait_for_selector("#cells .cell.job")
    assert "running" in page.locator("#job-panel").inner_text()
    outlined = page.locator("#cells .cell.job .job-mark").all_inner_texts()
    assert sum(int(t.split(": ")[1].split()[0]) for t in outlined) == 8
    _shot(page, "fleet-job")
    assert page.errors == []
    page.context.close()


def test_an_injected_fault_shows_on_the_fault_view_and_the_node_within_seconds(browser, stack):
    page = _page(browser, stack, "operator")
    node = _api(page, stack, "/api/v1/nodes/?state=ready&is_spare=false&chip_type=H100-SXM&page_size=1")[
        "results"
    ][0]
    gpu = _api(page, stack, f"/api/v1/gpus/?hostname={node['hostname']}&page_size=1")["results"][0]
    _api(page, stack, "/api/v1/faults/", method="post", source="xid", gpu=gpu["id"], xid=79)
    deadline = time.monotonic() + 30
    state = "ready"
    while time.monotonic() < deadline:
        page.goto(f"/nodes/{node['hostname']}/")
        state = page.locator("#node-state").inner_text()
        if state != "ready":
            break
        time.sleep(0.5)
    assert state in ("down", "repairing", "draining", "cordoned"), state
    assert "XID 79" in page.locator("#node-faults").inner_text()
    _shot(page, "node-faulted")
    page.goto("/faults/")
    open_faults = page.locator("#open-faults").inner_text()
    assert node["hostname"] in open_faults and "XID 79" in open_faults
    assert page.locator("#fault-heat .main-svg").count() > 0  # the rack heatmap drew
    _shot(page, "faults-after-injection")
    page.context.close()


def test_an_operator_edits_a_quota_and_a_viewer_cannot(browser, stack):
    op = _page(browser, stack, "operator")
    op.goto("/queues/")
    op.locator("a[aria-label^='Edit queue research']").click()
    nominal = op.locator("input[name='quota-0-nominal']")
    old = int(nominal.input_value())
    nominal.fill(str(old + 8))
    op.fill("input[name='reason']", "browser test grant")
    op.click("#queue-form button[type=submit]")
    op.wait_for_url("**/queues/")
    usage = op.locator("table.usage[data-queue='research'] td.nominal").first.inner_text()
    assert int(usage) == old + 8
    assert "browser test grant" in op.locator("#queue-audit").inner_text()
    # bad input: the form names the field and nothing changes
    op.locator("a[aria-label^='Edit queue research']").click()
    op.fill("input[name='weight']", "0")
    op.click("#queue-form button[type=submit]")
    assert "weight: must be greater than zero" in op.locator("#form-errors").inner_text()
    _shot(op, "queue-edit-error")
    op.context.close()

    viewer = _page(browser, stack, "viewer")
    viewer.goto("/queues/")
    assert viewer.locator("a[aria-label^='Edit queue']").count() == 0
    _shot(viewer, "queues")
    queue_id = _api(viewer, stack, "/api/v1/queues/?name=research", role="viewer")["results"][0]["id"]
    r = viewer.goto(f"/queues/{queue_id}/edit/")
    assert r.status == 403
    viewer.context.close()


def test_a_drain_preview_matches_the_api_and_drains_only_after_confirming(browser, stack):
    page = _page(browser, stack, "operator")
    job = _running_job(page, stack, topology="node", name="drain-victim")
    detail = _api(page, stack, f"/api/v1/jobs/{job['id']}/")
    node = _api(page, stack, f"/api/v1/nodes/?hostname={detail['placement'].split(',')[0]}")["results"][0]
    rack = node["rack"]
    page.goto(f"/live/levels/?level=node&within=rack:{rack}")
    page.wait_for_function("document.getElementById('cells').dataset.level === 'node'", timeout=20_000)
    page.click("#drain-preview")
    page.wait_for_selector("#drain-jobs")
    api = _api(page, stack, f"/api/v1/drain-preview/?within=rack:{rack}")
    rows = page.locator("#drain-jobs tbody tr")
    assert rows.count() == len(api["jobs"]) >= 1
    mine = rows.filter(has_text=f"{job['id']} drain-victim")
    assert "8 / 8" in mine.inner_text()
    assert (
        f"{api['nodes_drainable']} of its {api['nodes']} nodes" in page.locator("#drain-result").inner_text()
    )
    _shot(page, "fleet-drain-preview")
    states = {n["id"]: n["state"] for n in _api(page, stack, f"/api/v1/nodes/?rack={rack}")["results"]}
    assert "draining" not in states.values()  # a preview changes nothing
    page.fill("#drain-reason", "replace the rack's top-of-rack switch")
    posted = lambda r: r.url.endswith("/api/v1/drain-preview/") and r.request.method == "POST"  # noqa: E731
    with page.expect_response(posted) as answer:
        page.click("#drain-confirm")
    done = answer.value.json()
    page.wait_for_function("document.getElementById('drain-result').textContent.startsWith('Draining')")
    after = _api(page, stack, f"/api/v1/nodes/?rack={rack}")["results"]
    drained = {n["hostname"]: n["state"] for n in after if n["hostname"] in done["drained"]}
    assert drained and set(drained.values()) <= {"draining", "drained"}
    assert not set(done["skipped"].values()) & {"ready", "cordoned"}  # only nodes a drain may not take
    for n in after:  # back in service for the tests after this one
        if n["state"] in ("draining", "drained"):
            _api(page, stack, f"/api/v1/nodes/{n['id']}/uncordon/", method="post", reason="test done")
    assert page.errors == []
    page.context.close()


def test_a_nodes_ports_and_recorded_trace_show_on_its_page(browser, stack, tmp_path):
    """A node's agent (its own API calls and its sampler on a fake sysfs tree) enrols with two
    ports; an operator records the node's trace from its page; the trace is charted there."""
    page = _page(browser, stack, "operator")
    node = _api(page, stack, "/api/v1/nodes/?is_spare=false&page_size=1")["results"][-1]
    made = _api(page, stack, "/api/v1/enrolment-tokens/", method="post", node=node["hostname"])
    names = fake_sysfs.build(tmp_path, ib_ports=2)
    sampler = NetSampler(discover(tmp_path), 0.01)
    agent_context = browser.new_context()  # the agent: no operator's session, its own credential
    agent = agent_context.request
    enrolled = agent.post(
        stack.url + "/api/v1/agent/enrol/",
        data={"token": made["token"], "hostname": node["hostname"], "ports": sampler.inventory()},
    )
    assert enrolled.ok, enrolled.text()
    key = {"Authorization": f"Node {enrolled.json()['credential']}"}
    page.goto(f"/nodes/{node['hostname']}/")
    assert page.locator("#node-ports tbody tr").count() == 2
    page.click("#record-trace button")
    page.wait_for_selector("#trace-state:has-text('Trace asked for at')")
    asked = agent.get(stack.url + "/api/v1/agent/assignments/", headers=key).json()["trace"]
    sampler.open()
    fake = fake_sysfs.FakePorts(tmp_path)
    for k in range(601):  # six seconds of a job's steps: 150 ms at line rate in every second
        fake.add_bytes(names[0], int(50e9 * (0.95 if k % 100 < 15 else 0.03) * 0.01), 0)
        sampler.sample(at=time.time() - 6 + k * 0.01)
    fake.close()
    sent = agent.post(
        stack.url + "/api/v1/agent/trace/",
        headers=key,
        data={"asked_at": asked["asked_at"], **sampler.trace(6)},
    )
    assert sent.ok, sent.text()
    page.goto(f"/nodes/{node['hostname']}/")
    page.wait_for_selector("#port-trace[data-windows='600'] .main-svg")
    assert "Trace of 6 s of 10 ms windows" in page.inner_text("#trace-state")
    assert page.locator("#port-trace .scatterlayer .trace").count() == 2  # one line per port
    page.locator("#port-trace").scroll_into_view_if_needed()
    _shot(page, "node-ports-trace")
    assert page.errors == []
    agent_context.close()
    page.context.close()


TWO_CAMPUSES = {
    "regions": [
        {
            "name": "north",
            "datacenters": [
                {
                    "name": name,
                    "pods": [{"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 4, "gpus_per_node": 8}],
                }
                for name in ("bj1", "bj2")
            ],
        }
    ],
    "links": [{"between": ["bj1", "bj2"], "distance_km": 60, "lanes": 8, "lane_gbps": 400}],
}


@pytest.fixture(scope="module")
def sites_stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sites-stack")
    topology = folder / "two-campuses.json"
    topology.write_text(json.dumps(TWO_CAMPUSES))
    s = start_stack(folder, str(topology), extra_env={"MYRIAD_FLEET_ARRIVALS": "0"}, name="sites")
    yield s
    s.stop()


def test_the_fleet_view_shows_the_link_a_spanning_job_crosses_with_its_load_and_lost_lanes(
    browser, sites_stack
):
    stack = sites_stack
    page = _page(browser, stack, "operator")
    # 96 GPUs: neither campus (64 each) holds it, so it spans them over the link
    job = _api(
        page,
        stack,
        "/api/v1/jobs/",
        method="post",
        queue="pretrain",
        gpus=96,
        topology="region",
        model={"preset": "llama3-8b"},
        name="spanning-job",
    )
    deadline = time.monotonic() + 30
    while (detail := _api(page, stack, f"/api/v1/jobs/{job['id']}/", role="viewer"))["state"] != "running":
        assert time.monotonic() < deadline, f"job {job['id']} did not start: {detail['pending_reason']}"
        time.sleep(0.5)
    (link,) = _api(page, stack, "/api/v1/links/", role="viewer")["results"]
    _api(
        page,
        stack,
        f"/api/v1/links/{link['id']}/lanes-lost/",
        method="post",
        lanes_lost=2,
        reason="amplifier",
    )
    page.goto("/live/levels/?level=datacenter")
    page.wait_for_selector("#sites-view:not([hidden]) #sites tbody tr", timeout=20_000)
    row = page.locator("#sites tbody tr").first.locator("td").all_inner_texts()
    assert row[0] == "bj1 <-> bj2" and row[1] == "degraded" and row[2] == "6 of 8 x 400 Gb/s"
    assert "of 2400 Gb/s" in row[3] and row[4] == "1" and row[6] == "amplifier"
    now = _api(page, stack, f"/api/v1/links/{link['id']}/", role="viewer")
    assert now["load_gbps"] > 0 and now["capacity_gbps"] == 2400
    _shot(page, "fleet-sites")
    # the job's page gives its replicas in each datacenter and the slowdown of spanning
    page.goto(f"/jobs/{job['id']}/")
    text = page.locator("body").inner_text()
    assert re.search(r"replicas \d+ in bj1, \d+ in bj2; [\d.]+% slower than in one datacenter", text), text
    assert page.errors == []
    page.context.close()
