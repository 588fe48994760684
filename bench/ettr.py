"""Effective training time of a 10k-GPU and a 100k-GPU training job over 7 simulated days with the
default fault physics (engine.physics), for each checkpoint policy.

    python -m bench.ettr [--days 7] [--seeds 3]

The 10k job trains a 405B-parameter model, the 100k job a 2T-parameter model (16 bytes of state
per parameter). Each figure is the mean over the seeds; the loss buckets show where time goes.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bench._backends import print_table
from engine.checkpoint import CheckpointKind
from sim.reliability import BUCKETS, RunPolicy, simulate_training

POLICIES = {
    "periodic_1h": RunPolicy("periodic 1 h (sync)", CheckpointKind.PERIODIC, 3600),
    "async_30m": RunPolicy("async 30 min", CheckpointKind.ASYNC, 1800),
    "triggered_30m": RunPolicy("triggered + async 30 min", CheckpointKind.TRIGGERED, 1800),
    "auto": RunPolicy("auto (async, Daly interval)", CheckpointKind.ASYNC, None),
    "triggered_auto": RunPolicy("triggered + auto", CheckpointKind.TRIGGERED, None),
}
JOBS = [(10_000, 405e9), (100_000, 2e12)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rows, figures = [], {}
    for gpus, params in JOBS:
        best = None
        for short, policy in POLICIES.items():
            runs = [
                simulate_training(gpus, params, policy, days=args.days, seed=s) for s in range(args.seeds)
            ]
            ettr = float(np.mean([r.ettr for r in runs]))
            losses = {b: float(np.mean([r.buckets[b] / r.wall_s for r in runs])) for b in BUCKETS}
            recovery = float(np.median(np.concatenate([r.recoveries_s for r in runs])))
            interrupts = float(np.mean([r.interruptions for r in runs]))
            rows.append(
                (
                    f"{gpus:,}",
                    policy.name,
                    f"{runs[0].interval_s:.0f}",
                    f"{interrupts:.0f}",
                    f"{100 * ettr:.2f}",
                    *(f"{100 * losses[b]:.2f}" for b in BUCKETS),
                    f"{recovery:.0f}",
                )
            )
            figures[f"ettr_{gpus // 1000}k_{short}"] = round(ettr, 4)
            if best is None or ettr > best[0]:
                best = (ettr, policy.name, losses, recovery)
        figures[f"best_ettr_{gpus // 1000}k"] = round(best[0], 4)
        figures[f"best_policy_{gpus // 1000}k"] = best[1]
        figures[f"median_recovery_s_{gpus // 1000}k"] = round(best[3], 1)
        figures[f"largest_loss_bucket_{gpus // 1000}k"] = max(best[2], key=best[2].get)
    header = (
        "GPUs",
        "policy",
        "interval s",
        "interruptions",
        "ETTR %",
        *(f"{b} %" for b in BUCKETS),
        "median recovery s",
    )
    print_table(f"ETTR over {args.days:g} simulated days, mean of {args.seeds} seeds", rows, header)
    print(json.dumps({"benchmark": "ettr", "days": args.days, **figures}))


if __name__ == "__main__":
    main()
