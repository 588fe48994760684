"""Allocations as one row per GPU (the product until migration 0034) or one row per node with a
mask of its GPUs, each with the database's guarantee that no GPU is held twice, measured on SQLite
and PostgreSQL.

    python -m bench.allocation_rows [--repeats 3]

The workload is a 90% fill of the 100k preset: 90,000 GPUs on 8-GPU nodes, taken by jobs of
1-1,024 GPUs (seeded) packed in GPU order, so small jobs share nodes. Per layout and database, in
a fresh table with the indexes a cycle needs: the insert of every allocation in one transaction
(commit included; COPY on PostgreSQL, one statement that unpacks a JSON document on SQLite, as
``scheduling.store`` writes), the release of every allocation (one UPDATE), the read of the active
ones, and a check that the guarantee holds (a second holder of a held GPU is refused).

The layouts and their guarantees:
- ``gpu``, one row per GPU (``scheduling.models.Allocation`` until migration 0034): a unique
  index on the GPU over the active rows;
- ``node``, one row per job and node, with a guard: on PostgreSQL an exclusion constraint
  (``btree_gist`` and ``intarray``: no two active rows of one node whose GPU slot arrays overlap,
  safe under concurrent writers); on SQLite a trigger that refuses an active row whose mask meets
  an active row of the same node (SQLite has one writer at a time, so the check cannot race);
- ``slots``, one row per job and node with a mask of its GPUs, and one partial unique index on the
  node per GPU slot (``WHERE active AND mask & 4 != 0``...): plain B-tree checks on both databases,
  safe under concurrent writers. Small jobs share nodes in the workload, so rows of one node with
  disjoint masks are accepted in every layout. The product keeps this one since migration 0034
  (per bank of eight GPUs, so nodes of up to 72 GPUs fit one index per bit).

The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._backends import PG_BASE, print_table

GPUS_PER_NODE = 8
FILLED = 90_000  # 90% of the 100k preset
SIZES = (1, 2, 4, 8, 16, 64, 256, 1024)
SIZE_P = (0.30, 0.10, 0.10, 0.20, 0.10, 0.10, 0.06, 0.04)
STAMP = "2026-12-06 00:00:00"


def workload(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(job id, GPU id) of a 90% fill: jobs of random sizes packed in GPU order."""
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < FILLED:
        sizes.append(int(rng.choice(SIZES, p=SIZE_P)))
    sizes[-1] -= sum(sizes) - FILLED
    jobs = np.repeat(np.arange(1, len(sizes) + 1), sizes)
    return jobs, np.arange(FILLED)


def per_node(jobs: np.ndarray, gpus: np.ndarray) -> list[tuple[int, int, int]]:
    """(job id, node id, mask of its GPUs on the node) per job and node."""
    nodes = gpus // GPUS_PER_NODE
    bits = 1 << (gpus % GPUS_PER_NODE)
    key = jobs.astype(np.int64) * 1_000_000 + nodes
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    masks = np.bitwise_or.reduceat(bits, starts)
    return list(zip(jobs[starts].tolist(), nodes[starts].tolist(), masks.tolist(), strict=True))


def slots(mask: int) -> str:
    return "{" + ",".join(str(i) for i in range(GPUS_PER_NODE) if mask >> i & 1) + "}"


def slot_indexes(mask_column: str) -> list[str]:
    """One partial unique index per GPU slot of a node: no two active rows of a node whose masks
    both have that slot (a plain B-tree check, safe under concurrent writers)."""
    return [
        f"CREATE UNIQUE INDEX a_slot{i} ON a (node_id) "
        f"WHERE active AND share = 1000 AND ({mask_column} & {1 << i}) != 0"
        for i in range(GPUS_PER_NODE)
    ]


# --- SQLite --------------------------------------------------------------------------------
SQLITE_SCHEMA = {
    "gpu": [
        "CREATE TABLE a (id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, gpu_id INTEGER NOT NULL, "
        "active INTEGER NOT NULL, share INTEGER NOT NULL, created_at TEXT NOT NULL, released_at TEXT)",
        "CREATE UNIQUE INDEX a_one ON a (gpu_id) WHERE active AND share = 1000",
        "CREATE INDEX a_job ON a (job_id, gpu_id) WHERE active",
    ],
    "node": [
        "CREATE TABLE a (id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, node_id INTEGER NOT NULL, "
        "mask INTEGER NOT NULL, active INTEGER NOT NULL, share INTEGER NOT NULL, created_at TEXT NOT NULL, "
        "released_at TEXT)",
        "CREATE INDEX a_node ON a (node_id) WHERE active",
        "CREATE INDEX a_job ON a (job_id) WHERE active",
        "CREATE TRIGGER a_guard BEFORE INSERT ON a WHEN NEW.active BEGIN "
        "SELECT RAISE(ABORT, 'a GPU is held twice') WHERE EXISTS "
        "(SELECT 1 FROM a WHERE node_id = NEW.node_id AND active AND (mask & NEW.mask) != 0); END",
    ],
    "slots": [
        "CREATE TABLE a (id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, node_id INTEGER NOT NULL, "
        "mask INTEGER NOT NULL, active INTEGER NOT NULL, share INTEGER NOT NULL, created_at TEXT NOT NULL, "
        "released_at TEXT)",
        "CREATE INDEX a_job ON a (job_id) WHERE active",
        *slot_indexes("mask"),
    ],
}


