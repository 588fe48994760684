"""Per-job efficiency and wasted GPUs at 100k GPUs: what each telemetry frame adds to its writer.

    python -m bench.efficiency [--cluster 100k] [--jobs 2000] [--frames 20]

Per backend (SQLite with the embedded stores; PostgreSQL with Redis), in a fresh database: the
cluster is built with the example queues, ``--jobs`` jobs submitted and two scheduling cycles run,
then ``--frames`` frames of every GPU (a tenth of the held GPUs idle) are brought forward with
``monitoring.telemetry.efficiency.observe``, as the fleet's tick and the agents' compose call it
after writing a frame: the time per frame without the once-a-minute write of the totals, and the
time of a frame with it (one bulk upsert of every running job's row). Then the wasted GPUs per
queue, as ``/metrics`` reads them. JSON keys: ``observe_ms`` (median per frame), ``flush_ms``,
``wasted_ms``, ``ettr_goal_ms`` (the running jobs' ETTR against their goals, as ``/metrics``
computes it for ``myriad_jobs_below_ettr_goal``), ``held_gpus``, ``running_jobs``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import numpy as np

from bench._backends import busy_cluster, print_table, run_per_backend, setup_django

FIGURES = ("observe_ms", "flush_ms", "wasted_ms", "ettr_goal_ms", "held_gpus", "running_jobs")


def child(args) -> None:
    setup_django()
    from django.conf import settings
    from django.utils import timezone

    from cluster.snapshot import topology_cache
    from engine.frames import FRAME_METRICS
    from monitoring.telemetry import efficiency
    from monitoring.telemetry.alert_metrics import jobs_below_ettr_goal
    from scheduling.models import Job, JobEvent
    from scheduling.store import allocations

    settings.IDLE_AFTER_S = 0.0  # every idle GPU counts as wasted at once: the largest answer
    rng = busy_cluster(args.cluster, args.jobs, 20261204)
    snap = topology_cache.current()
    n = snap.num_gpus
    pairs = allocations.active_pairs()
    held = topology_cache.gpu_indices(pairs[:, 1])
    idle = rng.choice(held, size=len(held) // 10, replace=False)
    frame = {m: rng.integers(20, 101, n).astype(np.uint8) for m in FRAME_METRICS}
    frame["util"][idle] = 1
    t0 = time.time()
    efficiency.FLUSH_S = 1e12  # frames without the write of the totals
    efficiency.observe(frame, t0)  # the first: every job's totals seeded from the database
    per_frame = []
    for k in range(1, args.frames + 1):
        started = time.perf_counter()
        efficiency.observe(frame, t0 + 5 * k)
        per_frame.append(time.perf_counter() - started)
    efficiency.FLUSH_S = 0.0
    started = time.perf_counter()
    efficiency.observe(frame, t0 + 5 * (args.frames + 1))
    flush_s = time.perf_counter() - started
    started = time.perf_counter()
    wasted = efficiency.wasted_by_queue()
    wasted_s = time.perf_counter() - started
    # the running jobs two hours old, as a busy cluster's are: each one's ETTR against its goal
    earlier = timezone.now() - timedelta(hours=2)
    Job.objects.update(submitted_at=earlier)
    JobEvent.objects.update(at=earlier)
    started = time.perf_counter()
    below = jobs_below_ettr_goal()
    ettr_goal_s = time.perf_counter() - started
    print(
        json.dumps(
            {
                "gpus": n,
                "held_gpus": len(held),
                "running_jobs": int(len(np.unique(pairs[:, 0]))),
                "observe_ms": round(statistics.median(per_frame) * 1000, 1),
                "observe_p90_ms": round(float(np.percentile(per_frame, 90)) * 1000, 1),
                "flush_ms": round(flush_s * 1000, 1),
                "wasted_ms": round(wasted_s * 1000, 1),
                "wasted_gpus": sum(wasted.values()),
                "ettr_goal_ms": round(ettr_goal_s * 1000, 1),
                "below_goal": sum(below.values()),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=20)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    extra = ["--cluster", args.cluster, "--jobs", str(args.jobs), "--frames", str(args.frames)]
    results = run_per_backend("bench.efficiency", extra, redis_with_postgres=True, show_stderr=False)
    rows = [
        (
            backend,
            f"{r['held_gpus']:,} held by {r['running_jobs']:,} jobs",
            f"{r['observe_ms']:.1f} (p90 {r['observe_p90_ms']:.1f})",
            f"{r['flush_ms']:.1f}",
            f"{r['wasted_ms']:.1f} ({r['wasted_gpus']:,} GPUs)",
            f"{r['ettr_goal_ms']:.1f} ({r['below_goal']} below)",
        )
        for backend, r in results.items()
    ]
    print_table(
        f"Efficiency per telemetry frame ({args.cluster}; median of {args.frames} frames)",
        rows,
        (
            "backend",
            "allocations",
            "frame ms",
            "frame + write of totals ms",
            "wasted per queue ms",
            "jobs below ETTR goal ms",
        ),
    )
    main_backend = results.get("postgresql") or results["sqlite"]
    print(
        json.dumps(
            {
                "benchmark": "efficiency",
                "cluster": args.cluster,
                **{k: main_backend[k] for k in FIGURES},
                "backends": {b: {k: r[k] for k in ("observe_ms", "flush_ms")} for b, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
