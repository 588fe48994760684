"""Effective training time of one large training job under faults, seeded.

A job of ``gpus`` GPUs trains for ``days`` of wall time. Faults arrive on its nodes at the
physics' rate (lemon nodes fault more often), are classified (engine.faults), detected after the
classification's detection latency, and recovered from: a triggered checkpoint when the policy
has one and the fault left memory readable (it succeeds with the policy's probability), else the
newest checkpoint that reached durable storage; a spare node replaces a faulty one (the job waits
for a repaired node when none is left); then the job restarts (reschedule, process start,
communicator init, checkpoint load). Faulty nodes go to repair for a lognormal time; a node that
meets the controller's lemon rule (engine.lifecycle: three faults within a week) is quarantined
and does not come back.

ETTR = time with forward progress that survived / wall time; the loss buckets are checkpoint
stalls, detection latency, restart, recomputed lost work and waiting for resources, and they add
up with the productive time to the wall time exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from engine.checkpoint import CheckpointKind, daly_interval, stall_seconds
from engine.faults import Action, classify
from engine.lifecycle import checkpoint_bytes, is_lemon, recent_faults
from engine.physics import Physics

DAY = 86_400.0
BUCKETS = ("checkpoint_stall", "detection", "restart", "lost_work", "waiting")


@dataclass(frozen=True)
class RunPolicy:
    name: str
    kind: CheckpointKind
    interval_s: float | None  # None: auto (Daly, never shorter than the durable write)
    triggered_success: float = 0.95


@dataclass
class RunReport:
    policy: str
    gpus: int
    wall_s: float
    productive_s: float
    buckets: dict[str, float]
    faults: int
    interruptions: int
    recoveries_s: list[float] = field(default_factory=list)
    checkpoints: int = 0
    interval_s: float = 0.0
    triggered_saved: int = 0
    lemons_quarantined: int = 0

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s

    @property
    def median_recovery_s(self) -> float:
        return float(np.median(self.recoveries_s)) if self.recoveries_s else 0.0

    def as_dict(self) -> dict:
        return {
            "policy": self.policy,
            "gpus": self.gpus,
            "ettr": round(self.ettr, 4),
            "interval_s": round(self.interval_s, 1),
            "faults": self.faults,
            "interruptions": self.interruptions,
            "checkpoints": self.checkpoints,
            "triggered_saved": self.triggered_saved,
            "median_recovery_s": round(self.median_recovery_s, 1),
            "lemons_quarantined": self.lemons_quarantined,
            **{f"loss_{k}_pct": round(100 * v / self.wall_s, 3) for k, v in self.buckets.items()},
        }


def simulate_training(
    gpus: int,
    parameters: float,
    policy: RunPolicy,
    *,
    days: float = 7.0,
    seed: int = 0,
    physics: Physics | None = None,
    gpus_per_node: int = 8,
    spare_nodes: int | None = None,
    chip_failure_factor: float = 1.0,
) -> RunReport:
    ph = physics or Physics()
    rng = np.random.default_rng(seed)  # faults, causes, repairs: the same stream for every policy
    luck = np.random.default_rng([seed, 1])  # whether a triggered checkpoint succeeds
    nodes = max(1, gpus // gpus_per_node)
    spares = spare_nodes if spare_nodes is not None else max(2, nodes // 62)  # 2 per 125-node pod
    # per-node fault rates: lemons fault k times as often; the mean equals the physics' rate
    lemon = rng.random(nodes + spares) < ph.lemon_node_fraction
    base = ph.gpu_interruptions_per_day * chip_failure_factor * gpus_per_node / DAY
    base /= 1 - ph.lemon_node_fraction + ph.lemon_node_fraction * ph.lemon_rate_factor
    rate = np.where(lemon, base * ph.lemon_rate_factor, base)
    in_job = list(range(nodes))
    spare_pool = list(range(nodes, nodes + spares))
    repairs: list[tuple[float, int]] = []  # (back at, node)
    fault_times: dict[int, list[float]] = {}
    quarantined = 0

    state = checkpoint_bytes(parameters, ph)
    durable_write = state / (ph.storage_gbps(gpus) * 1e9)
    shard_per_gpu = state / gpus
    stall = stall_seconds(policy.kind, state, gpus, ph.storage_gbps(gpus), ph.host_copy_gbps)
    job_rate = float(rate[in_job].sum())
    if policy.interval_s is None:
        interval = max(
            daly_interval(stall, 1.0 / job_rate),
            durable_write if policy.kind != CheckpointKind.PERIODIC else 1.0,
        )
    else:
        interval = policy.interval_s
    if policy.kind != CheckpointKind.PERIODIC:
        interval = max(interval, durable_write)  # the next copy waits for the last write to land

    names, shares = ph.cause_shares()
    buckets = dict.fromkeys(BUCKETS, 0.0)
    report = RunReport(policy.name, gpus, 0.0, 0.0, buckets, 0, 0, interval_s=interval)
    end = days * DAY
    t = 0.0
    progress = 0.0  # compute seconds of training done (in the current timeline)
    durable = 0.0  # progress safe in durable storage
    pending_write: tuple[float, float] | None = None  # (progress, wall time it lands) for async
    since_ckpt = 0.0

    def land_writes(now: float) -> None:
        nonlocal durable, pending_write
        if pending_write is not None and pending_write[1] <= now:
            durable = max(durable, pending_write[0])
            pending_write = None

    next_fault = t + rng.exponential(1.0 / job_rate)
    while t < end:
        to_ckpt = interval - since_ckpt
        if next_fault >= t + to_ckpt and t + to_ckpt < end:
            # train until the checkpoint, then take it
            t += to_ckpt
            progress += to_ckpt
            since_ckpt = 0.0
            land_writes(t)
            t += stall
            buckets["checkpoint_stall"] += stall
            report.checkpoints += 1
            if policy.kind == CheckpointKind.PERIODIC:
                durable = progress
            else:
                pending_write = (progress, t + durable_write)
            continue
        if next_fault >= end:
            progress += end - t
            t = end
            break
        # a fault: train until it, then recover
        progress += next_fault - t
        since_ckpt += next_fault - t
        t = next_fault
        land_writes(t)
        report.faults += 1
        weights = rate[in_job]
        victim_pos = int(rng.choice(len(in_job), p=weights / weights.sum()))
        victim = in_job[victim_pos]
        cause = names[int(rng.choice(len(names), p=shares))]
        _, source, xid = ph.causes[cause]
        history = fault_times.setdefault(victim, [])
        repeated = recent_faults(history, t) >= 1
        history.append(t)
        c = classify(source, xid, repeated_on_node=repeated) if source == "xid" else classify(source)
        if not c.interrupts_job:
            next_fault = t + rng.exponential(1.0 / float(rate[in_job].sum()))
            continue
        report.interruptions += 1
        recovery_started = t
        t += c.detection_s
        buckets["detection"] += c.detection_s
        # what survives
        if (
            policy.kind == CheckpointKind.TRIGGERED
            and c.memory_readable
            and luck.random() < policy.triggered_success
        ):
            recovered, from_memory = progress, True
            report.triggered_saved += 1
        elif (
            policy.kind != CheckpointKind.PERIODIC
            and pending_write is None
            and durable >= progress - since_ckpt
        ):
            recovered, from_memory = durable, True  # the last copy landed and is also in host memory
        else:
            recovered, from_memory = durable, policy.kind != CheckpointKind.PERIODIC
        pending_write = None
        buckets["lost_work"] += progress - recovered
        progress = recovered
        since_ckpt = 0.0
        # replace hardware that left service
        replace = c.action in (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPAIR_NODE)
        restart = ph.restart_s(gpus)
        if replace:
            in_job.pop(victim_pos)
            lemon_now = is_lemon(recent_faults(history, t))  # the controller's quarantine rule
            if lemon_now:
                quarantined += 1
            else:
                repair_days = rng.lognormal(np.log(ph.repair_median_days), ph.repair_sigma())
                heapq.heappush(repairs, (t + repair_days * DAY, victim))
            while repairs and repairs[0][0] <= t:
                spare_pool.append(heapq.heappop(repairs)[1])
            if not spare_pool:
                back_at, node = heapq.heappop(repairs)
                wait = max(0.0, back_at - t)
                t += wait
                buckets["waiting"] += wait
                spare_pool.append(node)
            in_job.append(spare_pool.pop(0))
        if from_memory:
            load = (shard_per_gpu * gpus_per_node) / (ph.peer_load_gbps * 1e9)
        else:
            load = state / (ph.storage_gbps(gpus) * 1e9)
        restart += load
        t += restart
        buckets["restart"] += restart
        report.recoveries_s.append(t - recovery_started)
        next_fault = t + rng.exponential(1.0 / float(rate[in_job].sum()))
    # wall time = training time that survived + every loss bucket (a recovery may end past the window)
    report.wall_s = t
    report.productive_s = progress
    report.lemons_quarantined = quarantined
    return report
