"""A real Prometheus (Debian's package) scrapes a running stack with the scrape configuration of
docs/grafana/prometheus.yml, and every expression of the Grafana dashboards in docs/grafana/
returns data through Prometheus' query API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.browser_stack import ROOT, free_port, start_stack, stop_group

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DOCS = ROOT / "docs" / "grafana"
TOKEN = "prometheus-scrape-token-1"

pytestmark = pytest.mark.skipif(
    not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus package (.ci/run installs it)"
)


def _get(url: str, token: str | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def dashboard_expressions() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expression) for every target of every dashboard."""
    out = []
    for path in sorted(DOCS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out


def test_the_dashboards_cover_every_metric_family_the_control_plane_exports():
    exprs = " ".join(e for _, _, e in dashboard_expressions())
    for name in (
        "myriad_pending_jobs",
        "myriad_admitted_jobs_total",
        "myriad_evicted_jobs_total",
        "myriad_admission_wait_seconds_bucket",
        "myriad_cycle_duration_seconds_bucket",
        "myriad_quota_nominal_gpus",
        "myriad_quota_borrowed_gpus",
        "myriad_gpus",
        "myriad_running_jobs",
        "myriad_faults_total",
        "myriad_recovery_seconds_bucket",
        "myriad_ettr_ratio",
        "myriad_live_frame_age_seconds",
        "myriad_celery_queue_length",
        "myriad_fabric_link_utilization",
        "myriad_fabric_link_p99_percent",
        "myriad_fabric_link_cnp_per_second",
        "myriad_fabric_link_congested",
        "myriad_congestion_open",
        "myriad_nic_ports",
        "myriad_link_utilization_ratio",
        "myriad_link_capacity_gbps",
        "myriad_xid_faults_total",
        "myriad_agents",
        "myriad_lemon_nodes",
        "myriad_wasted_gpus",
        "myriad_jobs_below_ettr_goal",
        "myriad_link_state",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        assert name in exprs, name


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    stack = start_stack(
        folder / "stack", "demo", name="prometheus", extra_env={"MYRIAD_METRICS_TOKEN": TOKEN}
    )
    prometheus = None
    try:
        # an XID on a GPU, so the fault panels have something to show
        gpu = _get(f"{stack.url}/api/v1/gpus/?page_size=1", stack.tokens["operator"])["results"][0]
        _post(
            f"{stack.url}/api/v1/faults/",
            stack.tokens["operator"],
            {"gpu": gpu["id"], "source": "xid", "xid": 79},
        )
        (folder / "token").write_text(TOKEN)
        config = (DOCS / "prometheus.yml").read_text()
        address = stack.url.removeprefix("http://")
        config = config.replace("myriad.example:8000", address)
        config = config.replace("/etc/prometheus/myriad-token", str(folder / "token"))
        config = config.replace("scrape_interval: 30s", "scrape_interval: 2s").replace(
            "scrape_timeout: 10s", "scrape_timeout: 2s"
        )
        config = config.replace("evaluation_interval: 30s", "evaluation_interval: 2s")
        (folder / "prometheus.yml").write_text(config)
        (folder / "rules.yml").write_text((ROOT / "docs" / "alerts" / "rules.yml").read_text())
        port = free_port()
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=open(folder / "prometheus.log", "wb"),  # noqa: SIM115 - kept for failures
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        api = f"http://127.0.0.1:{port}/api/v1"

        def query(expr: str) -> list:
            answer = _get(f"{api}/query?" + urllib.parse.urlencode({"query": expr}))
            assert answer["status"] == "success", answer
            return answer["data"]["result"]

        deadline = time.monotonic() + 120
        while True:
            try:
                # five targets, each scraped at least twice and up at its last scrape
                done = query("count_over_time(up[1m]) >= 2 and up == 1")
                if len(done) == 5:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                targets = _get(f"{api}/targets")
                raise AssertionError(f"Prometheus did not scrape every target twice: {targets}")
            time.sleep(1)
        query.api = api
        yield query
    finally:
        if prometheus is not None:
            stop_group(prometheus)
        stack.stop()


@pytest.mark.parametrize("board, panel, expr", dashboard_expressions())
def test_every_dashboard_expression_returns_data(scraped, board, panel, expr):
    node = scraped("DCGM_FI_DEV_GPU_UTIL")[0]["metric"]["Hostname"]
    concrete = expr.replace("$__rate_interval", "30s").replace("$node", node)
    assert scraped(concrete), f"{board} / {panel}: {concrete} returned nothing"


def test_the_alert_rules_load_and_evaluate(scraped):
    deadline = time.monotonic() + 60
    while True:
        groups = _get(f"{scraped.api}/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["health"] == "ok" for r in rules):
            break
        assert time.monotonic() < deadline, f"alert rules not healthy: {rules}"
        time.sleep(1)
    names = {r["name"] for r in rules}
    assert {
        "MyriadFabricLinkCongested",
        "MyriadNicPortFlapping",
        "MyriadNicPortDown",
        "MyriadDatacenterLinkDown",
        "MyriadXidGpuDown",
        "MyriadGpuFellOffBus",
        "MyriadQueueStarving",
        "MyriadCycleOverBudget",
    } <= names
