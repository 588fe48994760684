"""Memory of the live stack at 100k GPUs: each process's peak resident set, with 100,000 jobs of
history, 10,000 pending and the cluster busy.

The stack runs as ``make demo`` runs it (``manage.py runstack``: the ASGI server, a Celery worker
with beat playing the simulated fleet every second and running the scheduling cycles), plus the
production web server (uvicorn, ``--servers`` worker processes, scheduling.worker.web_command), on
the ``--cluster`` preset. Into its database this process writes ``--history`` finished jobs with
their events (submitted, admitted, finished), ``--running`` jobs of 8 GPUs in the example queues,
which the cycles start, and ``--pending`` jobs in a queue without quota, which stay pending and
are read by every cycle. Then, for ``--seconds``: ``--ws-clients`` websocket clients on the live
view of each web server, and one client that reads what operators read (the jobs list, pending
jobs, a job's page, queue history, the fleet frame, Prometheus' two scrapes) as fast as answers
come. Peak resident memory (VmHWM) of every process of both servers and the worker is read at the
end.

    python -m bench.stack_memory [--cluster 100k] [--history 100000] [--pending 10000] [--seconds 120]

On the embedded default, or with MYRIAD_DATABASE_URL / MYRIAD_REDIS_URL set, on PostgreSQL and
Redis. The JSON line: ``rss_mb`` (process -> peak MB), ``max_rss_mb``, what was running, and
from the stack's log the worker's cycles (p50, p99, the slowest one's line) and the simulated
fleet's ticks (count, p50, longest), with the fewest live frames a client received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench.scheduling_e2e import peak_rss_mb
from tests.browser_stack import free_port, start_stack, stop_group

TARGET_MB = 300
SCRAPE_TOKEN = "bench-scrape"  # MYRIAD_METRICS_TOKEN of the stack: Prometheus' scrapes


def _tree(pid: int) -> list[int]:
    """A process and all its descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _role(pid: int) -> str:
    """What a process of the stack is, from its command line and its parent's (the worker's
    embedded beat is a forked child with the worker's command line; uvicorn's workers are spawned
    by multiprocessing)."""
    text, parent = _cmdline(pid), _cmdline(_parent(pid))
    if "celery" in text:
        return "celery beat" if "celery" in parent else "celery worker (cycles, fleet)"
    if "runstack" in text:
        return "runstack (ASGI server)"
    if "uvicorn" in text:
        return "uvicorn (supervisor)"
    if "uvicorn" in parent:
        return "uvicorn worker"
    return text[:40]


def _seed(history: int, running: int, pending: int, now) -> dict:
    """The history, the jobs the cycles start and the jobs that stay pending, in bulk."""
    from scheduling.models import Job, JobEvent, Queue

    rng = np.random.default_rng(20261206)
    queues = list(Queue.objects.exclude(name="inference"))
    span = 30 * 86400.0
    for start in range(0, history, 20_000):
        n = min(20_000, history - start)
        submitted = rng.uniform(0, span - 86400, n)
        waits, runs = rng.exponential(600.0, n), rng.uniform(600, 12 * 3600, n)
        jobs = Job.objects.bulk_create(
            [
                Job(
                    name=f"history-{start + i}",
                    queue=queues[i % len(queues)],
                    gpus=8,
                    chip_types=["H100-SXM"],
                    state="finished",
                    submitted_at=now - timedelta(seconds=span - submitted[i]),
                    started_at=now - timedelta(seconds=span - submitted[i] - waits[i]),
                    finished_at=now - timedelta(seconds=span - submitted[i] - waits[i] - runs[i]),
                )
                for i in range(n)
            ],
            batch_size=5000,
        )
        events = []
        for i, job in enumerate(jobs):
            events.append(JobEvent(job=job, kind="submitted", at=job.submitted_at, reason="bench"))
            events.append(
                JobEvent(
                    job=job,
                    kind="admitted",
                    at=job.started_at,
                    reason="bench",
                    data={"chip": "H100-SXM", "gpus": 8, "wait_s": float(waits[i])},
                )
            )
            events.append(JobEvent(job=job, kind="finished", at=job.finished_at, reason="bench"))
        JobEvent.objects.bulk_create(events, batch_size=10_000)
    Job.objects.bulk_create(
        [
            Job(
                name=f"work-{i}",
                queue=queues[i % len(queues)],
                gpus=8,
                submitted_at=now,
                estimated_duration_s=86400,
            )
            for i in range(running)
        ],
        batch_size=5000,
    )
    backlog = Queue.objects.create(name="backlog")  # no quota: its jobs stay pending
    Job.objects.bulk_create(
        [Job(name=f"backlog-{i}", queue=backlog, gpus=8, submitted_at=now) for i in range(pending)],
        batch_size=5000,
    )
    return {"history": history, "submitted_to_run": running, "pending": pending}


