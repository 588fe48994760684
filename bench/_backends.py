"""Run a benchmark body once per database backend, each in a fresh process on a fresh database.

SQLite gets a new file in a temporary folder; PostgreSQL gets the database ``myriad_bench``
(dropped and created) on MYRIAD_BENCH_PG (default postgres://postgres@127.0.0.1:5432), and is
skipped with a note when no server answers there. Benchmarks that ask for it run PostgreSQL with
Redis at MYRIAD_BENCH_REDIS (default redis://127.0.0.1:6379/14, flushed first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

PG_BASE = os.environ.get("MYRIAD_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("MYRIAD_BENCH_REDIS", "redis://127.0.0.1:6379/14")


def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True, connect_timeout=3) as conn:
            conn.execute("DROP DATABASE IF EXISTS myriad_bench")
            conn.execute("CREATE DATABASE myriad_bench")
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means "no server to measure"
        print(f"(PostgreSQL not measured: {exc})", file=sys.stderr)
        return False


def _redis_available() -> bool:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        client.flushdb()
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means "measure without Redis"
        print(f"(Redis not used: {exc})", file=sys.stderr)
        return False


def run_per_backend(
    module: str,
    extra_args: list[str] | None = None,
    *,
    redis_with_postgres: bool = False,
    show_stderr: bool = False,
) -> dict[str, dict]:
    """Run ``python -m module --child`` per backend; each child prints one JSON line last.
    ``redis_with_postgres``: the PostgreSQL run also uses Redis (Celery broker, cycle marker,
    channel layer) as a production deployment does; the SQLite run stays on the embedded stores."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends = {"sqlite": {"MYRIAD_DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3"}}
        if _pg_available():
            backends["postgresql"] = {"MYRIAD_DATABASE_URL": f"{PG_BASE}/myriad_bench"}
            if redis_with_postgres and _redis_available():
                backends["postgresql"]["MYRIAD_REDIS_URL"] = REDIS_URL
        only = [b for b in os.environ.get("MYRIAD_BENCH_BACKENDS", "").split(",") if b]
        for name, env in backends.items():
            if only and name not in only:
                continue
            child_env = {**os.environ, "MYRIAD_DATA_DIR": tmp}
            child_env.pop("MYRIAD_REDIS_URL", None)
            child_env.update(env)
            out = subprocess.run(
                [sys.executable, "-m", module, "--child", *(extra_args or [])],
                env=child_env,
                capture_output=True,
                text=True,
            )
            if show_stderr and out.stderr:
                sys.stderr.write(f"({name}) {out.stderr[-2000:]}")
            if out.returncode != 0:
                sys.stderr.write(out.stdout + out.stderr)
                raise SystemExit(f"benchmark child for {name} failed")
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def setup_django() -> None:
    import django
    from django.core.management import call_command

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    call_command("migrate", verbosity=0)


def busy_cluster(cluster: str, jobs: int, seed: int):
    """Build ``cluster`` with the example queues, submit ``jobs`` jobs (8 to 1,024 H100s each,
    seeded) and run two scheduling cycles: admissions, pending reasons and events, as a running
    cluster has them. Returns the random generator, for what the benchmark draws next."""
    import numpy as np
    from django.core.management import call_command
    from django.utils import timezone

    from scheduling.cycle import run_cycle
    from scheduling.models import Job, Queue

    call_command("build_cluster", cluster, verbosity=0)
    call_command("seed_queues", verbosity=0)
    rng = np.random.default_rng(seed)
    queues = list(Queue.objects.exclude(name="inference"))
    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                name=f"bench-{i}",
                queue=queues[i % len(queues)],
                gpus=int(rng.choice([8, 16, 64, 256, 1024])),
                chip_types=["H100-SXM"],
                submitted_at=now,
            )
            for i in range(jobs)
        ],
        batch_size=1000,
    )
    run_cycle()
    run_cycle()
    return rng


def print_table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(title)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
