"""Who used what at 100k GPUs: a month's usage report, and what one sample adds to the sampler.

    python -m bench.usage [--cluster 100k] [--jobs 2000] [--days 30] [--preemptions 50000]

Per backend (SQLite with the embedded stores; PostgreSQL with Redis), in a fresh database: the
busy 100k cluster (the example queues, ``--jobs`` jobs, two cycles); one sample's rollup
(``record_usage`` with a frame of every GPU); then ``--days`` days of rollups (one sample a day
standing for the day's) and ``--preemptions`` preempted events spread over them; then the month's
report through the API (``GET /api/v1/usage/?since=&until=``, server time through Django's test
client, best of 3) and its CSV. Target: the month in under 2 s (JSON key ``month_s``).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import numpy as np

from bench._backends import busy_cluster, print_table, run_per_backend, setup_django

TARGET_S = 2.0


def child(args) -> None:
    setup_django()
    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from cluster.models import ChipType
    from cluster.snapshot import topology_cache
    from scheduling.chargeback import record_usage
    from scheduling.models import Job, JobEvent, UsageDay

    rng = busy_cluster(args.cluster, args.jobs, 20261205)
    n = topology_cache.current().num_gpus
    util = rng.integers(0, 101, n).astype(np.uint8)
    now = timezone.now()
    started = time.perf_counter()
    record_usage(now, 60, util)
    sample_s = time.perf_counter() - started
    for d in range(1, args.days):
        record_usage(now - timedelta(days=d), 86400, util)
    jobs = list(Job.objects.values_list("id", flat=True))
    chips = list(ChipType.objects.values_list("id", flat=True))
    first = now - timedelta(days=args.days - 1)
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job_id=int(rng.choice(jobs)),
                kind="preempted",
                at=first + timedelta(seconds=float(rng.uniform(0, (args.days - 1) * 86400))),
                reason="bench",
                data={"lost_s": float(rng.uniform(1, 3600)), "gpus": 8, "chip_id": int(rng.choice(chips))},
            )
            for _ in range(args.preemptions)
        ],
        batch_size=5000,
    )
    client = Client()
    client.force_login(User.objects.create_user("bench-viewer", is_staff=True, is_superuser=True))
    query = {"since": first.date().isoformat(), "until": now.date().isoformat()}

    def timed(path: str):
        t0 = time.perf_counter()
        answer = client.get(path, query)
        elapsed = time.perf_counter() - t0
        assert answer.status_code == 200, answer.content[:300]
        return elapsed, answer

    month_s, answer = min((timed("/api/v1/usage/") for _ in range(3)), key=lambda r: r[0])
    csv_s, exported = min((timed("/api/v1/usage/csv/") for _ in range(3)), key=lambda r: r[0])
    data = answer.json()
    print(
        json.dumps(
            {
                "gpus": n,
                "usage_rows": UsageDay.objects.count(),
                "preemptions": args.preemptions,
                "report_rows": len(data["rows"]),
                "sample_ms": round(sample_s * 1000, 1),
                "month_s": round(month_s, 3),
                "csv_s": round(csv_s, 3),
                "csv_bytes": len(exported.content),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--preemptions", type=int, default=50_000)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    extra = ["--cluster", args.cluster, "--jobs", str(args.jobs), "--days", str(args.days)]
    extra += ["--preemptions", str(args.preemptions)]
    results = run_per_backend("bench.usage", extra, redis_with_postgres=True, show_stderr=False)
    rows = [
        (
            backend,
            f"{r['usage_rows']:,} rollup rows, {r['preemptions']:,} preemptions",
            f"{r['sample_ms']:.1f}",
            f"{r['month_s']:.3f} ({r['report_rows']:,} rows)",
            f"{r['csv_s']:.3f} ({r['csv_bytes']:,} bytes)",
        )
        for backend, r in results.items()
    ]
    print_table(
        f"Usage at {args.cluster} ({args.days} days; server time, best of 3; "
        f"target: the month in < {TARGET_S:.0f} s)",
        rows,
        ("backend", "history", "one sample ms", "month report s", "month CSV s"),
    )
    main_backend = results.get("postgresql") or results["sqlite"]
    print(
        json.dumps(
            {
                "benchmark": "usage",
                "cluster": args.cluster,
                "days": args.days,
                "month_s": main_backend["month_s"],
                "sample_ms": main_backend["sample_ms"],
                "backends": {
                    b: {k: r[k] for k in ("month_s", "csv_s", "sample_ms")} for b, r in results.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
