"""Per-job GPU efficiency and idle allocated GPUs, from telemetry frames: plain NumPy.

A frame gives every GPU's utilization, memory and power (one byte each, in % of the GPU's); the
active allocations give (job id, GPU id) pairs. Between two frames ``dt`` seconds apart, each job
adds, per GPU it holds, ``dt`` GPU-seconds, utilization x ``dt``, memory x ``dt``, power x ``dt``,
and ``dt`` idle GPU-seconds when the GPU's utilization is below the idle threshold. An allocated
GPU is idle *since* the first frame of its current run below the threshold under the same job; only
the idle pairs are kept, so a pair that is busy, or new, starts afresh.
"""

from __future__ import annotations

import numpy as np

COLUMNS = ("gpu_s", "util_s", "memory_s", "power_s", "idle_gpu_s")


def pair_keys(pairs: np.ndarray) -> np.ndarray:
    """One sortable int64 per (job id, GPU id) pair (both below 2**31)."""
    return (pairs[:, 0].astype(np.int64) << 32) | pairs[:, 1].astype(np.int64)


def job_rates(
    pair_jobs: np.ndarray, util: np.ndarray, memory: np.ndarray, power: np.ndarray, idle_pct: float
) -> tuple[np.ndarray, np.ndarray]:
    """(job ids sorted, per job a row of COLUMNS per second): the values of one frame summed over
    each job's GPUs."""
    jobs, inverse = np.unique(pair_jobs, return_inverse=True)
    n = len(jobs)
    idle = (util < idle_pct).astype(np.float64)
    rows = [
        np.bincount(inverse, minlength=n).astype(np.float64),
        np.bincount(inverse, weights=util.astype(np.float64), minlength=n),
        np.bincount(inverse, weights=memory.astype(np.float64), minlength=n),
        np.bincount(inverse, weights=power.astype(np.float64), minlength=n),
        np.bincount(inverse, weights=idle, minlength=n),
    ]
    return jobs, np.stack(rows, axis=1) if n else np.zeros((0, len(COLUMNS)))


def merge_totals(
    jobs: np.ndarray, totals: np.ndarray, add_jobs: np.ndarray, add: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``totals`` (rows per sorted ``jobs``) plus ``add`` (rows per sorted ``add_jobs``); jobs in
    either come out, sorted."""
    out_jobs = np.union1d(jobs, add_jobs)
    out = np.zeros((len(out_jobs), len(COLUMNS)))
    if len(jobs):
        out[np.searchsorted(out_jobs, jobs)] += totals
    if len(add_jobs):
        out[np.searchsorted(out_jobs, add_jobs)] += add
    return out_jobs, out


def idle_since(
    prev_keys: np.ndarray, prev_since: np.ndarray, keys: np.ndarray, idle_now: np.ndarray, t: float
) -> tuple[np.ndarray, np.ndarray]:
    """The idle pairs after a frame at ``t``: (sorted keys, since). A pair idle now keeps the time
    it was first seen idle when it was idle at the previous frame too; otherwise it starts at ``t``."""
    keys = keys[idle_now]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    since = np.full(len(keys), t, dtype=np.float64)
    if len(prev_keys) and len(keys):
        pos = np.minimum(np.searchsorted(prev_keys, keys), len(prev_keys) - 1)
        kept = prev_keys[pos] == keys
        since[kept] = prev_since[pos[kept]]
    return keys, since


def wasted(keys: np.ndarray, since: np.ndarray, now: float, after_s: float) -> np.ndarray:
    """(job id, GPU id) of the pairs idle for at least ``after_s`` at ``now``."""
    long = keys[since <= now - after_s]
    return np.stack([long >> 32, long & 0xFFFFFFFF], axis=1)


def summary(row) -> dict:
    """A job's efficiency from its totals (a row of COLUMNS): means over the GPU-seconds seen."""
    gpu_s = float(row[0])
    if gpu_s <= 0:
        return {
            "gpu_hours": 0.0,
            "util_pct": None,
            "memory_pct": None,
            "power_pct": None,
            "idle_gpu_hours": 0.0,
        }
    return {
        "gpu_hours": round(gpu_s / 3600, 3),
        "util_pct": round(float(row[1]) / gpu_s, 1),
        "memory_pct": round(float(row[2]) / gpu_s, 1),
        "power_pct": round(float(row[3]) / gpu_s, 1),
        "idle_gpu_hours": round(float(row[4]) / 3600, 3),
    }
