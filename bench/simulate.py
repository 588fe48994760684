"""What-if simulation speed on the 100k preset.

    python -m bench.simulate

30 simulated days of the 100k cluster (12,500 nodes x 8, 6 chip types) with 20,000
trace-calibrated jobs plus large pretraining gangs and the default fault physics: wall time on one
core, events per second, scheduling cycles, and what the simulation found.
"""

from __future__ import annotations

import json
import time

from bench._backends import print_table
from engine.chips import BY_NAME
from engine.presets import preset_document
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from sim.config import SimConfig
from sim.simulation import Simulation
from sim.workload import generate


def main() -> None:
    topo = snapshot_from_spec(parse_topology(preset_document("100k"), set(BY_NAME)))
    capacity = {c: n for c, n in topo.count_by_chip().items() if n}
    jobs = generate(capacity, 30, seed=1, jobs=20_000)
    t0 = time.perf_counter()
    out = Simulation(topo, jobs, SimConfig(days=30, seed=1)).run()
    wall = time.perf_counter() - t0
    figures = {
        "gpus": out["gpus"],
        "days": 30,
        "jobs": len(jobs),
        "wall_s": round(wall, 2),
        "events": out["engine"]["events"],
        "events_per_s": round(out["engine"]["events"] / wall, 1),
        "cycles": out["engine"]["cycles"],
        "allocated_mean": out["utilization"]["allocated_mean"],
        "faults": out["faults"]["total"],
        "interruptions": out["faults"]["interruptions"],
        "training_ettr": out["ettr"]["gpu_weighted"],
        "median_recovery_s": out["recoveries"]["median_s"],
    }
    rows = [
        ("wall time (one core)", f"{figures['wall_s']} s", "target < 60 s"),
        ("events / events per second", f"{figures['events']:,} / {figures['events_per_s']:,}", ""),
        ("scheduling cycles (production engine)", f"{figures['cycles']:,}", ""),
        ("jobs (trace stream + pretraining gangs)", f"{figures['jobs']:,}", ">= 20,000"),
        ("GPUs allocated, mean", f"{figures['allocated_mean']:.1%}", ""),
        ("faults / job interruptions", f"{figures['faults']:,} / {figures['interruptions']:,}", ""),
        ("ETTR, training jobs of 512+ GPUs", f"{figures['training_ettr']:.2%}", ""),
        ("median time to recover", f"{figures['median_recovery_s']} s", ""),
    ]
    print_table("Simulation: 100k GPUs, 30 days", rows, ("figure", "value", "target"))
    print(json.dumps({"benchmark": "simulate", **figures}))


if __name__ == "__main__":
    main()