def _sqlite_statements(layout: str, jobs, gpus):
    """(insert, its arguments, rows it writes, a second holder's insert) for SQLite."""
    if layout == "gpu":
        doc: dict[str, list[int]] = {}
        for j, g in zip(jobs.tolist(), gpus.tolist(), strict=True):
            doc.setdefault(str(j), []).append(g)
        insert = (
            "INSERT INTO a (job_id, gpu_id, active, share, created_at) "
            "SELECT CAST(j.key AS INTEGER), g.value, 1, 1000, ? "
            "FROM json_each(?) AS j, json_each(j.value) AS g"
        )
        clash = "INSERT INTO a (job_id, gpu_id, active, share, created_at) VALUES (0, 5, 1, 1000, ?)"
        return insert, (STAMP, json.dumps(doc)), len(gpus), (clash, (STAMP,))
    triples = per_node(jobs, gpus)
    insert = (
        "INSERT INTO a (job_id, node_id, mask, active, share, created_at) SELECT t.value ->> 0, "
        "t.value ->> 1, t.value ->> 2, 1, 1000, ? FROM json_each(?) AS t"
    )
    clash = "INSERT INTO a (job_id, node_id, mask, active, share, created_at) VALUES (0, 0, 32, 1, 1000, ?)"
    return insert, (STAMP, json.dumps(triples)), len(triples), (clash, (STAMP,))


def sqlite_run(layout: str, jobs, gpus, folder: Path) -> dict:
    path = folder / f"{layout}.sqlite3"
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in SQLITE_SCHEMA[layout]:
        db.execute(statement)
    insert, args, rows, clash = _sqlite_statements(layout, jobs, gpus)
    t0 = time.perf_counter()
    db.execute("BEGIN")
    db.execute(insert, args)
    db.execute("COMMIT")
    t1 = time.perf_counter()
    active = db.execute("SELECT * FROM a WHERE active").fetchall()
    t2 = time.perf_counter()
    try:
        db.execute(*clash)
        refused = False
    except sqlite3.IntegrityError:
        refused = True
    t3 = time.perf_counter()
    db.execute("UPDATE a SET active = 0, released_at = ? WHERE active", (STAMP,))
    t4 = time.perf_counter()
    db.close()
    assert len(active) == rows
    return _figures(rows, t1 - t0, t2 - t1, t4 - t3, refused)


# --- PostgreSQL ----------------------------------------------------------------------------
PG_SCHEMA = {
    "gpu": [
        "CREATE TABLE a (id bigserial PRIMARY KEY, job_id integer NOT NULL, gpu_id integer NOT NULL, "
        "active boolean NOT NULL, share smallint NOT NULL, created_at timestamptz NOT NULL, "
        "released_at timestamptz)",
        "CREATE UNIQUE INDEX a_one ON a (gpu_id) WHERE active AND share = 1000",
        "CREATE INDEX a_job ON a (job_id, gpu_id) WHERE active",
    ],
    "node": [
        "CREATE EXTENSION IF NOT EXISTS btree_gist",
        "CREATE EXTENSION IF NOT EXISTS intarray",
        "CREATE TABLE a (id bigserial PRIMARY KEY, job_id integer NOT NULL, node_id integer NOT NULL, "
        "slots integer[] NOT NULL, active boolean NOT NULL, share smallint NOT NULL, "
        "created_at timestamptz NOT NULL, released_at timestamptz, "
        "EXCLUDE USING gist (node_id WITH =, slots gist__int_ops WITH &&) WHERE (active AND share = 1000))",
        "CREATE INDEX a_job ON a (job_id) WHERE active",
    ],
    "slots": [
        "CREATE TABLE a (id bigserial PRIMARY KEY, job_id integer NOT NULL, node_id integer NOT NULL, "
        "mask smallint NOT NULL, active boolean NOT NULL, share smallint NOT NULL, "
        "created_at timestamptz NOT NULL, released_at timestamptz)",
        "CREATE INDEX a_job ON a (job_id) WHERE active",
        *slot_indexes("mask"),
    ],
}


