"""What a what-if simulation reports: hourly samples while it runs, and the summary that
sim.simulation.Simulation.run returns."""

from __future__ import annotations

from collections import Counter

import numpy as np

from engine.ettr import Ettr
from engine.network import traffic_per_gpu
from engine.states import GPU_STATE_CODE, NODE_STATE_CODE

DAY = 86_400.0
READY, GPU_READY = NODE_STATE_CODE["ready"], GPU_STATE_CODE["ready"]
SIZE_BUCKETS = ((1, 1), (2, 8), (9, 64), (65, 512), (513, 2048), (2049, 1 << 30))


def _pending_time(started, arrived) -> dict[str, dict]:
    """Time from arrival to first start by job size: p50, p95 and the jobs never started."""
    pending_time: dict[str, dict] = {}
    for lo, hi in SIZE_BUCKETS:
        waits = [j.first_admit - j.spec.arrival for j in started if lo <= j.spec.gpus <= hi]
        never = sum(1 for j in arrived if j.first_admit is None and lo <= j.spec.gpus <= hi)
        if waits or never:
            label = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
            pending_time[label] = {
                "jobs": len(waits),
                "never_started": never,
                "p50_s": round(float(np.percentile(waits, 50)), 1) if waits else None,
                "p95_s": round(float(np.percentile(waits, 95)), 1) if waits else None,
            }
    return pending_time


def _training_ettr(started, end: float) -> tuple[list[dict], Ettr]:
    """ETTR of every training job of 512 GPUs or more, and their GPU-weighted sum."""
    training = [j for j in started if j.spec.kind == "training" and j.spec.gpus >= 512]
    ettr_jobs = []
    weighted = []
    for j in training:
        stop = j.ended if j.ended is not None else end
        span = stop - j.first_admit
        if span <= 0:
            continue
        acc = Ettr(span, dict(j.ettr.buckets))
        if j.held is not None and j.ended is None:
            # still running at the end: the work since its last restore point is not yet safe
            # (what a fault at the end would lose: sim.runs.save, the same rule)
            acc.add("lost_work", j.unsaved_s(end))
        if j.waiting_since is not None:
            acc.add("waiting", end - j.waiting_since)
        ettr_jobs.append(
            {
                "id": j.spec.id,
                "gpus": j.spec.gpus,
                "wall_s": round(span, 1),
                "ettr": round(acc.ratio, 5),
                "interruptions": j.interruptions,
                **{f"{k}_s": round(v, 1) for k, v in acc.buckets.items()},
            }
        )
        weighted.append(acc.weighted(j.spec.gpus))
    return ettr_jobs, Ettr.total(weighted)


def _completion(jobs) -> dict:
    """Job completion time (arrival to end) of the jobs that completed, and the wait before their
    first start of every job that started."""
    done = [j.ended - j.spec.arrival for j in jobs if j.ended is not None and j.spec.outcome == "completed"]
    waits = [j.first_admit - j.spec.arrival for j in jobs if j.first_admit is not None]
    return {
        "completed": len(done),
        "mean_jct_s": round(float(np.mean(done)), 1) if done else None,
        "mean_wait_s": round(float(np.mean(waits)), 1) if waits else None,
        "p95_wait_s": round(float(np.percentile(waits, 95)), 1) if waits else None,
    }


