"""Node reports over HTTP: the agents of a 100k-GPU cluster reporting every 10 s.

    python -m bench.ingest [--cluster 100k] [--rate 1250] [--seconds 20] [--servers 2]

Per backend (SQLite with the embedded stores; PostgreSQL with Redis), in a fresh database: the
cluster is built, every node gets a credential, the database is vacuumed and checkpointed, and
the web server as in production (uvicorn with ``--servers`` worker processes on one socket)
serves ``POST /api/v1/agent/report/`` on loopback. The load generator (asyncio, keep-alive connections,
this process) sends real-sized reports (8 GPUs, every reading an agent sends, and the summaries
of 8 NIC ports' 10 ms windows; ``--no-net`` leaves them out) for the nodes in
turn at a fixed rate: each report's latency counts from the moment it was due, so a server that
falls behind shows it (no coordinated omission); "answer p99" counts from the moment it was sent
(the server alone; the rest is waiting for a free connection and the generator's own delays on
the same two cores). Then the same connections send as fast as answers
come, for the most the server takes. Target: 1,250 reports/s (12,500 nodes every 10 s) with
p99 < 100 ms. The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from bench._backends import print_table, run_per_backend, setup_django
from bench._http import connections as open_connections
from bench._http import drive, latency_figures
from scheduling.worker import web_command
from tests.browser_stack import free_port

TARGET_RATE = 1250
TARGET_P99_MS = 100.0
REPORT_PATH = "/api/v1/agent/report/"


def _credentials() -> list[tuple[int, str]]:
    """A credential for every node, written in bulk (enrolment one by one is tested elsewhere)."""
    from cluster.agents import CREDENTIAL_PREFIX, digest
    from cluster.models import Node, NodeCredential

    rows, keys = [], []
    for node_id, hostname in Node.objects.values_list("id", "hostname"):
        secret = f"{CREDENTIAL_PREFIX}bench-{node_id:06d}-{os.urandom(8).hex()}"
        rows.append(
            NodeCredential(node_id=node_id, key_hash=digest(secret), prefix=secret[9:15], address=hostname)
        )
        keys.append((node_id, secret))
    NodeCredential.objects.bulk_create(rows, batch_size=2000)
    return keys


PORTS = [f"mlx5_{r}/1" for r in range(8)]
SEQ = 123456789  # the placeholder a report's sequence number (and its counters) replaces


def port_summaries(rng: random.Random) -> list[dict]:
    """The eight port summaries of a 5 s report (10 ms windows); the cumulative counters are
    the placeholder, replaced by the sequence number so that they only grow."""
    out = []
    for r, name in enumerate(PORTS):
        mean = rng.uniform(2, 30)
        out.append(
            {
                "port": name,
                "rail": r,
                "seconds": 4.99,
                "state": "active",
                "rate_gbps": 400.0,
                "windows": 499,
                "counters": {name: SEQ for name in ("port_xmit_data", "port_rcv_data", "port_xmit_wait")},
                "tx_bytes": int(mean / 100 * 50e9 * 5),
                "rx_bytes": int(mean / 100 * 50e9 * 5),
                "util": {"mean": round(mean, 2), "p50": round(mean / 3, 2), "p99": 96.5, "max": 99.0},
                "bursts": rng.randint(0, 80),
                "cnp_sent_per_s": round(rng.uniform(0, 300), 2),
                "cnp_handled_per_s": round(rng.uniform(0, 300), 2),
                "ecn_marked_per_s": round(rng.uniform(0, 3000), 2),
                "xmit_wait_share": round(rng.uniform(0, 0.1), 4),
                "flaps": [],
                "reset": False,
            }
        )
    return out


def report_body(seq: int, rng: random.Random, net: bool = True) -> bytes:
    """A report as an agent of an 8-GPU node with eight NIC ports sends it."""
    gpus = []
    for i in range(8):
        util = rng.randint(0, 100)
        gpus.append(
            {
                "index": i,
                "uuid": f"GPU-{rng.getrandbits(32):08x}-{i}",
                "util": util,
                "memory_used_mib": 800.0 * util,
                "memory_total_mib": 81559.0,
                "temperature_c": 35 + util * 0.4,
                "power_w": 90 + util * 6.1,
                "power_limit_w": 700.0,
                "sm_clock_mhz": 1980,
                "ecc_corrected_volatile": 0,
                "ecc_uncorrected_volatile": 0,
                "ecc_corrected_aggregate": 12,
                "ecc_uncorrected_aggregate": 0,
                "retired_pages": 0,
                "retired_pages_pending": False,
                "remapped_rows_correctable": 0,
                "remapped_rows_uncorrectable": 0,
                "remap_pending": False,
                "remap_failure": False,
                "nvlink_crc_errors": 0,
                "nvlink_replay_errors": 0,
                "nvlink_recovery_errors": 0,
                "pcie_replays": 0,
            }
        )
    body = {
        "seq": seq,
        "sent_at": time.time(),
        "agent_version": "bench",
        "gpus": gpus,
        "xids": [],
        "processes": [],
    }
    if net:
        body["net"] = {"ports": port_summaries(rng)}
    return json.dumps(body).encode()


class Bodies:
    """Reports made ahead (the load generator shares the machine's two cores with the server):
    64 sets of readings, each a prefix waiting only for its sequence number."""

    def __init__(self, rng: random.Random, variants: int = 64, net: bool = True):
        self.parts = []
        for _ in range(variants):
            body = report_body(SEQ, rng, net)
            self.parts.append(body.split(str(SEQ).encode()))
        self.rng = rng

    def make(self, seq: int) -> bytes:
        parts = self.parts[self.rng.randrange(len(self.parts))]
        return str(seq).encode().join(parts)


async def _load(
    port: int, keys, rate: float | None, seconds: float, connections: int, seqs: dict, net: bool = True
) -> dict:
    """Reports at ``rate`` per second (None: as fast as answers come) for ``seconds``."""
    rng = random.Random(20261201)
    bodies = Bodies(rng, net=net)
    pool = open_connections(port, connections)
    latencies, lags, services, statuses = [], [], [], {}

    order = list(range(len(keys)))
    rng.shuffle(order)
    turn = iter(range(1 << 62))

    async def one(due: float) -> None:
        # nodes in turn, as agents report: one report of a node in flight at a time
        node_id, secret = keys[order[next(turn) % len(order)]]
        seqs[node_id] = seqs.get(node_id, 0) + 1
        body = bodies.make(seqs[node_id])
        conn = await pool.get()
        sent = time.perf_counter()
        lags.append(sent - due)  # waiting for a free connection, and the generator's own delay
        try:
            code, _ = await asyncio.wait_for(conn.post(REPORT_PATH, f"Node {secret}", body), 30)
            services.append(time.perf_counter() - sent)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            conn.writer, code = None, 0
        pool.put_nowait(conn)
        latencies.append(time.perf_counter() - due)
        statuses[code] = statuses.get(code, 0) + 1

    elapsed = await drive(one, rate, seconds, connections)
    return {
        "offered_per_s": rate,
        "reports_per_s": round(len(latencies) / elapsed, 1),
        **latency_figures(latencies),
        "ok": statuses.get(200, 0),
        "errors": sum(v for k, v in statuses.items() if k != 200),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "send_lag_p99_ms": round(float(np.percentile(np.array(lags) * 1000, 99)), 1),
        "answer_p99_ms": round(float(np.percentile(np.array(services) * 1000, 99)), 1),
    }


def _serve(port: int, servers: int) -> list[subprocess.Popen]:
    log = open(os.path.join(os.environ["MYRIAD_DATA_DIR"], "server.log"), "ab")  # noqa: SIM115
    procs = [
        subprocess.Popen(
            web_command(port, servers),
            env={**os.environ, "MYRIAD_LOG_LEVEL": "WARNING"},
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    ]
    deadline = time.monotonic() + 60
    answered = 0
    while time.monotonic() < deadline and answered < 8:  # answers from the workers, not just a socket
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /api/v1/agent/report/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 405"):
                    answered += 1
        except OSError:
            time.sleep(0.3)
    if answered < 8:
        raise SystemExit("the server did not start")
    return procs


def _settle() -> None:
    """What a long-running cluster's database already is: vacuumed and analysed, its dirty pages
    written (as pgbench vacuums before it measures), so the 100k-GPU build just made is not
    vacuumed and checkpointed while reports are timed."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE")
            cursor.execute("CHECKPOINT")
        else:
            cursor.execute("ANALYZE")
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def child(args) -> None:
    setup_django()
    from django.core.management import call_command

    from cluster.models import NodeCredential

    t0 = time.perf_counter()
    call_command("build_cluster", args.cluster, verbosity=0)
    keys = _credentials()  # the build wrote every node's eight rail ports (mlx5_<r>/1)
    _settle()
    setup_s = time.perf_counter() - t0
    port = free_port()
    procs = _serve(port, args.servers)
    seqs: dict[int, int] = {}
    # the generator's own pauses would count as the server's latency: no collector passes
    # while it sends (what it allocates is freed by reference counting)
    gc.freeze()
    gc.disable()
    try:
        net = not args.no_net
        asyncio.run(_load(port, keys, 200, 3, args.connections, seqs, net))  # warm up every process
        steady = asyncio.run(_load(port, keys, args.rate, args.seconds, args.connections, seqs, net))
        most = asyncio.run(_load(port, keys, None, 10, args.connections, seqs, net))
    finally:
        gc.enable()
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(20)
    accepted = sum(NodeCredential.objects.values_list("reports_accepted", flat=True))
    with open(os.path.join(os.environ["MYRIAD_DATA_DIR"], "server.log"), "rb") as f:
        errors = [line for line in f.read().decode(errors="replace").splitlines() if "Error" in line]
    if errors:
        print("server errors:", *errors[:5], sep="\n", file=sys.stderr)
    sent = sum(seqs.values())
    print(
        json.dumps(
            {
                "nodes": len(keys),
                "setup_s": round(setup_s, 1),
                "steady": steady,
                "most": most,
                "reports_sent": sent,
                "reports_accepted": accepted,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--rate", type=float, default=TARGET_RATE)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--no-net", action="store_true", help="reports without the NIC ports' summaries")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    extra = [
        "--cluster",
        args.cluster,
        "--rate",
        str(args.rate),
        "--seconds",
        str(args.seconds),
        "--connections",
        str(args.connections),
        "--servers",
        str(args.servers),
        *(["--no-net"] if args.no_net else []),
    ]
    results = run_per_backend("bench.ingest", extra, redis_with_postgres=True, show_stderr=True)
    rows = []
    for backend, r in results.items():
        for phase in ("steady", "most"):
            f = r[phase]
            rows.append(
                (
                    backend,
                    "fixed rate" if phase == "steady" else "as fast as answered",
                    f"{f['offered_per_s']:.0f}" if f["offered_per_s"] else "-",
                    f["reports_per_s"],
                    f["p50_ms"],
                    f["p99_ms"],
                    f["answer_p99_ms"],
                    f["max_ms"],
                    f["errors"],
                )
            )
    print_table(
        f"Node reports over HTTP loopback ({args.cluster}, {args.servers} server process(es), "
        f"{args.connections} connections; target {TARGET_RATE}/s with p99 < {TARGET_P99_MS:.0f} ms)",
        rows,
        (
            "backend",
            "load",
            "offered/s",
            "reports/s",
            "p50 ms",
            "p99 ms",
            "answer p99 ms",
            "max ms",
            "errors",
        ),
    )
    main_backend = results.get("postgresql") or results["sqlite"]
    figures = {
        "benchmark": "ingest",
        "cluster": args.cluster,
        "servers": args.servers,
        "reports_per_s": main_backend["steady"]["reports_per_s"],
        "p99_ms": main_backend["steady"]["p99_ms"],
        "answer_p99_ms": main_backend["steady"]["answer_p99_ms"],
        "max_reports_per_s": main_backend["most"]["reports_per_s"],
        "backends": {
            b: {
                "reports_per_s": r["steady"]["reports_per_s"],
                "p99_ms": r["steady"]["p99_ms"],
                "max_reports_per_s": r["most"]["reports_per_s"],
                "accepted": r["reports_accepted"],
                "sent": r["reports_sent"],
            }
            for b, r in results.items()
        },
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
