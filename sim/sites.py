"""The simulator's datacenter links and partitions, as the engine sees them (engine.sites).

It keeps each running job's share of the links it crosses (given back when the job stops), the
GPU-seconds run across datacenters, each link's highest utilization, and the span-or-wait
decisions' times, for the report."""

from __future__ import annotations

import numpy as np

from engine.sites import SiteLinks


def unreachable_at(partitions, topo, now: float) -> np.ndarray | None:
    """The datacenters (of snapshot ``topo``) a partition cuts off at ``now`` (None: none)."""
    cut = [dc for dc, start, end in partitions if start <= now < end]
    if not cut:
        return None
    mask = np.zeros(len(topo.datacenter_id), dtype=bool)
    mask[cut] = True
    return mask


def _gpu_s(since: tuple[float, int] | None, now: float) -> float:
    return 0.0 if since is None else (now - since[0]) * since[1]


class SiteBook:
    def __init__(self, links: SiteLinks | None, partitions, topo):
        self.links, self.partitions, self.topo = links, tuple(partitions), topo
        self.shares: dict[int, tuple] = {}  # running job -> ((pair, bytes/s), ...)
        self.since: dict[int, tuple[float, int]] = {}  # running job across sites -> (since, GPUs)
        self.running: dict[int, tuple[float, int]] = {}  # every running job admitted -> (since, GPUs)
        self.crossing_gpu_s = 0.0
        self.run_gpu_s = 0.0
        self.spanned = 0
        self.peak: dict[tuple[int, int], float] = {}
        self.decisions_s: list[float] = []

    def for_cycle(self, now: float) -> dict:
        """What a cycle at ``now`` passes the engine: the links with the shares taken, the
        datacenters out of reach."""
        links = self.links.taken(self.shares.values()) if self.links is not None else None
        if links is not None:
            for pair in links.links:
                self.peak[pair] = max(self.peak.get(pair, 0.0), links.utilization(pair))
        return {"links": links, "unreachable": unreachable_at(self.partitions, self.topo, now)}

    def admitted(self, a, now: float) -> None:
        self.running[a.job_id] = (now, len(a.held))
        if a.link_loads:
            self.shares[a.job_id] = a.link_loads
            self.since[a.job_id] = (now, len(a.held))
            self.spanned += 1

    def stopped(self, job_id: int, now: float) -> None:
        self.shares.pop(job_id, None)
        self.crossing_gpu_s += _gpu_s(self.since.pop(job_id, None), now)
        self.run_gpu_s += _gpu_s(self.running.pop(job_id, None), now)

    def report(self, now: float) -> dict:
        """GPU-hours run across datacenters (and their share of all the admitted jobs' GPU-hours),
        the busiest link, the span-or-wait decisions' time."""
        crossing = self.crossing_gpu_s + sum((now - t) * n for t, n in self.since.values())
        run = self.run_gpu_s + sum((now - t) * n for t, n in self.running.values())
        busiest = max(self.peak, key=self.peak.get, default=None)
        decisions = np.asarray(self.decisions_s) * 1000
        return {
            "spanned_jobs": self.spanned,
            "crossing_gpu_hours": round(crossing / 3600, 1),
            "crossing_gpu_hours_share": round(crossing / run, 5) if run else 0.0,
            "busiest_link": self.links.name(busiest) if busiest is not None else None,
            "busiest_link_peak_utilization": round(self.peak[busiest], 4) if busiest is not None else None,
            "span_decisions": len(decisions),
            "span_decision_ms_p99": round(float(np.percentile(decisions, 99)), 3) if len(decisions) else None,
        }
