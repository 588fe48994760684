"""docs/alerts as an operator installs it: every rule loads, has a severity an Alertmanager routes
on, and a promtool unit test that shows it firing and silent; the unit tests pass (and fail when an
expectation is wrong); the example Alertmanager configuration routes by severity and queue.
Debian's prometheus package ships promtool, prometheus-alertmanager amtool (.ci/run installs both);
the metrics the rules read are tested in test_metrics and, scraped by a real Prometheus, in
test_prometheus."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ALERTS = Path(__file__).resolve().parent.parent / "docs" / "alerts"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="needs promtool (.ci/run)")
needs_amtool = pytest.mark.skipif(not Path(AMTOOL).exists(), reason="needs amtool (.ci/run)")

PAGED_FOR = {  # what the operator is paged for, and the alert that says it
    "an XID that takes a GPU down": "MyriadXidGpuDown",
    "a GPU fallen off the bus": "MyriadGpuFellOffBus",
    "an agent silent": "MyriadAgentSilent",
    "a node quarantined as a lemon": "MyriadLemonNode",
    "a queue starving": "MyriadQueueStarving",
    "a running job below its ETTR goal": "MyriadJobBelowEttrGoal",
    "wasted GPUs": "MyriadWastedGpus",
    "a cycle slower than its budget": "MyriadCycleOverBudget",
    "the live frame stale": "MyriadLiveFrameStale",
}


def _rules() -> list[dict]:
    groups = yaml.safe_load((ALERTS / "rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _cases() -> list[dict]:
    tests = yaml.safe_load((ALERTS / "rules.test.yml").read_text())["tests"]
    return [case for test in tests for case in test["alert_rule_test"]]


def test_every_rule_has_a_severity_and_a_summary_and_what_operators_are_paged_for_is_there():
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "an alert name is used twice"
    assert set(PAGED_FOR.values()) <= set(names)
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_every_rule_has_a_unit_test_that_shows_it_firing_and_one_that_shows_it_silent():
    fired: dict[str, int] = {}
    silent: dict[str, int] = {}
    for case in _cases():
        into = fired if case.get("exp_alerts") else silent
        into[case["alertname"]] = into.get(case["alertname"], 0) + 1
    for name in (r["alert"] for r in _rules()):
        assert fired.get(name), f"{name} is never shown firing"
        assert silent.get(name), f"{name} is never shown silent"


@needs_promtool
def test_the_rules_check_and_their_unit_tests_pass():
    check = subprocess.run(
        [PROMTOOL, "check", "rules", "rules.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in check.stdout
    run = subprocess.run(
        [PROMTOOL, "test", "rules", "rules.test.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_a_wrong_expectation_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: the XID alert expected without its meaning is caught."""
    shutil.copy(ALERTS / "rules.yml", tmp_path / "rules.yml")
    text = (ALERTS / "rules.test.yml").read_text()
    wrong = text.replace(
        'summary: "XID 95 (uncontained ECC error): reset_gpu"', 'summary: "XID 95: reset_gpu"'
    )
    assert wrong != text
    (tmp_path / "rules.test.yml").write_text(wrong)
    run = subprocess.run(
        [PROMTOOL, "test", "rules", "rules.test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "MyriadXidGpuDown" in run.stdout + run.stderr


def _route(*labels: str) -> str:
    run = subprocess.run(
        [AMTOOL, "config", "routes", "test", "--config.file=alertmanager.yml", *labels],
        cwd=ALERTS,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.strip()


@needs_amtool
def test_the_alertmanager_example_routes_by_severity_and_queue():
    check = subprocess.run(
        [AMTOOL, "check-config", "alertmanager.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # critical pages the one on call, whatever the queue
    assert _route("alertname=MyriadGpuFellOffBus", "severity=critical") == "operator-on-call"
    assert _route("alertname=MyriadLiveFrameStale", "severity=critical", "queue=vision") == "operator-on-call"
    # a queue's warnings go to the team that owns it; other queues to the queues' owners
    assert _route("alertname=MyriadWastedGpus", "severity=warning", "queue=vision") == "research-team"
    assert _route("alertname=MyriadQueueStarving", "severity=warning", "queue=serving") == "inference-team"
    assert _route("alertname=MyriadJobBelowEttrGoal", "severity=warning", "queue=legacy") == "queue-owners"
    # the fleet's warnings stay with the operators
    assert _route("alertname=MyriadAgentSilent", "severity=warning") == "operators"
    assert _route("alertname=MyriadLemonNode", "severity=warning", "datacenter=dc-east") == "operators"
