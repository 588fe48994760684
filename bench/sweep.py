"""A what-if sweep fanned out over Celery workers: four configurations of a 100k-GPU cluster on one
simulations worker, then on two.

    python -m bench.sweep [--cluster 100k] [--days 3] [--workers 1 2]

Per backend (SQLite with the embedded file-system broker; PostgreSQL with Redis as the broker),
in a fresh database: for each worker count, that many Celery worker processes consuming the
``simulations`` queue are started and waited for; a simulation with four configurations is
stored and its task sent, as ``POST /api/v1/simulations/`` does; the time counts from the send
until the report is assembled. Target: two workers at least 1.7x faster than one (JSON key
``speedup``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from bench._backends import print_table, run_per_backend, setup_django

CONFIGS = ["baseline", "checkpoint=periodic:3600", "checkpoint=async:1800", "spares=4"]
TARGET_SPEEDUP = 1.7


def _workers(n: int, folder: Path) -> list[subprocess.Popen]:
    from scheduling.worker import worker_command

    procs, logs = [], []
    for i in range(n):
        log = folder / f"worker-{n}-{i}.log"
        logs.append(log)
        command = worker_command(loglevel="info", queues=("simulations",)) + [f"--hostname=sim{i}@bench"]
        procs.append(
            subprocess.Popen(
                command,
                env=os.environ.copy(),
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not all("ready" in log.read_text() for log in logs):
        time.sleep(0.2)
    if not all("ready" in log.read_text() for log in logs):
        raise SystemExit(f"the workers did not start; see {folder}")
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    import signal

    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def child(args) -> None:
    setup_django()
    from django.core.management import call_command

    from monitoring.models import Simulation
    from monitoring.tasks import run_simulation_task

    call_command("migrate", verbosity=0)
    folder = Path(os.environ["MYRIAD_DATA_DIR"])
    out = {}
    for n in args.workers:
        procs = _workers(n, folder)
        try:
            sim = Simulation.objects.create(
                name=f"sweep on {n}", cluster=args.cluster, days=args.days, seed=7, configurations=CONFIGS
            )
            t0 = time.perf_counter()
            run_simulation_task.delay(sim.pk)
            while True:
                sim.refresh_from_db()
                if sim.state in (Simulation.State.DONE, Simulation.State.FAILED):
                    break
                if time.perf_counter() - t0 > 1800:
                    raise SystemExit("the sweep did not finish within 30 minutes")
                time.sleep(0.2)
            elapsed = time.perf_counter() - t0
        finally:
            _stop(procs)
        if sim.state != Simulation.State.DONE:
            raise SystemExit(f"the sweep failed: {sim.error}")
        parts = list(sim.parts.order_by("index"))
        out[str(n)] = {
            "seconds": round(elapsed, 2),
            "parts_s": [round((p.finished_at - p.started_at).total_seconds(), 1) for p in parts],
            "report_s": round((sim.finished_at - max(p.finished_at for p in parts)).total_seconds(), 1),
            "workers_used": sim.summary.get("workers", []),
        }
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    extra = ["--cluster", args.cluster, "--days", str(args.days), "--workers", *map(str, args.workers)]
    results = run_per_backend("bench.sweep", extra, redis_with_postgres=True, show_stderr=False)
    rows = []
    for backend, r in results.items():
        base = r[str(args.workers[0])]["seconds"]
        for n in args.workers:
            f = r[str(n)]
            rows.append(
                (
                    backend,
                    n,
                    f"{f['seconds']:.1f}",
                    f"{base / f['seconds']:.2f}",
                    len(f["workers_used"]),
                    " ".join(f"{x:.1f}" for x in f["parts_s"]),
                    f"{f['report_s']:.1f}",
                )
            )
    print_table(
        f"What-if sweep: {len(CONFIGS)} configurations, {args.cluster}, {args.days:g} days "
        f"(target: 2 workers >= {TARGET_SPEEDUP}x faster than 1)",
        rows,
        ("backend", "workers", "seconds", "speed-up", "workers used", "each configuration s", "report s"),
    )
    main_backend = results.get("postgresql") or results["sqlite"]
    first, last = str(args.workers[0]), str(args.workers[-1])
    print(
        json.dumps(
            {
                "benchmark": "sweep",
                "cluster": args.cluster,
                "days": args.days,
                "configurations": len(CONFIGS),
                "speedup": round(main_backend[first]["seconds"] / main_backend[last]["seconds"], 2),
                "backends": {
                    b: {n: r[n]["seconds"] for n in r}
                    | {"speedup": round(r[first]["seconds"] / r[last]["seconds"], 2)}
                    for b, r in results.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