def _pg_statements(layout: str, jobs, gpus):
    """(COPY statement, its rows as text, rows it writes, a second holder's insert) for PostgreSQL.
    Per node, the GPUs are a mask (``slots``) or an array of slot numbers (``node``, for the
    exclusion constraint)."""
    if layout == "gpu":
        block = "".join(
            f"{j}\t{g}\tt\t1000\t{STAMP}\n" for j, g in zip(jobs.tolist(), gpus.tolist(), strict=True)
        )
        copy = "COPY a (job_id, gpu_id, active, share, created_at) FROM STDIN"
        clash = (
            f"INSERT INTO a (job_id, gpu_id, active, share, created_at) VALUES (0, 5, true, 1000, '{STAMP}')"
        )
        return copy, block, len(gpus), clash
    column, held, second = ("mask", str, "32") if layout == "slots" else ("slots", slots, "'{5}'")
    triples = per_node(jobs, gpus)
    block = "".join(f"{j}\t{n}\t{held(m)}\tt\t1000\t{STAMP}\n" for j, n, m in triples)
    copy = f"COPY a (job_id, node_id, {column}, active, share, created_at) FROM STDIN"
    clash = (
        f"INSERT INTO a (job_id, node_id, {column}, active, share, created_at) "
        f"VALUES (0, 0, {second}, true, 1000, '{STAMP}')"
    )
    return copy, block, len(triples), clash


def pg_run(layout: str, jobs, gpus, url: str) -> dict:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS a")
        for statement in PG_SCHEMA[layout]:
            db.execute(statement)
        copy, block, rows, clash = _pg_statements(layout, jobs, gpus)
        t0 = time.perf_counter()
        with db.transaction(), db.cursor() as cursor, cursor.copy(copy) as out:
            out.write(block)
        t1 = time.perf_counter()
        active = db.execute("SELECT * FROM a WHERE active").fetchall()
        t2 = time.perf_counter()
        try:
            db.execute(clash)
            refused = False
        except (psycopg.errors.UniqueViolation, psycopg.errors.ExclusionViolation):
            refused = True
        t3 = time.perf_counter()
        db.execute("UPDATE a SET active = false, released_at = now() WHERE active")
        t4 = time.perf_counter()
        db.execute("DROP TABLE a")
    assert len(active) == rows
    return _figures(rows, t1 - t0, t2 - t1, t4 - t3, refused)


def _figures(rows: int, insert_s: float, read_s: float, release_s: float, refused: bool) -> dict:
    return {
        "rows": rows,
        "insert_ms": round(insert_s * 1000, 1),
        "read_ms": round(read_s * 1000, 1),
        "release_ms": round(release_s * 1000, 1),
        "second_holder_refused": refused,
    }


def _pg_url() -> str | None:
    try:
        import psycopg

        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True, connect_timeout=3) as conn:
            conn.execute("DROP DATABASE IF EXISTS myriad_bench_alloc")
            conn.execute("CREATE DATABASE myriad_bench_alloc")
        return f"{PG_BASE}/myriad_bench_alloc"
    except Exception as exc:  # noqa: BLE001 - any failure means "no server to measure"
        print(f"(PostgreSQL not measured: {exc})")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocation_rows")
    parser.add_argument("--repeats", type=int, default=3, help="runs per layout and database (median kept)")
    args = parser.parse_args(argv)
    jobs, gpus = workload()
    url = _pg_url()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for db in ("sqlite", "postgresql"):
            if db == "postgresql" and url is None:
                continue
            for layout in ("gpu", "node", "slots"):
                runs = [
                    sqlite_run(layout, jobs, gpus, Path(tmp))
                    if db == "sqlite"
                    else pg_run(layout, jobs, gpus, url)
                    for _ in range(args.repeats)
                ]
                median = {
                    k: float(np.median([r[k] for r in runs])) for k in ("insert_ms", "read_ms", "release_ms")
                }
                refused = all(r["second_holder_refused"] for r in runs)
                results[f"{db}_{layout}"] = {
                    "rows": runs[0]["rows"],
                    **median,
                    "second_holder_refused": refused,
                }
    print_table(
        f"Allocations of a 90% fill of 100k GPUs ({len(set(jobs.tolist())):,} jobs), "
        f"median of {args.repeats}",
        [
            (
                key.replace("_", " / ")
                .replace("gpu", "row per GPU")
                .replace("node", "row per node, guard")
                .replace("slots", "row per node, slot indexes"),
                f"{r['rows']:,}",
                f"{r['insert_ms']:.1f}",
                f"{r['read_ms']:.1f}",
                f"{r['release_ms']:.1f}",
                "yes" if r["second_holder_refused"] else "NO",
            )
            for key, r in results.items()
        ],
        ("database / layout", "rows", "insert ms", "read active ms", "release ms", "second holder refused"),
    )
    print(json.dumps({"benchmark": "allocation_rows", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
