"""Our own parts failing, on a whole stack (web, Celery worker with beat, simulated fleet) over a
PostgreSQL server and a Redis server of the test's own (tests.own_services), never the machine's:

- Redis stopped for 60 s: the API answers and the scheduling cycle runs on PostgreSQL from the
  worker's own timer, the live data's readers say it is unavailable, nothing submitted is lost,
  and everything recovers when Redis is back, with no restart;
- PostgreSQL restarted: requests during the outage get 503 with a clear message, web and worker
  reconnect by themselves;
- ``kill -9`` of the worker while it holds the scheduling lock: no partial decision is visible,
  the next cycle (a replacement worker) completes and the invariant checker passes.

Tests run in this order (each leaves the stack working for the next; the last kills the worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from types import SimpleNamespace

import pytest

from scheduling.locks import LOCK_KEY
from scheduling.worker import worker_command
from tests import own_services
from tests.browser_stack import CHROMIUM, CHROMIUM_ARGS, PASSWORDS, ROOT, manage, start_stack, stop_group

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.skipif(not own_services.available(), reason="needs PostgreSQL's binaries and redis-server"),
]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own-faults")
    pg = own_services.OwnPostgres()
    pg.start()
    redis = own_services.OwnRedis(folder / "redis")
    redis.start()
    extra = {
        "MYRIAD_DATABASE_URL": pg.url("myriad"),
        "MYRIAD_REDIS_URL": redis.url,
        "MYRIAD_FLEET_ARRIVALS": "0",  # the fleet writes frames; the test's jobs find room
        "MYRIAD_CYCLE_INTERVAL_S": "2",
    }
    stack = start_stack(folder / "stack", "demo", extra_env=extra, name="faults")
    ns = SimpleNamespace(pg=pg, redis=redis, stack=stack, workers=[])
    try:
        yield ns
    finally:
        for worker in ns.workers:
            stop_group(worker)
        stack.stop()
        redis.stop()
        pg.remove()


def _call(stack, method: str, path: str, body: dict | None = None, cookie: str | None = None):
    """(status, parsed JSON or text) of one request to the stack."""
    headers = {"Cookie": cookie} if cookie else {"Authorization": f"Token {stack.tokens['operator']}"}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(stack.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, raw, kind = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, kind = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, json.loads(raw) if "json" in kind and raw else raw.decode(errors="replace")


def _submit(stack) -> int:
    status, body = _call(stack, "POST", "/api/v1/jobs/", {"queue": "research", "gpus": 1, "topology": "any"})
    assert status == 201, body
    return body["id"]


def _considered(stack, job_id: int) -> bool:
    """A cycle has seen the job: it runs, or a cycle wrote why it waits."""
    status, body = _call(stack, "GET", f"/api/v1/jobs/{job_id}/")
    waiting = "next scheduling cycle" in body.get("pending_reason", "")
    return status == 200 and (body["state"] == "running" or not waiting)


def _until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def _session(stack) -> str:
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{stack.url}/accounts/login/").read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    form = f"username=viewer&password={PASSWORDS['viewer']}&csrfmiddlewaretoken={csrf}".encode()
    login = urllib.request.Request(f"{stack.url}/accounts/login/", data=form, headers={"Referer": stack.url})
    opener.open(login)
    return "; ".join(f"{c.name}={c.value}" for c in jar)


def test_redis_stopped_for_a_minute_keeps_the_api_and_the_cycle_working(own):
    stack = own.stack
    before = _submit(stack)
    _until(lambda: _considered(stack, before), 60, "a job admitted through the broker before the outage")
    _until(lambda: _call(stack, "GET", "/api/v1/telemetry/frame/")[0] == 200, 60, "a first telemetry frame")
    cookie = _session(stack)
    with _live_page(stack) as page:
        own.redis.stop()
        during = _through_the_outage(stack, cookie, page)
        own.redis.start()  # empty: no persistence, as the machine's Redis
        page.wait_for_function(STATUS_FRESH, timeout=90_000)  # it reconnected by itself
    # the cycle ran on PostgreSQL meanwhile: every job but the newest few was seen by a cycle
    seen = [job for job in during[:-2] if _considered(stack, job)]
    assert seen == during[:-2], f"{len(seen)} of {len(during) - 2} jobs seen by a cycle during the outage"
    _until(lambda: _call(stack, "GET", "/api/v1/telemetry/frame/")[0] == 200, 90, "live frames again")
    after = _submit(stack)
    _until(lambda: _considered(stack, after), 60, "a job admitted through the broker after the outage")
    for job in [before, *during, after]:  # every job is there
        assert _call(stack, "GET", f"/api/v1/jobs/{job}/")[0] == 200
    log = Path(stack.log).read_text(errors="replace")
    assert "the broker is not answering: this worker ran the cycle itself" in log


STATUS_FRESH = "document.getElementById('status').textContent.startsWith('frame')"


@contextlib.contextmanager
def _live_page(stack):
    """The live page in Chromium, logged in as a viewer, showing frames."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(base_url=stack.url).new_page()
        page.goto("/accounts/login/")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", PASSWORDS["viewer"])
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/accounts/login/" not in url)
        page.goto("/live/")
        page.wait_for_function(STATUS_FRESH, timeout=30_000)
        try:
            yield page
        finally:
            browser.close()


