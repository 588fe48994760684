"""Per-rank progress of simulated synchronous training jobs, with hangs and stragglers, judged by
the production rule (engine.progress) as the control plane would see it: reports every few
seconds, a check every few seconds.

A job of N nodes runs steps: every rank computes (the step's compute time times the node's speed,
with per-rank noise, a jitter shared by every rank, and rare pauses), then all wait for the
slowest and run the gradient collective. A fault strikes one node at a random time: a **hang**
stops the rank's local work (a stuck kernel or a frozen process; the other ranks finish their
compute and wait), a **straggler** makes its compute slower by a drawn factor from then on. Each
node's agent reports the rank's compute-done step counter, when it moved, and its last compute
times, every ``report_s`` with its own phase; the control plane judges every ``check_s``.

``localization_trial`` returns when the faulty node was first named and which healthy nodes were
named (false cordons); ``localization_stats`` runs seeded trials and sums them up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.progress import localize


@dataclass(frozen=True)
class ProgressModel:
    nodes: tuple[int, int] = (32, 256)
    step_s: tuple[float, float] = (2.0, 8.0)  # compute time of one step (typical LLM steps)
    collective_share: float = 0.15  # the gradient collective, as a share of the compute time
    rank_noise: float = 0.03  # per rank and step
    shared_jitter: float = 0.02  # per step, every rank alike (data loading, the network)
    pause_p: float = 0.002  # a rank pauses (garbage collection, host noise) in this share of steps
    pause: tuple[float, float] = (1.3, 2.0)
    slowdown: tuple[float, float] = (1.15, 2.0)  # a straggler's compute, times its normal
    fault_at: tuple[float, float] = (120.0, 300.0)
    report_s: float = 5.0
    check_s: float = 5.0
    watch_s: float = 120.0  # how long after the fault the trial looks
    window: int = 8  # compute times a report carries


@dataclass(frozen=True)
class Trial:
    kind: str  # "hang", "straggler" or "healthy"
    nodes: int
    step_s: float
    named_after_s: float | None  # the faulty node first named, seconds after the fault
    false_named: tuple[int, ...]  # healthy nodes named at any time


def _compute_times(rng, m: ProgressModel, n: int, steps: int, base: float) -> np.ndarray:
    noise = 1.0 + m.rank_noise * rng.standard_normal((steps, n))
    shared = 1.0 + m.shared_jitter * rng.standard_normal((steps, 1))
    pauses = np.where(rng.random((steps, n)) < m.pause_p, rng.uniform(*m.pause, (steps, n)), 1.0)
    return base * np.clip(noise, 0.5, None) * np.clip(shared, 0.5, None) * pauses


def localization_trial(seed: int, kind: str, model: ProgressModel | None = None, rule=None) -> Trial:
    m, rng = model or ProgressModel(), np.random.default_rng(seed)
    n = int(rng.integers(m.nodes[0], m.nodes[1] + 1))
    base = float(rng.uniform(*m.step_s))
    fault_at = float(rng.uniform(*m.fault_at))
    end = fault_at + m.watch_s
    victim = int(rng.integers(n))
    slow = float(rng.uniform(*m.slowdown))
    steps = int(end / base) + 2
    compute = _compute_times(rng, m, n, steps, base)
    # the timeline: step k starts at start[k]; rank i finishes its compute at done[k, i]
    done = np.full((steps, n), np.inf)
    start = 0.0
    for k in range(steps):
        c = compute[k]
        if kind == "straggler" and start >= fault_at:
            c = c.copy()
            c[victim] *= slow
            compute[k] = c
        done[k] = start + c
        if kind == "hang" and done[k, victim] > fault_at:
            done[k, victim] = np.inf  # its local work stopped; everyone waits for it from here on
            done[k + 1 :] = np.inf
            break
        start = float(done[k].max() + m.collective_share * base)
        if start > end:
            done[k + 1 :] = np.inf
            break
    phase = rng.uniform(0, m.report_s, n)
    named_after, false_named = None, set()
    t = m.check_s
    while t <= end:
        reported_at = t - ((t - phase) % m.report_s)  # each node's newest report
        finished = done <= reported_at[None, :]  # (steps, n): compute done by the report
        count = finished.sum(axis=0)  # steps done per rank (in order)
        step = count - 1.0
        last_k = np.maximum(count - 1, 0)
        step_at = np.where(count > 0, done[last_k, np.arange(n)], -1.0)
        recent = np.full((n, m.window), np.nan)
        for j in range(m.window):  # the rank's last compute times, newest last
            k = count - m.window + j
            ok = k >= 0
            recent[ok, j] = compute[k[ok], np.flatnonzero(ok)]
        verdict = localize(step, step_at, reported_at, recent, t, rule)
        named = set(verdict.culprits) | set(verdict.stragglers)
        if kind != "healthy" and victim in named and named_after is None and t >= fault_at:
            named_after = t - fault_at
        false_named |= named - ({victim} if kind != "healthy" else set())
        t += m.check_s
    return Trial(kind, n, base, named_after, tuple(sorted(false_named)))


def localization_stats(
    trials: int = 200, seed: int = 0, model: ProgressModel | None = None, rule=None
) -> dict:
    """Hangs, stragglers and healthy jobs in equal numbers: the share of faulty nodes named within
    60 s, the median time to name one, and false cordons (healthy nodes named) per cordon."""
    kinds = ("hang", "straggler", "healthy")
    results = [localization_trial(seed * 100_003 + i, kinds[i % 3], model, rule) for i in range(trials)]
    faulty = [r for r in results if r.kind != "healthy"]
    within = [r for r in faulty if r.named_after_s is not None and r.named_after_s <= 60.0]
    named_true = sum(r.named_after_s is not None for r in faulty)
    false = sum(len(r.false_named) for r in results)
    by_kind = {}
    for kind in kinds[:2]:
        rs = [r for r in faulty if r.kind == kind]
        times = [r.named_after_s for r in rs if r.named_after_s is not None]
        by_kind[kind] = {
            "trials": len(rs),
            "named_within_60s": round(sum(t <= 60 for t in times) / max(len(rs), 1), 4),
            "median_s": round(float(np.median(times)), 1) if times else None,
        }
    return {
        "trials": len(results),
        "faults": len(faulty),
        "named_within_60s": round(len(within) / max(len(faulty), 1), 4),
        "false_cordons": false,
        "false_cordon_share": round(false / max(false + named_true, 1), 4),
        **{f"{k}_{key}": v for k, d in by_kind.items() for key, v in d.items()},
    }
