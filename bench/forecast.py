"""Expected starts backtested: a seeded week at 10k and at 100k GPUs, every forecast against what happened.

    python -m bench.forecast [--sizes 10k,100k] [--days 7] [--load 0.95]

Per size: the preset's cluster, a trace-calibrated week at ``--load`` (sim.workload.generate, seed 1)
in the what-if simulator with production's engine; every ``every`` of simulated time (30 minutes at
10k, an hour at 100k: the production default is a minute, the backtest thins it for time) every
pending job is forecast as production's refresh does (sim.forecast.Backtest), and each job
submitted since the last refresh, tried by a cycle and still waiting keeps its first forecast.
Scored against its real start: ``median_abs_error_s`` (|p50 - start|), ``median_wait_s`` (submit to start),
``p90_coverage`` (the share that started before their p90), ``beyond_horizon``. Then ``refresh_s``:
one refresh of 10,000 pending jobs of 1 to 2,048 GPUs on the same cluster after three cycles of
filling it (bench.workloads.mixed_workload), with the arrivals of the last six hours to come.
Targets: 0.85 <= p90_coverage <= 0.95, median_abs_error_s < median_wait_s / 3, refresh_s < 5.

Then production's refresh end to end, per backend (SQLite; PostgreSQL): the 100k preset in a fresh
database with its example queues, 10,500 jobs of 8 to 1,024 H100s submitted and two cycles run
(bench._backends.busy_cluster), then ``scheduling.forecast.refresh`` (read, play, write every
pending job's row) twice: ``<db>_refresh_s`` is the second, ``<db>_refresh_pending`` its jobs.
"""

from __future__ import annotations

import argparse
import json
import time

from bench._backends import busy_cluster, print_table, run_per_backend, setup_django
from bench.scheduling_engine import _apply
from bench.workloads import mixed_workload
from engine.chips import BY_NAME
from engine.forecast import Arrivals, ForecastConfig, expected_starts
from engine.placement import Layout
from engine.presets import preset_document
from engine.scheduler import schedule
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from sim.config import SimConfig
from sim.forecast import Backtest
from sim.workload import generate

EVERY_S = {"10k": 1800.0, "100k": 3600.0}


def backtest(size: str, days: float, load: float) -> dict:
    topo = snapshot_from_spec(parse_topology(preset_document(size), set(BY_NAME)))
    capacity = {c: n for c, n in topo.count_by_chip().items() if n}
    jobs = generate(capacity, days, seed=1, target_load=load)
    t0 = time.perf_counter()
    sim = Backtest(topo, jobs, SimConfig(days=days, seed=1), every_s=EVERY_S.get(size, 3600.0))
    out = sim.run()
    report = sim.report()
    return {
        "gpus": topo.num_gpus,
        "jobs": len(jobs),
        "allocated_mean": out["utilization"]["allocated_mean"],
        **report,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def refresh_time(size: str, pending_jobs: int = 10_000) -> dict:
    """One refresh of ``pending_jobs`` pending on the preset after three filling cycles."""
    topo = snapshot_from_spec(parse_topology(preset_document(size), set(BY_NAME)))
    layout = Layout(topo)
    queues, pending = mixed_workload(topo, pending_jobs)
    running = []
    for _ in range(3):
        result = schedule(layout, queues, running, pending, 0.0)
        pending, running = _apply(result, pending, running, 0.0)
    busy = float(sum(len(j.held) for j in running))
    arrivals = Arrivals(tuple(pending[:: max(1, len(pending) // 300)]), 6 * 3600.0, busy)
    t0 = time.perf_counter()
    estimates = expected_starts(
        layout, queues, running, pending, 60.0, forecast=ForecastConfig(), arrivals=arrivals
    )
    seconds = time.perf_counter() - t0
    return {
        "refresh_s": round(seconds, 2),
        "refresh_pending": len(pending),
        "refresh_beyond_horizon": sum(e.p50 is None for e in estimates.values()),
    }


def production_refresh() -> dict:
    """In a child process per backend: production's refresh over a busy 100k cluster."""
    setup_django()
    from scheduling import forecast

    busy_cluster("100k", 10_500, seed=1)
    forecast.refresh()
    done = forecast.refresh()
    return {"refresh_s": round(done.seconds, 2), "refresh_pending": done.pending}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10k,100k")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--load", type=float, default=0.95)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-production", action="store_true", help="skip the end-to-end refresh")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(production_refresh()))
        return
    sizes = {}
    for size in [s for s in args.sizes.split(",") if s]:
        sizes[size] = {**backtest(size, args.days, args.load), **refresh_time(size)}
    production = {} if args.no_production else run_per_backend("bench.forecast")
    rows = []
    for size, f in sizes.items():
        cover, error, wait = f["p90_coverage"], f["median_abs_error_s"], f["median_wait_s"] or 0.0
        met = {
            "error": error is not None and error < wait / 3,
            "cover": cover is not None and 0.85 <= cover <= 0.95,
            "refresh": f["refresh_s"] < 5,
        }
        said = {k: "met" if v else "not met" for k, v in met.items()}
        rows += [
            (size, "jobs scored (waited until a refresh)", f"{f['scored']:,} of {f['jobs']:,}", ""),
            (size, "median wait", f"{wait} s", ""),
            (size, "median |p50 - start|", f"{error} s", f"< wait / 3: {said['error']}"),
            (size, "started before their p90", f"{cover}", f"0.85-0.95: {said['cover']}"),
            (size, "refresh, 10k pending", f"{f['refresh_s']} s", f"< 5 s: {said['refresh']}"),
            (
                size,
                "refresh in the backtest, mean",
                f"{f['refresh_s_mean']} s ({f['pending_mean']} pending)",
                "",
            ),
        ]
    for db, f in production.items():
        value = f"{f['refresh_s']} s ({f['refresh_pending']:,} pending)"
        rows.append((db, "production refresh, 100k GPUs", value, "< 5 s"))
    print_table(
        f"Expected starts backtested over {args.days:g} days at load {args.load}",
        rows,
        ("size", "figure", "value", "target"),
    )
    flat = {f"{db}_{k}": v for db, f in production.items() for k, v in f.items()}
    print(json.dumps({"benchmark": "forecast", "days": args.days, "load": args.load, "sizes": sizes, **flat}))


if __name__ == "__main__":
    main()
