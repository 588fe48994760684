"""Load over real HTTP: job submits to the production web server, and websocket clients on the live
page's channel.

A whole stack runs (``manage.py runstack``: Celery worker and beat, so cycles run as jobs arrive)
on its own database, on the embedded default or, with MYRIAD_DATABASE_URL / MYRIAD_REDIS_URL set,
on PostgreSQL and Redis. The web server is uvicorn as a deployment runs it (``--servers`` worker
processes on one socket, scheduling.worker.web_command).

Submits: tenants (one login each, the submit throttle is per user) POST ``/api/v1/jobs/`` from
keep-alive connections (one per submit a second) at a fixed rate for ``--seconds``; each
submit's latency counts from the moment it was due, so a server that falls behind shows it. Past
its capacity the server sheds (503 with Retry-After): the accepted submits' p99 and the share
refused are printed. Then 32 connections send as fast as answers come, for the most the server
takes. Every 201 must be a job in the database.

Websockets: ``--ws-clients`` clients hold ``/ws/telemetry/`` open for ``--ws-seconds`` while this
process plays the fleet at 1 Hz (as bench.dashboard does). Each client checks that every delta
names the frame it holds (no sequence number dropped); the web server's resident memory (all its
processes) is read every 10 s.

    python -m bench.http [--rate 300] [--seconds 60] [--ws-clients 50] [--ws-seconds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench._http import connections as open_connections
from bench._http import drive, latency_figures
from scheduling.worker import web_command
from tests.browser_stack import free_port, start_stack, stop_group

SUBMIT_PATH = "/api/v1/jobs/"
TARGET_RATE = 300
TARGET_P99_MS = 100.0


def _tenants(n: int) -> list[str]:
    """``n`` operator logins, their API tokens."""
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    for i in range(n):
        call_command("create_login", f"tenant{i:02d}", role="operator", password=f"pw-{i}", verbosity=0)
    return list(Token.objects.filter(user__username__startswith="tenant").values_list("key", flat=True))


def _bodies(rng: random.Random, n: int = 256) -> list[bytes]:
    from cluster.models import Node
    from scheduling.models import Queue

    training = Queue.objects.filter(stopped=False).exclude(name="inference")
    queues = list(training.values_list("name", flat=True))
    chips = sorted(set(Node.objects.values_list("chip_type__name", flat=True)))  # those the cluster has
    return [
        json.dumps(
            {
                "queue": rng.choice(queues),
                "gpus": rng.choice((1, 2, 4, 8, 8, 16, 32)),
                "chip_types": [rng.choice(chips)],
                "topology": "any",
                "name": f"bench-{i}",
                "estimated_duration_s": rng.uniform(60, 3600),
            }
        ).encode()
        for i in range(n)
    ]


async def _submits(port: int, tokens, bodies, rate: float | None, seconds: float, connections: int) -> dict:
    """Submits at ``rate`` per second (None: as fast as answers come) for ``seconds``."""
    pool = open_connections(port, connections)
    latencies, accepted, statuses, created, samples = [], [], {}, [], {}
    turn = iter(range(1 << 62))

    async def one(due: float) -> None:
        i = next(turn)
        conn = await pool.get()
        try:
            code, answer = await asyncio.wait_for(
                conn.post(SUBMIT_PATH, f"Token {tokens[i % len(tokens)]}", bodies[i % len(bodies)]), 30
            )
            if code == 201:
                created.append(json.loads(answer)["id"])
            elif code not in statuses:
                samples[code] = answer[:300].decode(errors="replace")
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            conn.writer, code = None, 0
        pool.put_nowait(conn)
        latencies.append(time.perf_counter() - due)
        if code == 201:
            accepted.append(latencies[-1])
        statuses[code] = statuses.get(code, 0) + 1

    elapsed = await drive(one, rate, seconds, connections)
    shed = statuses.get(429, 0) + statuses.get(503, 0)
    return {
        "offered_per_s": rate,
        "submits_per_s": round(statuses.get(201, 0) / elapsed, 1),
        **latency_figures(latencies),
        # the submits answered 201 alone, and the share refused at once (429, 503 with Retry-After)
        **{f"accepted_{k}": v for k, v in latency_figures(accepted or [0.0]).items()},
        "refused_share": round(shed / max(1, len(latencies)), 4),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "refusals": {str(k): v for k, v in samples.items()},  # one answer of each refused kind
        "created_ids": created,
    }


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (uvicorn's parent and its workers)."""
    total, pids = 0, [pid]
    while pids:
        p = pids.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            pids += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


