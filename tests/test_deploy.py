"""The production layout in deploy/ holds together: ``manage.py check --deploy`` is clean with its
settings, and the workers of the systemd units and the compose file consume every queue the
settings route tasks to."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from django.conf import settings

from tests.browser_stack import ROOT

DEPLOY = ROOT / "deploy"


def _env_file() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "myriad.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value
    return out


def test_check_deploy_is_clean_with_the_production_settings(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYRIAD_")}
    env.update(_env_file())
    env.update(
        MYRIAD_SECRET_KEY="k" * 20 + "production-secret-with-enough-variety-0123456789",
        MYRIAD_DATA_DIR=str(tmp_path),
        MYRIAD_DATABASE_URL=f"sqlite:///{tmp_path}/check.sqlite3",  # check --deploy opens no connection
    )
    env.pop("MYRIAD_REDIS_URL")
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_every_routed_queue_has_workers_in_the_units_and_the_compose_file():
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()} | {
        settings.CELERY_TASK_DEFAULT_QUEUE
    }
    assert routed == set(settings.CELERY_QUEUE_NAMES)
    compose = (DEPLOY / "compose.yaml").read_text()
    assert set(re.findall(r'"--queues=(\w+)"', compose)) == routed
    unit = (DEPLOY / "systemd" / "myriad-worker@.service").read_text()
    for queue in routed:
        assert f"myriad-worker@{queue}" in unit
    beats = compose.count('"beat"')
    assert beats == 1  # exactly one beat