def _reader(url: str, token: str, seconds: float) -> dict:
    """What operators read, one request after another, for ``seconds``."""
    from scheduling.models import Job

    ids = list(Job.objects.filter(state="finished").values_list("pk", flat=True)[:1000])
    paths = [
        "/api/v1/jobs/?page_size=100",
        "/api/v1/jobs/?state=pending&page_size=100",
        "/api/v1/jobs/?state=running&page_size=100",
        "/api/v1/queue-history/?days=7",
        "/api/v1/telemetry/frame/",
        "/metrics",
        "/metrics/gpus",
    ]
    rng, answered, errors = random.Random(7), 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        path = rng.choice([*paths, f"/api/v1/jobs/{rng.choice(ids)}/"])
        auth = f"Bearer {SCRAPE_TOKEN}" if path.startswith("/metrics") else f"Token {token}"
        request = urllib.request.Request(url + path, headers={"Authorization": auth})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
                answered += 1
        except OSError as exc:
            key = path.split("?")[0].rstrip("/").rsplit("/", 1)[-1] + f": {exc}"[:80]
            errors[key] = errors.get(key, 0) + 1
    return {"reads": answered, "read_errors": errors}


def _ms(line: str) -> float:
    return float(re.search(r"; ([\d.]+) ms in all", line).group(1))


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws/telemetry/"