def _through_the_outage(stack, cookie: str, page) -> list[int]:
    """60 s without Redis: submits, reads, the live data's readers and the live page; the jobs
    submitted."""
    during, start = [], time.monotonic()
    while time.monotonic() < start + 60:
        during.append(_submit(stack))  # nothing submitted is refused
        assert _call(stack, "GET", "/api/v1/jobs/?page_size=5")[0] == 200
        status, body = _call(stack, "GET", "/api/v1/telemetry/frame/")
        assert status == 503 and "live data is unavailable" in body["detail"], (status, body)
        status, html = _call(stack, "GET", "/live/", cookie=cookie)
        assert status == 200, html[:2000]
        if time.monotonic() - start > 20:  # the open page says its data is stale, and keeps its map
            text = page.locator("#status").inner_text()
            assert text.startswith("live data stale: frame "), text
            assert page.evaluate("document.getElementById('heat').data[0].z.length") > 0
        page.wait_for_timeout(4000)
    return during


def test_postgres_restarted_gets_503_meanwhile_and_everyone_reconnects(own):
    stack = own.stack
    own.pg.stop()
    try:
        status, body = _call(stack, "GET", "/api/v1/jobs/")
        assert status == 503, body
        assert "database is not answering" in body["detail"]
        status, body = _call(stack, "POST", "/api/v1/jobs/", {"queue": "research", "gpus": 1})
        assert status == 503 and "Traceback" not in json.dumps(body)
    finally:
        own.pg.start()
    _until(lambda: _call(stack, "GET", "/api/v1/jobs/?page_size=1")[0] == 200, 60, "the API back on its own")
    job = _submit(stack)
    _until(lambda: _considered(stack, job), 60, "the worker scheduling again on its own")


def _lock_holder(database_url: str) -> int | None:
    """The process id of the Myriad process whose connection holds the scheduling lock."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objid = %s",
            [LOCK_KEY],
        ).fetchone()
    if row and row[0].startswith("myriad:"):
        return int(row[0].split(":")[1])
    return None


def test_a_worker_killed_mid_cycle_leaves_no_partial_decision(own):
    stack = own.stack
    # enough pending work that a cycle holds the lock long enough to be caught holding it
    manage(
        stack.env, "shell", "-c",
        "from scheduling.models import Queue\n"
        "from scheduling.services import submit_job\n"
        "q = Queue.objects.get(name='research')\n"
        "for i in range(1500): submit_job(queue=q, gpus=1 + i % 8, topology='any')",
    )  # fmt: skip
    victim, deadline = None, time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        pid = _lock_holder(stack.env["MYRIAD_DATABASE_URL"])
        if pid and b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
            victim = pid
        else:
            time.sleep(0.01)
    assert victim, "no cycle was caught holding the lock"
    # what the killed cycle wrote was rolled back as one: the committed state keeps every rule
    out = manage(stack.env, "check_invariants", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert report["problems"] == [], report
    # a replacement worker runs the next cycles, from the lock the dead one's connection released
    log = open(Path(stack.log).with_name("replacement-worker.log"), "ab")  # noqa: SIM115
    own.workers.append(
        subprocess.Popen(
            worker_command(beat=True), cwd=ROOT, env=stack.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    )  # fmt: skip
    job = _submit(stack)
    _until(lambda: _considered(stack, job), 120, "a cycle after the kill")
    report = json.loads(manage(stack.env, "check_invariants", "--json").strip().splitlines()[-1])
    assert report["problems"] == [], report
