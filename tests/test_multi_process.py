"""The deployment past one machine, on this machine: PostgreSQL and Redis, two web processes
(uvicorn, as production runs them) and two Celery workers. A four-configuration sweep posted to
one web process runs on both workers and gives one report that the other web process serves; two
cycles sent at once to different workers never hold the scheduling lock together; a frame
published once reaches websocket clients of both web processes; a worker killed mid-sweep has its
part run again on the other and the sweep ends."""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from scheduling.worker import web_command, worker_command
from tests.browser_stack import (
    PASSWORDS,
    ROOT,
    _postgres_copy,
    _redis_other_db,
    free_port,
    manage,
    stop_group,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


class Deployment:
    def __init__(self, folder: Path):
        self.folder = folder
        self.processes: dict[str, subprocess.Popen] = {}
        env = {
            **os.environ,
            "MYRIAD_DATA_DIR": str(folder),
            "MYRIAD_DEBUG": "0",
            "MYRIAD_SIMULATED_FLEET": "0",
            # a killed worker's part is taken over after 30 s of silence, not the default 120 s
            # (live parts beat every second while they run)
            "MYRIAD_SIMULATION_LEASE_S": "30",
        }
        env["MYRIAD_DATABASE_URL"] = _postgres_copy(env["MYRIAD_DATABASE_URL"], "deployment")
        env["MYRIAD_REDIS_URL"] = _redis_other_db(env["MYRIAD_REDIS_URL"])
        self.env = env
        self.webs: list[str] = []

    def start(self) -> None:
        manage(self.env, "migrate", "--noinput")
        manage(self.env, "build_cluster", "demo")
        manage(self.env, "seed_queues")
        out = manage(
            self.env, "create_login", "operator", "--role", "operator", "--password", PASSWORDS["operator"]
        )
        self.token = re.search(r"api_token=(\w+)", out).group(1)
        for i in range(2):
            port = free_port()
            self._spawn(f"web{i}", web_command(port, workers=1))
            self.webs.append(f"http://127.0.0.1:{port}")
        for i in range(2):
            self._spawn(f"worker{i}", [*worker_command(), f"--hostname=worker{i}@test"])
        self._spawn("beat", [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=info"])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ready = all("ready" in self.log(f"worker{i}") for i in range(2))
            if ready and all(self._answers(url) for url in self.webs):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the deployment did not start; see {self.folder}")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - kept for failures
        self.processes[name] = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            urllib.request.urlopen(f"{url}/accounts/login/", timeout=2)
            return True
        except OSError:
            return False

    def api(self, web: int, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.webs[web] + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        for process in self.processes.values():
            stop_group(process)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("deployment"))
    try:
        d.start()
        yield d
    finally:
        d.stop()


def test_a_sweep_runs_on_both_workers_and_gives_one_report(deployment):
    made = deployment.api(
        0,
        "POST",
        "/api/v1/simulations/",
        {
            "name": "sweep",
            "cluster": "10k",
            "days": 2,
            "seed": 4,
            "configurations": ["baseline", "checkpoint=periodic:3600", "checkpoint=async:1800", "spares=4"],
        },
    )
    deadline = time.monotonic() + 300
    while True:
        sim = deployment.api(1, "GET", f"/api/v1/simulations/{made['id']}/")
        if sim["state"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sim["state"] == "done", sim
    assert [r["name"] for r in sim["summary"]["results"]] == [
        "baseline",
        "checkpoint=periodic:3600",
        "checkpoint=async:1800",
        "spares=4",
    ]
    assert sorted(sim["summary"]["workers"]) == ["worker0@test", "worker1@test"]
    request = urllib.request.Request(
        deployment.webs[1] + sim["report_url"], headers={"Authorization": f"Token {deployment.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as report:
        assert b"Plotly.newPlot" in report.read()


def test_two_cycles_sent_at_once_to_two_workers_never_hold_the_lock_together(deployment):
    script = (
        "from celery import group; from scheduling.tasks import run_scheduling_cycle; "
        "group(run_scheduling_cycle.s() for _ in range(6)).apply_async()"
    )
    manage(deployment.env, "shell", "-c", script)
    pattern = re.compile(r"lock held (\d+\.\d+)-(\d+\.\d+)")
    deadline = time.monotonic() + 60
    while True:
        held = {
            i: [tuple(map(float, m)) for m in pattern.findall(deployment.log(f"worker{i}"))] for i in range(2)
        }
        if sum(map(len, held.values())) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert all(held[i] for i in range(2)), held  # both workers ran cycles
    spans = sorted(s for i in range(2) for s in held[i])
    assert len(spans) >= 6
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, spans  # one after the other (times from the database's clock, in microseconds)


def _session_cookie(base: str) -> str:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/").read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode(
        {"username": "operator", "password": PASSWORDS["operator"], "csrfmiddlewaretoken": csrf}
    ).encode()
    opener.open(urllib.request.Request(f"{base}/accounts/login/", data=form, headers={"Referer": base}))
    return "; ".join(f"{c.name}={c.value}" for c in jar)


def test_a_frame_published_once_reaches_clients_of_both_web_processes(deployment):
    import websockets

    cookies = [_session_cookie(url) for url in deployment.webs]

    async def scenario():
        clients = [
            await websockets.connect(
                url.replace("http://", "ws://") + "/ws/telemetry/",
                additional_headers={"Cookie": cookie, "Origin": url},
                max_size=None,
            )
            for url, cookie in zip(deployment.webs, cookies, strict=True)
        ]
        try:
            # one fleet tick in a process of its own: it writes a frame and publishes it once
            env = {**deployment.env, "MYRIAD_SIMULATED_FLEET": "1"}
            await asyncio.to_thread(
                manage, env, "shell", "-c", "from monitoring.tasks import fleet_tick; fleet_tick()"
            )
            got = []
            for client in clients:
                while True:
                    message = await asyncio.wait_for(client.recv(), 30)
                    if isinstance(message, bytes) and message[:1] in (b"S", b"D"):
                        got.append(message)
                        break
            return got
        finally:
            for client in clients:
                await client.close()

    first, second = asyncio.run(scenario())
    assert first == second and len(first) > 21


def test_a_worker_killed_mid_sweep_has_its_part_run_on_the_other(deployment):
    import signal

    configs = ["baseline", "checkpoint=periodic:3600", "checkpoint=async:1800", "spares=4"]
    made = deployment.api(
        0,
        "POST",
        "/api/v1/simulations/",
        {"cluster": "100k", "days": 3, "seed": 5, "configurations": configs},
    )
    path = f"/api/v1/simulations/{made['id']}/"
    deadline = time.monotonic() + 120
    while True:  # worker0 halfway into a part
        parts = deployment.api(1, "GET", path)["parts"]
        victim = [p for p in parts if p["worker"] == "worker0@test" and not p["done"] and p["progress"] > 0]
        if victim or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert victim, parts
    worker0 = deployment.processes["worker0"]
    os.killpg(worker0.pid, signal.SIGKILL)
    worker0.wait(10)
    deadline = time.monotonic() + 300
    while True:
        sim = deployment.api(1, "GET", path)
        if sim["state"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sim["state"] == "done", sim
    assert [r["name"] for r in sim["summary"]["results"]] == configs
    again = sim["parts"][victim[0]["index"]]
    assert again["worker"] == "worker1@test" and again["done"]