def run(args) -> dict:
    from bench.dashboard import _session_cookie, _wait_for_frame
    from bench.http import _serve, _wait_up, _ws_clients

    with tempfile.TemporaryDirectory(prefix="myriad-memory-") as tmp:
        stack = start_stack(
            Path(tmp),
            args.cluster,
            simulated_fleet=True,
            name="memory",
            extra_env={"MYRIAD_DEBUG": "0", "MYRIAD_METRICS_TOKEN": SCRAPE_TOKEN},
        )
        web = None
        try:
            os.environ.update(stack.env)
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
            import django

            django.setup()
            from django.utils import timezone

            from scheduling.models import Job

            t0 = time.perf_counter()
            figures = _seed(args.history, args.running, args.pending, timezone.now())
            figures["seed_s"] = round(time.perf_counter() - t0, 1)
            port = free_port()
            web = _serve(stack.env, port, args.servers, Path(tmp) / "uvicorn.log")
            _wait_up(f"http://127.0.0.1:{port}")
            _wait_for_frame(stack)
            urls = [stack.url, f"http://127.0.0.1:{port}"]
            cookies = [_session_cookie(SimpleNamespace(url=u, tokens=stack.tokens)) for u in urls]

            async def load() -> list:
                clients = [
                    _ws_clients(ws_url(u), cookie, args.ws_clients, args.seconds, pid)
                    for u, cookie, pid in zip(urls, cookies, (stack.process.pid, web.pid), strict=True)
                ]
                readers = [
                    asyncio.to_thread(_reader, u, stack.tokens["operator"], args.seconds) for u in urls
                ]
                return await asyncio.gather(*clients, *readers)

            results = asyncio.run(load())
            figures["ws_frames_per_client_min"] = min(r["ws_frames_per_client_min"] for r in results[:2])
            figures["reads"] = sum(r["reads"] for r in results[2:])
            figures["read_errors"] = {k: v for r in results[2:] for k, v in r["read_errors"].items()}
            figures["running"] = Job.objects.filter(state="running").count()
            figures["pending_now"] = Job.objects.filter(state="pending").count()
            rss = {}
            for root in (stack.process.pid, web.pid):
                for pid in _tree(root):
                    try:
                        peak = peak_rss_mb(pid)
                    except (FileNotFoundError, ProcessLookupError):
                        continue  # ended since the tree was read
                    if peak > 20:  # not the shells and launchers
                        rss[f"{_role(pid)} [{pid}]"] = peak
            figures["rss_mb"] = rss
            figures["max_rss_mb"] = max(rss.values())
            log = Path(stack.log).read_text()
            logged = re.findall(r"cycle: .*ms in all", log)
            cycles = [_ms(line) for line in logged]
            if cycles:  # the worker's, meanwhile: it also plays the fleet's 1 Hz frames
                figures["cycles"] = len(cycles)
                figures["slowest_cycle"] = max(logged, key=_ms)
                figures["cycle_p50_ms"] = round(float(np.percentile(cycles, 50)), 1)
                figures["cycle_p99_ms"] = round(float(np.percentile(cycles, 99)), 1)
            # the simulated fleet's ticks (each writes a live frame), as Celery logged them
            tick = r"fleet_tick\[[^]]*\] succeeded in ([\d.]+)s"
            ticks = [float(t) for t in re.findall(tick, log)]
            if ticks:
                figures["fleet_ticks"] = len(ticks)
                figures["fleet_tick_p50_s"] = round(float(np.percentile(ticks, 50)), 3)
                figures["fleet_tick_max_s"] = round(max(ticks), 3)
        finally:
            if web is not None:
                stop_group(web)
            stack.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--history", type=int, default=100_000, help="finished jobs, with their events")
    parser.add_argument("--running", type=int, default=8_000, help="jobs of 8 GPUs the cycles start")
    parser.add_argument("--pending", type=int, default=10_000, help="jobs that stay pending (no quota)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--servers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--ws-clients", type=int, default=5, help="per web server")
    args = parser.parse_args()
    figures = run(args)
    database = "postgresql" if os.environ.get("MYRIAD_DATABASE_URL") else "sqlite"
    print(
        f"{database}, {args.cluster}: {figures['history']:,} jobs of history, "
        f"{figures['running']:,} running, "
        f"{figures['pending_now']:,} pending; {figures['reads']:,} reads and {args.ws_clients} live clients "
        f"per server for {args.seconds:g} s"
    )
    print(f"{'process':<48}{'peak RSS (MB)':>14}{'target':>10}")
    for name, mb in sorted(figures["rss_mb"].items()):
        print(f"{name:<48}{mb:>14}{f'< {TARGET_MB}':>10}")
    if "cycles" in figures:
        frames = figures["ws_frames_per_client_min"]
        print(
            f"scheduling cycles meanwhile: {figures['cycles']}, p50 {figures['cycle_p50_ms']} ms, "
            f"p99 {figures['cycle_p99_ms']} ms; live frames per client (fewest): {frames}"
        )
    if "fleet_ticks" in figures:
        print(
            f"fleet ticks (the stack's whole life): {figures['fleet_ticks']}, "
            f"p50 {figures['fleet_tick_p50_s']} s, longest {figures['fleet_tick_max_s']} s"
        )
    if figures["read_errors"]:
        print("read errors:", figures["read_errors"])
    print(json.dumps({"database": database, **figures}))


if __name__ == "__main__":
    main()
