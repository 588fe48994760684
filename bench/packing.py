"""The openb replay (the FGD paper's protocol) and the speed of placing one fractional task.

    python -m bench.packing

1. The default task list on the trace's 1,213 GPU nodes (6,212 GPUs), seeds 42-51, every policy,
   on one core: the mean allocated share at 100% and 130% of requested capacity, the published
   figure beside it, and the wall time of the whole replay.
2. Placing one fractional task on the 1,213-node cluster when it is 60% allocated (the state an
   FGD replay reaches there), with no cached scores: 2,000 fractions drawn from the list, p50 and
   p99 per policy.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench._backends import print_table
from engine.packing import TaskMix
from engine.packing_replay import POLICIES, arrivals
from engine.packing_scores import Scorer
from sim import openb_replay
from sim.openb import load_nodes, load_tasks


def _replay_figures():
    started = time.perf_counter()
    _, results = openb_replay.run(["default"], POLICIES, openb_replay.SEEDS)
    wall = time.perf_counter() - started
    pub = openb_replay.published()
    figures = openb_replay.summary(results)["default"]
    return figures, pub, wall, {p: sum(w for _, _, w in results[("default", p)]) for p in POLICIES}


def _placement_ms(nodes, tasks, mix):
    rng = np.random.default_rng(42)
    stream = arrivals(tasks, nodes.gpu_capacity, 1.3, rng)
    rank = rng.permutation(len(nodes.names))
    state = nodes.fresh_state()
    fill = Scorer("fgd", state, mix, rng)
    for task in stream:  # fill to 60% the way FGD would
        if state.allocated >= 0.6 * nodes.gpu_capacity:
            break
        choice = fill.choose(task, rank)
        if choice is not None:
            fill.take(task, *choice)
    fractions = [t for t in tasks if t.fractional]
    sample = [fractions[i] for i in rng.integers(len(fractions), size=2000)]
    out = {}
    for policy in POLICIES:
        scorer = Scorer(policy, state, mix, np.random.default_rng(1))
        times = []
        for task in sample:
            scorer.forget_scores()  # score every feasible node, as on a first sight of the kind
            t0 = time.perf_counter()
            scorer.choose(task, rank)
            times.append(time.perf_counter() - t0)
        out[policy] = (np.percentile(times, 50) * 1e3, np.percentile(times, 99) * 1e3)
    return state.allocated / nodes.gpu_capacity, out


def main() -> None:
    figures, pub, wall, walls = _replay_figures()
    rows = []
    for policy in POLICIES:
        f = figures[policy]
        curve = pub.get(("default", policy), {})
        published = f"{np.mean(curve[100]):.2f} / {np.mean(curve[130]):.2f}" if curve else "-"
        rows.append((policy, f"{f['100']:.2f}", f"{f['130']:.2f}", published, f"{walls[policy]:.1f} s"))
    print_table(
        f"openb replay, default list, seeds 42-51, one core: {wall:.1f} s",
        rows,
        ("policy", "allocated at 100% (%)", "at 130% (%)", "published 100 / 130", "wall"),
    )
    nodes = load_nodes(openb_replay.DATA / openb_replay.NODE_LIST)
    tasks = load_tasks(openb_replay.task_file(openb_replay.DATA, "default"))
    share, placement = _placement_ms(nodes, tasks, TaskMix.of(tasks, nodes.models))
    print_table(
        f"placing one fractional task, {len(nodes.names):,} nodes {share:.0%} allocated, no cached scores",
        [(p, f"{a:.3f} ms", f"{b:.3f} ms") for p, (a, b) in placement.items()],
        ("policy", "p50", "p99"),
    )
    result = {"benchmark": "packing", "replay_wall_s": round(wall, 1)}
    for policy in POLICIES:
        key = policy.replace("-", "_")
        result[f"{key}_allocated_at_100"] = figures[policy]["100"]
        result[f"{key}_allocated_at_130"] = figures[policy]["130"]
        result[f"{key}_place_fraction_p99_ms"] = round(placement[policy][1], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
