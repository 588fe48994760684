"""The fabric's link loads per frame at 100k GPUs: 100,000 NIC ports to every switch uplink.

    python -m bench.fabric [--frames 30]

The 100k preset (12,500 nodes x 8 rails, 100 pods: 800 rail leaves), 60% of its GPUs in
training jobs of 64 to 2,048 GPUs that span nodes. Per frame, as the live view computes it:
the simulated fleet's ports from the modelled traffic (sim.fabric_traffic), every leaf's and
pod's uplink load, utilization, worst p99 and CNP rate (engine.fabric.link_loads), the pods a
congested link touches; then the same from 12,500 agents' newest reports (each node's 8 port
summaries, as the live store holds them) turned into arrays (monitoring.telemetry.fabric). Target:
< 100 ms a frame for 100k ports. Median and p99 of ``--frames``; the last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from engine.chips import BY_NAME
from engine.fabric import FabricSpec, congested_pods, link_loads
from engine.presets import preset_document
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from sim.fabric_traffic import simulated_ports

TARGET_MS = 100.0


def _jobs(topo, rng) -> list[tuple[np.ndarray, float]]:
    """Spanning training jobs over 60% of the GPUs, in whole nodes, each with its bytes/s per GPU."""
    free = np.arange(topo.num_gpus)
    jobs, at = [], 0
    while at < 0.6 * topo.num_gpus:
        size = int(rng.choice([64, 128, 256, 512, 1024, 2048]))
        jobs.append((free[at : at + size], float(rng.uniform(2e9, 16e9))))
        at += size
    return jobs


def _reports(topo, ports) -> dict[int, dict]:
    from monitoring.telemetry import netreports

    """What 12,500 agents' newest entries hold: eight port summaries per node."""
    out: dict[int, dict] = {}
    now = time.time()
    for i in range(len(ports)):
        node = int(topo.node_id[ports.node[i]])
        entry = out.setdefault(node, {"t": now, "net": []})
        entry["net"].append(
            {
                "port": f"mlx5_{ports.rail[i]}/1",
                "rail": int(ports.rail[i]),
                "seconds": 5.0,
                "state": "down" if ports.down[i] else "active",
                "rate_gbps": 400.0,
                "windows": 500,
                "tx_bytes": int(ports.tx_bytes_s[i] * 5),
                "rx_bytes": int(ports.rx_bytes_s[i] * 5),
                "util": {"mean": 10.0, "p50": 5.0, "p99": float(ports.p99[i]), "max": float(ports.p99[i])},
                "cnp_sent_per_s": float(ports.cnp_per_s[i]),
            }
        )
    for entry in out.values():  # what ingest keeps with each report for the fabric
        entry["fabric"] = netreports.fabric_row(entry["net"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fabric")
    parser.add_argument("--frames", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    topo = snapshot_from_spec(parse_topology(preset_document("100k"), set(BY_NAME)))
    rng = np.random.default_rng(7)
    jobs = _jobs(topo, rng)
    spec = FabricSpec()
    modelled, engine_ms = [], []
    for i in range(args.frames):
        t0 = time.perf_counter()
        ports = simulated_ports(topo, jobs, np.random.default_rng(i))
        t1 = time.perf_counter()
        loads = link_loads(topo, ports, spec)
        congested_pods(topo, loads, spec)
        t2 = time.perf_counter()
        modelled.append((t1 - t0) * 1000)
        engine_ms.append((t2 - t1) * 1000)
    congested = int(loads["leaf"]["congested"].sum())

    import django

    django.setup()
    from monitoring.telemetry import fabric as fabric_views

    reports = _reports(topo, ports)
    from_reports = []
    for _ in range(max(3, args.frames // 5)):
        t0 = time.perf_counter()
        agent_ports = fabric_views.ports_from_reports(topo, reports, 60.0)
        link_loads(topo, agent_ports, spec)
        from_reports.append((time.perf_counter() - t0) * 1000)
    rows = [
        ("modelled ports (sim.fabric_traffic)", modelled),
        ("link loads + congestion (engine.fabric)", engine_ms),
        ("from 12,500 agents' reports, then link loads", from_reports),
    ]
    print(f"100k preset: {len(ports):,} ports, {len(loads['leaf']['util'])} leaves, {len(topo.pod_id)} pods")
    print(f"{'step':<48}{'median ms':>11}{'p99 ms':>9}")
    for name, times in rows:
        print(f"{name:<48}{np.median(times):>11.1f}{np.percentile(times, 99):>9.1f}")
    frame_ms = float(np.median(modelled) + np.median(engine_ms))
    print(f"target: < {TARGET_MS:g} ms a frame; {congested} leaves congested in the last frame")
    figures = {
        "ports": len(ports),
        "leaves": len(loads["leaf"]["util"]),
        "frame_ms_p50": round(frame_ms, 2),
        "link_loads_ms_p50": round(float(np.median(engine_ms)), 2),
        "link_loads_ms_p99": round(float(np.percentile(engine_ms, 99)), 2),
        "from_reports_ms_p50": round(float(np.median(from_reports)), 1),
        "congested_leaves": congested,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
