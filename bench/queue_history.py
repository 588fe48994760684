"""Queue history with a million jobs behind it: a week's and a month's report.

    python -m bench.queue_history [--jobs 1000000] [--days 90]

Per backend (SQLite; PostgreSQL), in a fresh database: the demo cluster and its queues, then
``--jobs`` finished jobs spread evenly over ``--days`` days, each with its submitted, admitted (with
the wait it ended) and finished events, one in twenty preempted once, and 200 jobs pending now;
then the history of the last 7 and the last 30 days through the API
(``GET /api/v1/queue-history/``, server time through Django's test client, best of 3). JSON keys:
``week_s``, ``month_s``, ``events``.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import numpy as np

from bench._backends import print_table, run_per_backend, setup_django


def _history(args, rng, now) -> int:
    """Write the jobs and their events in batches; returns the events written."""
    from scheduling.models import Job, JobEvent, Queue

    queues = list(Queue.objects.exclude(name="inference"))
    span = args.days * 86400.0
    written, batch = 0, 50_000
    for start in range(0, args.jobs, batch):
        n = min(batch, args.jobs - start)
        submitted = np.sort(rng.uniform(0, span - 7200, n))
        waits = rng.exponential(600.0, n)
        runs = rng.uniform(600, 6 * 3600, n)
        picks = rng.integers(0, len(queues), n)
        jobs = Job.objects.bulk_create(
            [
                Job(
                    name=f"h-{start + i}",
                    queue=queues[picks[i]],
                    gpus=8,
                    chip_types=["H100-SXM"],
                    state="finished",
                    submitted_at=now - timedelta(seconds=span - submitted[i]),
                    finished_at=now - timedelta(seconds=max(0.0, span - submitted[i] - waits[i] - runs[i])),
                )
                for i in range(n)
            ],
            batch_size=5000,
        )
        events = []
        for i, job in enumerate(jobs):
            at = job.submitted_at
            admitted = at + timedelta(seconds=float(waits[i]))
            events.append(JobEvent(job=job, kind="submitted", at=at, reason="bench"))
            events.append(
                JobEvent(
                    job=job,
                    kind="admitted",
                    at=admitted,
                    reason="bench",
                    data={"chip": "H100-SXM", "gpus": 8, "wait_s": float(waits[i])},
                )
            )
            if i % 20 == 0:
                events.append(
                    JobEvent(
                        job=job,
                        kind="preempted",
                        at=admitted + timedelta(seconds=60),
                        reason="bench",
                        data={"lost_s": 60.0, "gpus": 8},
                    )
                )
            events.append(JobEvent(job=job, kind="finished", at=job.finished_at, reason="bench"))
        JobEvent.objects.bulk_create(events, batch_size=10_000)
        written += len(events)
    Job.objects.bulk_create(
        [
            Job(
                name=f"p-{i}",
                queue=queues[i % len(queues)],
                gpus=8,
                chip_types=["H100-SXM"],
                submitted_at=now,
            )
            for i in range(200)
        ]
    )
    return written


def child(args) -> None:
    setup_django()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    call_command("build_cluster", "demo", verbosity=0)
    call_command("seed_queues", verbosity=0)
    now = timezone.now()
    started = time.perf_counter()
    events = _history(args, np.random.default_rng(20261206), now)
    build_s = time.perf_counter() - started
    client = Client()
    client.force_login(User.objects.create_user("bench-history", is_staff=True, is_superuser=True))

    def timed(days: int) -> tuple[float, dict]:
        query = {"since": (now - timedelta(days=days)).isoformat(), "until": now.isoformat()}
        t0 = time.perf_counter()
        answer = client.get("/api/v1/queue-history/", query)
        elapsed = time.perf_counter() - t0
        assert answer.status_code == 200, answer.content[:300]
        return elapsed, answer.json()

    week_s, week = min((timed(7) for _ in range(3)), key=lambda r: r[0])
    month_s, month = min((timed(30) for _ in range(3)), key=lambda r: r[0])
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "events": events,
                "build_s": round(build_s, 1),
                "week_admissions": sum(r["admissions"] for r in week["queues"]),
                "month_admissions": sum(r["admissions"] for r in month["queues"]),
                "week_s": round(week_s, 3),
                "month_s": round(month_s, 3),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results = run_per_backend("bench.queue_history", ["--jobs", str(args.jobs), "--days", str(args.days)])
    rows = [
        (
            backend,
            f"{r['jobs']:,} jobs, {r['events']:,} events",
            f"{r['week_s']:.3f} ({r['week_admissions']:,} admissions)",
            f"{r['month_s']:.3f} ({r['month_admissions']:,} admissions)",
        )
        for backend, r in results.items()
    ]
    print_table(
        f"Queue history over {args.days} days of jobs (server time, best of 3)",
        rows,
        ("backend", "history", "last 7 days s", "last 30 days s"),
    )
    main_backend = results.get("postgresql") or results["sqlite"]
    print(
        json.dumps(
            {
                "benchmark": "queue_history",
                "jobs": args.jobs,
                "events": main_backend["events"],
                "week_s": main_backend["week_s"],
                "month_s": main_backend["month_s"],
                "backends": {b: {k: r[k] for k in ("week_s", "month_s")} for b, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
