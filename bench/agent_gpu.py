"""Check the node agent against this machine's real GPUs: what NVML gives it, as it would report.

    python -m bench.agent_gpu [--watch 10] [--nvml real|fake:<state file>]

Loads NVML (nvidia-ml-py) the way ``myriad-agent`` does, reads every GPU once per second for
``--watch`` seconds with the agent's own reader, waits on NVML's event set for XID critical errors
meanwhile, and prints a table of the readings (utilization, memory, temperature, power, SM
clock, ECC counts, retired pages, remapped rows, NVLink errors, PCIe replays), the time one
read of all GPUs takes, and the XIDs seen. The last line is the figures as JSON. Needs no server
and no Django. Without an NVIDIA driver it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from myriad_agent.gpus import GPUReader, load_nvml

COLUMNS = [
    ("util", "util %"),
    ("memory_used_mib", "mem MiB"),
    ("temperature_c", "temp C"),
    ("power_w", "power W"),
    ("sm_clock_mhz", "SM MHz"),
    ("ecc_corrected_volatile", "ECC corr"),
    ("ecc_uncorrected_volatile", "ECC unc"),
    ("retired_pages", "retired"),
    ("remapped_rows_uncorrectable", "remap unc"),
    ("nvlink_crc_errors", "NVLink CRC"),
    ("pcie_replays", "PCIe replay"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=float, default=10.0, help="seconds to read and wait for XIDs")
    parser.add_argument("--nvml", default="real")
    args = parser.parse_args(argv)
    try:
        nvml = load_nvml(args.nvml)
    except RuntimeError as exc:
        print(f"agent_gpu: {exc}", file=sys.stderr)
        return 2
    reader = GPUReader(nvml)
    driver = nvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    print(f"NVML loaded: driver {driver}, {reader.count} GPUs: {', '.join(sorted(set(reader.names)))}")
    reader.start_xid_watch()
    reads, xids, last = [], [], []
    deadline = time.monotonic() + args.watch
    while True:
        t0 = time.perf_counter()
        last = reader.read()
        reads.append((time.perf_counter() - t0) * 1000)
        xids += reader.take_xids()
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    reader.stop()
    header = ["gpu", "uuid"] + [label for _, label in COLUMNS]
    rows = [[str(g["index"]), g["uuid"][:16]] + [_cell(g, key) for key, _ in COLUMNS] for g in last]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    unsupported = sorted({key for key, _ in COLUMNS for g in last if key not in g})
    if unsupported:
        print(f"not supported by these GPUs (left out of reports): {', '.join(unsupported)}")
    print(f"one read of all GPUs: median {sorted(reads)[len(reads) // 2]:.1f} ms over {len(reads)} reads")
    print(f"XIDs seen in {args.watch:.0f} s: {xids or 'none'}")
    figures = {
        "benchmark": "agent_gpu",
        "driver": driver,
        "gpus": reader.count,
        "names": sorted(set(reader.names)),
        "read_ms": round(sorted(reads)[len(reads) // 2], 2),
        "xids": xids,
        "readings": last,
    }
    print(json.dumps(figures))
    return 0


def _cell(g: dict, key: str) -> str:
    if g.get("lost"):
        return "LOST"
    value = g.get(key)
    if value is None:
        return "-"
    return f"{value:.0f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    raise SystemExit(main())
