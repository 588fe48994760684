"""Parallel-plan search and mixed-chip planning times (the step-time model, engine.steptime).

    python -m bench.plans

- plan search: the fastest feasible (TP, PP, DP, virtual stages, micro-batch, recomputation)
  plan for a 10,000-GPU job, for three model sizes; median of 20 searches each.
- shrink: per-GPU throughput kept when a 1,000-GPU Llama 3 70B job is re-planned on 900 GPUs.
- mixed: a 10,000-GPU job split 5,000 H100 + 5,000 H200, planning time and mixed efficiency.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench._backends import print_table
from engine.mixedplan import mixed_plan
from engine.steptime import MODELS, best_plan, retained_per_gpu


def _timed(fn, repeats: int = 20):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times)) * 1000


def main() -> None:
    figures, rows = {}, []
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):
        plan, ms = _timed(lambda name=name: best_plan(MODELS[name], "H100-SXM", 10_000))
        figures[f"plan_10k_{name}_ms"] = round(ms, 2)
        rows.append(
            (f"plan search, {name} on 10,000 H100", f"{ms:.1f} ms", "target < 50 ms", plan.describe())
        )
    before = best_plan(MODELS["llama3-70b"], "H100-SXM", 1000)
    after = best_plan(MODELS["llama3-70b"], "H100-SXM", 900)
    kept = retained_per_gpu(before, after)
    figures["shrink_1000_to_900_per_gpu_kept"] = round(kept, 4)
    rows.append(
        (
            "shrink 1,000 -> 900 GPUs (70B): per-GPU throughput kept",
            f"{kept:.1%}",
            "target >= 90%",
            after.describe(),
        )
    )
    mixed, ms = _timed(lambda: mixed_plan(MODELS["llama3-70b"], {"H100-SXM": 5000, "H200": 5000}), repeats=5)
    figures["mixed_10k_plan_ms"] = round(ms, 1)
    figures["mixed_10k_efficiency"] = round(mixed.efficiency, 4)
    rows.append(
        (
            "mixed 5,000 H100 + 5,000 H200 (70B): efficiency",
            f"{mixed.efficiency:.1%}",
            "target >= 95%",
            f"planned in {ms:.0f} ms",
        )
    )
    mixed2 = mixed_plan(MODELS["llama3-70b"], {"A100-80G": 5000, "H100-SXM": 5000})
    figures["mixed_10k_a100_h100_efficiency"] = round(mixed2.efficiency, 4)
    rows.append(
        ("mixed 5,000 A100 + 5,000 H100 (70B): efficiency", f"{mixed2.efficiency:.1%}", "", "two generations")
    )
    print_table("Step-time model and plan search", rows, ("figure", "value", "target", "plan"))
    print(json.dumps({"benchmark": "plans", **figures}))


if __name__ == "__main__":
    main()