async def _ws_clients(url: str, cookie: str, n: int, seconds: float, pid: int) -> dict:
    import websockets

    from engine.frames import HEADER

    def seq_of(message: bytes) -> int:
        return int(np.frombuffer(message[6:10], "<u4")[0])

    frames, dropped, resyncs, memory = [0] * n, [0] * n, [0] * n, []

    async def one(i: int) -> None:
        origin = url.replace("ws://", "http://").split("/ws/")[0]
        headers = {"Cookie": cookie}
        async with websockets.connect(url, additional_headers=headers, origin=origin, max_size=None) as ws:
            held, end = None, time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                try:
                    message = await asyncio.wait_for(ws.recv(), timeout=left)
                except TimeoutError:
                    break
                if not isinstance(message, bytes):
                    continue
                seq = seq_of(message)
                if message[:1] == b"D":
                    base = int(np.frombuffer(message[1 + HEADER : 5 + HEADER], "<u4")[0])
                    if held is None or base != held:
                        resyncs[i] += 1
                        await ws.send("resync")
                if held is not None and seq > held + 1:
                    dropped[i] += seq - held - 1
                held = seq
                frames[i] += 1

    async def watch_memory() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            memory.append(_rss_mb(pid))
            await asyncio.sleep(10)

    await asyncio.gather(watch_memory(), *(one(i) for i in range(n)))
    return {
        "ws_clients": n,
        "ws_seconds": seconds,
        "ws_frames_per_client_min": min(frames),
        "ws_frames_per_client_max": max(frames),
        "ws_dropped_sequence_numbers": sum(dropped),
        "ws_resyncs": sum(resyncs),
        "server_rss_mb_first": round(memory[0], 1),
        "server_rss_mb_after_1_min": round(memory[min(6, len(memory) - 1)], 1),
        "server_rss_mb_last": round(memory[-1], 1),
    }


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/accounts/login/", timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the web server did not answer")