def summarize(self, wall: float) -> dict:
    """The report of a finished simulation: jobs, utilization, pending time by size, ETTR and
    its loss buckets, faults, recoveries, inference, the engine's own figures and the series."""
    end = self.cfg.days * DAY
    gpus = self.topo.num_gpus
    started = [j for j in self.jobs.values() if j.first_admit is not None]
    arrived = [j for j in self.jobs.values() if j.spec.arrival <= end]
    pending_time = _pending_time(started, arrived)
    ettr_jobs, total = _training_ettr(started, end)
    outcomes = Counter(j.spec.outcome for j in self.jobs.values() if j.ended is not None)
    alloc = [s["allocated"] / gpus for s in self.samples]
    busy = [s["busy"] / gpus for s in self.samples]
    rec = [s for _, _, s in self.recoveries]
    return {
        "name": self.cfg.name,
        "days": self.cfg.days,
        "seed": self.cfg.seed,
        "gpus": gpus,
        "checkpoint": {
            "kind": self.cfg.checkpoint.kind.value,
            "interval_s": self.cfg.checkpoint.interval_s,
        },
        "jobs": {
            "arrived": len(arrived),
            "started": len(started),
            "ended": sum(outcomes.values()),
            "ended_by_outcome": dict(outcomes),
            "running_at_end": len(self.running),
            "pending_at_end": len(self.pending),
        },
        "utilization": {
            "allocated_mean": round(float(np.mean(alloc)), 4) if alloc else 0.0,
            "busy_mean": round(float(np.mean(busy)), 4) if busy else 0.0,
        },
        "pending_time_by_size": pending_time,
        "completion": _completion(self.jobs.values()),
        "sites": self.sites.report(min(end, self.now)),
        "ettr": {
            "jobs": len(ettr_jobs),
            "gpu_weighted": round(total.ratio, 5) if total.ratio is not None else None,
            "loss_share": {k: round(v, 5) for k, v in total.shares().items()} if total.wall_s else {},
        },
        "faults": {
            "total": sum(self.hardware.faults.values()),
            "by_cause": dict(self.hardware.faults.most_common()),
            "interruptions": sum(j.interruptions for j in self.jobs.values()),
        },
        "recoveries": {
            "count": len(rec),
            "by_outcome": dict(Counter(o for _, o, _ in self.recoveries)),
            "median_s": round(float(np.median(rec)), 1) if rec else None,
        },
        "inference": self.services.report(),
        "engine": {
            "cycles": self.cycles,
            "invariant_checks": self.checked,
            "events": self.processed,
            "wall_s": round(wall, 2),
            "events_per_s": round(self.processed / wall, 1) if wall else None,
        },
        "series": {
            "samples": self.samples,
            "faults": [list(f) for f in self.hardware.log],
            "recoveries": [list(r) for r in self.recoveries],
            "ettr_jobs": ettr_jobs,
        },
    }


def take_sample(self) -> None:
    """The hourly sample of the simulated cluster: allocation, network, fleet telemetry."""
    busy = sum(j.size for j in self.running.values() if self.now >= j.run_start)
    util = np.zeros(self.topo.num_gpus, dtype=np.float32)
    held = self.owner >= 0
    util[held] = self.cfg.fleet.training_util
    self.hardware.fleet.step(self.now, util)
    self.network.load(
        [
            (j.held, *traffic_per_gpu(j.spec.parameters, j.spec.chip, j.size))
            for j in self.running.values()
            if j.spec.kind == "training"
        ]
    )
    self.network.count_errors(self.cfg.sample_period_s, self.net_rng)
    net = self.network.utilization()
    self.samples.append(
        {
            "t": self.now,
            "rack_uplink_util_max": round(float(net["rack"].max(initial=0)), 4),
            "pod_uplink_util_max": round(float(net["pod"].max(initial=0)), 4),
            "datacenter_link_util_max": round(max(net["datacenter"].values(), default=0.0), 4),
            "link_errors": int(self.network.rack_errors.sum() + self.network.pod_errors.sum()),
            "allocated": int(held.sum()),
            "busy": int(busy),
            "running_jobs": len(self.running),
            "inference_replicas": self.services.running_replicas(self.running),
            "pending_jobs": len(self.pending),
            "pending_gpus": int(sum(p.gpus for p in self.pending.values())),
            "down_gpus": int(
                (self.topo.gpu_state != GPU_READY).sum()
                + (self.topo.node_state[self.topo.gpu_node] != READY).sum()
            ),
            "mean_temperature_c": round(float(self.hardware.fleet.temperature.mean()), 2),
            "power_mw": round(float(self.hardware.fleet.power.sum()) / 1e6, 3),
        }
    )
