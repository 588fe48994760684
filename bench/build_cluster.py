"""Build the 100k preset (100,000 GPUs on 12,500 nodes) and load its topology snapshot.

    python -m bench.build_cluster [--preset 100k]

Measures, on SQLite and on PostgreSQL: validate + build (one transaction, bulk inserts),
rebuild with --replace, and the snapshot loader (median of 5 loads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench._backends import print_table, run_per_backend, setup_django


def child(preset: str) -> dict:
    setup_django()
    from cluster.builder import build_cluster
    from cluster.snapshot import load_topology
    from cluster.topology_files import resolve_topology

    t0 = time.perf_counter()
    spec = resolve_topology(preset)
    result = build_cluster(spec)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_cluster(resolve_topology(preset), replace=True)
    rebuild_s = time.perf_counter() - t0
    loads = []
    for _ in range(5):
        t0 = time.perf_counter()
        snap = load_topology()
        loads.append(time.perf_counter() - t0)
    assert snap.num_gpus == result.gpus
    return {
        "gpus": result.gpus,
        "nodes": result.nodes,
        "build_s": round(build_s, 2),
        "rebuild_s": round(rebuild_s, 2),
        "snapshot_load_ms": round(statistics.median(loads) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="100k")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.preset)))
        return
    results = run_per_backend("bench.build_cluster", ["--preset", args.preset])
    rows = [
        (
            name,
            f"{r['gpus']:,}",
            f"{r['nodes']:,}",
            f"{r['build_s']:.2f}",
            f"{r['rebuild_s']:.2f}",
            f"{r['snapshot_load_ms']:.0f}",
        )
        for name, r in results.items()
    ]
    print_table(
        f"build_cluster {args.preset}",
        rows,
        ("database", "GPUs", "nodes", "build s", "rebuild s", "snapshot load ms"),
    )
    sys.stdout.flush()
    print(
        json.dumps(
            {
                "benchmark": "build_cluster",
                "preset": args.preset,
                **{
                    f"{db}_{k}": v
                    for db, r in results.items()
                    for k, v in r.items()
                    if k not in ("gpus", "nodes")
                },
            }
        )
    )


if __name__ == "__main__":
    main()
