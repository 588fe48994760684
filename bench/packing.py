"""Replay of the Alibaba openb GPU-sharing trace through three placement policies.

    python -m bench.packing

The default task list (8,152 tasks) on the trace's 1,213 GPU nodes (6,212 GPUs), cloned at
random (seed 0) until requests reach 130% of capacity: the share of GPU capacity allocated when
requests reach 100% and 130%, the tasks that found no room, and the wall time of each policy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench._backends import print_table
from engine.packing import POLICIES, replay
from sim.openb import load_nodes, load_tasks

DATA = Path(__file__).resolve().parent.parent / "data" / "openb"


def main() -> None:
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(DATA / "openb_pod_list_default.csv")
    figures, rows = {}, []
    for policy in POLICIES:
        t0 = time.perf_counter()
        curve = replay(nodes, tasks, policy, target=1.3, seed=0)
        wall = time.perf_counter() - t0
        at100, at130 = curve.allocated_at(1.0), curve.allocated_at(1.3)
        key = policy.replace("-", "_")
        figures.update(
            {
                f"{key}_allocated_at_100": round(at100, 4),
                f"{key}_allocated_at_130": round(at130, 4),
                f"{key}_failed_tasks": curve.failed,
                f"{key}_wall_s": round(wall, 2),
            }
        )
        rows.append((policy, f"{at100:.1%}", f"{at130:.1%}", f"{curve.failed:,}", f"{wall:.1f} s"))
    print_table(
        f"openb replay: {len(nodes.names):,} nodes, {nodes.gpu_capacity // 1000:,} GPUs, "
        f"{len(tasks):,} tasks",
        rows,
        ("policy", "allocated at 100% requested", "at 130%", "tasks with no room", "wall"),
    )
    print(json.dumps({"benchmark": "packing", **figures}))


if __name__ == "__main__":
    main()
