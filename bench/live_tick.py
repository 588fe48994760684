"""One tick of the live simulated fleet at 100k GPUs: telemetry step + frame written to the store.

    python -m bench.live_tick

The 100k preset (12,500 nodes x 8), 70% of GPUs busy; per tick: Fleet.step (utilization,
temperature, power of every GPU), the frame encoded (5 bytes per GPU) and written to the live
store: the embedded file store and Redis (MYRIAD_BENCH_REDIS, default redis://127.0.0.1:6379/15;
skipped when no server answers). Median and p99 of 50 ticks.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._backends import print_table
from engine.chips import BY_NAME
from engine.frames import encode_frame
from engine.presets import preset_document
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from monitoring.telemetry.livestore import FRAME_KEY, FileStore, RedisStore
from sim.fleet import Fleet


def _ticks(fleet: Fleet, store, util: np.ndarray, n: int = 50) -> tuple[float, float, int]:
    times, size = [], 0
    for i in range(n):
        t0 = time.perf_counter()
        fleet.step(i * 5.0, util)
        data = encode_frame(i + 1, i * 5.0, fleet.frame())
        store.put(FRAME_KEY, data)
        times.append(time.perf_counter() - t0)
        size = len(data)
    return float(np.median(times)) * 1000, float(np.percentile(times, 99)) * 1000, size


def main() -> None:
    topo = snapshot_from_spec(parse_topology(preset_document("100k"), set(BY_NAME)))
    fleet = Fleet(topo, seed=1)
    util = np.where(np.random.default_rng(2).random(topo.num_gpus) < 0.7, 0.92, 0.0).astype(np.float32)
    figures, rows = {"gpus": topo.num_gpus}, []
    with tempfile.TemporaryDirectory() as folder:
        p50, p99, size = _ticks(fleet, FileStore(Path(folder)), util)
    figures.update(file_tick_ms_p50=round(p50, 1), file_tick_ms_p99=round(p99, 1), frame_bytes=size)
    rows.append(("embedded (file store)", f"{p50:.1f} / {p99:.1f} ms", "target < 100 ms"))
    url = os.environ.get("MYRIAD_BENCH_REDIS", "redis://127.0.0.1:6379/15")
    try:
        store = RedisStore(url)
        store.client.ping()
        p50, p99, _ = _ticks(fleet, store, util)
        store.delete(FRAME_KEY)
        figures.update(redis_tick_ms_p50=round(p50, 1), redis_tick_ms_p99=round(p99, 1))
        rows.append(("Redis", f"{p50:.1f} / {p99:.1f} ms", "target < 100 ms"))
    except Exception as exc:  # noqa: BLE001 - no server: say so and measure the rest
        rows.append(("Redis", f"not measured ({type(exc).__name__})", ""))
    rows.append(("frame size", f"{size:,} bytes", "5 bytes per GPU"))
    print_table("Live fleet tick, 100k GPUs (p50 / p99 of 50 ticks)", rows, ("store", "tick", "target"))
    print(json.dumps({"benchmark": "live_tick", **figures}))


if __name__ == "__main__":
    main()