def run(args) -> dict:
    from bench.dashboard import FleetPlayer, _session_cookie, _wait_for_frame

    with tempfile.TemporaryDirectory(prefix="myriad-http-") as tmp:
        # the worker runs as deployed too: DEBUG off (no query log kept for every statement)
        stack = start_stack(
            Path(tmp), args.cluster, simulated_fleet=False, name="http", extra_env={"MYRIAD_DEBUG": "0"}
        )
        if not args.scheduler:  # the web tier alone: the stack's worker (and its cycles) stopped
            stack.stop()
        os.environ.update(stack.env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        tokens = _tenants(args.tenants)
        bodies = _bodies(random.Random(20261202))
        port = free_port()
        web = _serve(stack.env, port, args.servers, Path(tmp) / "uvicorn.log")
        try:
            _wait_up(f"http://127.0.0.1:{port}")
            asyncio.run(_submits(port, tokens, bodies, 50, 3, 32))  # every process warm
            # as many connections as submits a second: the offered rate reaches the server, which
            # answers or sheds, instead of queueing in this client's pool
            offered = args.connections or max(32, int(args.rate))
            steady = asyncio.run(_submits(port, tokens, bodies, args.rate, args.seconds, offered))
            most = asyncio.run(_submits(port, tokens, bodies, None, 10, args.connections or 32))
            from scheduling.models import Job

            ids = steady.pop("created_ids") + most.pop("created_ids")
            stored = Job.objects.filter(pk__in=ids).count()
            figures = {"steady": steady, "most": most, "created": len(ids), "created_in_database": stored}
            if args.ws_clients:
                served = SimpleNamespace(url=f"http://127.0.0.1:{port}", tokens=stack.tokens)
                player = FleetPlayer(0.7)
                player.start()
                try:
                    _wait_for_frame(served)
                    ws_url = f"ws://127.0.0.1:{port}/ws/telemetry/"
                    cookie = _session_cookie(served)
                    clients = _ws_clients(ws_url, cookie, args.ws_clients, args.ws_seconds, web.pid)
                    figures.update(asyncio.run(clients))
                finally:
                    player.stopped.set()
        finally:
            stop_group(web)
            stack.stop()
        log = (Path(tmp) / "uvicorn.log").read_text(errors="replace")
        figures["server_error_lines"] = [line for line in log.splitlines() if "Error" in line][:10]
    return figures


def _serve(env: dict, port: int, servers: int, log: Path):
    import subprocess

    return subprocess.Popen(
        web_command(port, servers),
        env={**env, "MYRIAD_LOG_LEVEL": "WARNING", "MYRIAD_DEBUG": "0"},  # as deployed: no query log
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),  # noqa: SIM115 - the server's errors, kept for failures
        start_new_session=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="demo")
    parser.add_argument("--rate", type=float, default=TARGET_RATE, help="submits per second offered")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--connections", type=int, default=None, help="default: one per submit a second (32 at least)"
    )
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--servers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument(
        "--scheduler",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the stack's worker running cycles on the same cores (--no-scheduler: web tier alone)",
    )
    parser.add_argument("--ws-clients", type=int, default=50)
    parser.add_argument("--ws-seconds", type=float, default=600)
    args = parser.parse_args()
    figures = run(args)
    database = "postgresql" if os.environ.get("MYRIAD_DATABASE_URL") else "sqlite"
    layer = "redis" if os.environ.get("MYRIAD_REDIS_URL") else "in-memory"
    steady, most = figures["steady"], figures["most"]
    worker = "with the scheduler's worker" if args.scheduler else "web tier alone"
    print(
        f"{database}, channel layer {layer}, {args.servers} web processes, {args.tenants} tenants, {worker}"
    )
    print(f"{'figure':<44}{'value':>12}{'target':>12}")
    print(f"{'submits/s at the offered rate':<44}{steady['submits_per_s']:>12}{f'>= {args.rate:g}':>12}")
    print(f"{'submit latency p50 (ms, from due time)':<44}{steady['p50_ms']:>12}")
    print(f"{'submit latency p99 (ms, from due time)':<44}{steady['p99_ms']:>12}{'< 100':>12}")
    print(f"{'accepted submits: latency p99 (ms)':<44}{steady['accepted_p99_ms']:>12}{'< 1,000':>12}")
    print(f"{'share refused at once (429/503)':<44}{steady['refused_share']:>12}")
    print(f"{'submits/s, as fast as answers come':<44}{most['submits_per_s']:>12}")
    print(f"{'answers at the offered rate':<44}{json.dumps(steady['statuses']):>12}")
    stored = f"{figures['created']} / {figures['created_in_database']}"
    print(f"{'jobs created / found in the database':<44}{stored:>12}")
    if args.ws_clients:
        print(f"{'websocket clients x seconds':<44}{args.ws_clients:>6} x {args.ws_seconds:g}")
        frames = f"{figures['ws_frames_per_client_min']}-{figures['ws_frames_per_client_max']}"
        print(f"{'frames per client':<44}{frames:>12}")
        print(f"{'dropped sequence numbers':<44}{figures['ws_dropped_sequence_numbers']:>12}{'0':>12}")
        rss = (
            f"{figures['server_rss_mb_first']} / {figures['server_rss_mb_after_1_min']} / "
            f"{figures['server_rss_mb_last']}"
        )
        print(f"{'web server RSS MB: start / 1 min / end':<44}{rss:>12}")
    for line in figures["server_error_lines"]:
        print("server: " + line)
    print(
        json.dumps(
            {
                "database": database,
                "channel_layer": layer,
                "scheduler": args.scheduler,
                "submits_per_s": steady["submits_per_s"],
                "p50_ms": steady["p50_ms"],
                "p99_ms": steady["p99_ms"],
                "accepted_p99_ms": steady["accepted_p99_ms"],
                "refused_share": steady["refused_share"],
                "most_submits_per_s": most["submits_per_s"],
                **{k: v for k, v in figures.items() if k not in ("steady", "most", "server_error_lines")},
                "steady": steady,
                "most": most,
            }
        )
    )


if __name__ == "__main__":
    main()
