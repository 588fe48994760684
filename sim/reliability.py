"""Effective training time of one large training job under faults, seeded.

A job of ``gpus`` GPUs trains for ``days`` of wall time. Faults arrive on its nodes at the
physics' rate (lemon nodes fault more often), are classified (engine.faults), detected after the
policy's recovery tier (engine.tiers), and recovered from: a triggered checkpoint when the policy
has one and the fault left memory readable (it succeeds with the policy's probability), else the
newest in-memory copy (tier ``in_memory``) or checkpoint that reached durable storage; a spare
node replaces a faulty one (the job waits for a repaired node when none is left); then the job
restarts (reschedule, process start, communicator init, checkpoint load, as the tier's steps say).
Under ``replica_groups`` only the in-flight step is lost and the job trains on at (R-1)/R until
the group rejoins (or a repaired node is back for it). Every fault is judged by the controller's
verdict (engine.lifecycle.judge): what leaves service is out for a GPU reset or a node reboot
(minutes) or a repair (lognormal, days), as engine.physics says; a node that meets the lemon rule
(three faults within a week) is quarantined and does not come back. A fault that keeps the
hardware (a job restart, a link) restarts the job where it is.

ETTR = time with forward progress that survived / wall time; the loss buckets are checkpoint
stalls, detection latency, restart, recomputed lost work, degraded throughput and waiting for
resources, and they add up with the productive time to the wall time exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from engine import tiers
from engine.checkpoint import CheckpointKind, daly_interval, stall_seconds
from engine.ettr import ETTR_BUCKETS, Ettr
from engine.lifecycle import Verdict, checkpoint_bytes, judge, unsaved_s
from engine.physics import Physics
from engine.policy import CheckpointPolicy

DAY = 86_400.0
BUCKETS = ETTR_BUCKETS


@dataclass
class RunReport:
    policy: str
    gpus: int
    account: Ettr  # wall time and loss buckets (engine.ettr)
    productive_s: float = 0.0  # training time that survived, counted as it happens
    faults: int = 0
    interruptions: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    checkpoints: int = 0
    interval_s: float = 0.0
    triggered_saved: int = 0
    lemons_quarantined: int = 0
    tier: str = tiers.RecoveryTier.RESTART
    verdicts: list[tuple[float, Verdict]] = field(default_factory=list)  # (time, verdict) per fault

    @property
    def wall_s(self) -> float:
        return self.account.wall_s

    @property
    def buckets(self) -> dict[str, float]:
        return self.account.buckets

    @property
    def ettr(self) -> float:
        return self.account.ratio

    @property
    def median_recovery_s(self) -> float:
        return float(np.median(self.recoveries_s)) if self.recoveries_s else 0.0

    def as_dict(self) -> dict:
        return {
            "policy": self.policy,
            "tier": self.tier,
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
    policy: CheckpointPolicy,
    *,
    days: float = 7.0,
    seed: int = 0,
    physics: Physics | None = None,
    gpus_per_node: int = 8,
    spare_nodes: int | None = None,
    chip_failure_factor: float = 1.0,
) -> RunReport:
    run = _TrainingRun(
        gpus, parameters, policy, seed, physics or Physics(), gpus_per_node, spare_nodes, chip_failure_factor
    )
    return run.run(days * DAY)


class _TrainingRun:
    """One job's timeline: train to the next checkpoint or fault, checkpoint, or recover."""

    def __init__(self, gpus, parameters, policy, seed, ph, gpus_per_node, spare_nodes, chip_failure_factor):
        self.gpus, self.policy, self.ph, self.gpus_per_node = gpus, policy, ph, gpus_per_node
        self.rng = np.random.default_rng(seed)  # faults, causes, repairs: one stream for every policy
        self.luck = np.random.default_rng([seed, 1])  # whether a triggered checkpoint succeeds
        nodes = max(1, gpus // gpus_per_node)
        spares = spare_nodes if spare_nodes is not None else max(2, nodes // 62)  # 2 per 125-node pod
        # per-node fault rates: lemons fault k times as often; the mean equals the physics' rate
        lemon = self.rng.random(nodes + spares) < ph.lemon_node_fraction
        base = ph.gpu_interruptions_per_day * chip_failure_factor * gpus_per_node / DAY
        base /= 1 - ph.lemon_node_fraction + ph.lemon_node_fraction * ph.lemon_rate_factor
        self.rate = np.where(lemon, base * ph.lemon_rate_factor, base)
        self.in_job = list(range(nodes))
        self.spare_pool = list(range(nodes, nodes + spares))
        self.repairs: list[tuple[float, int]] = []  # (back at, node)
        self.fault_times: dict[int, list[tuple[float, str, int | None]]] = {}
        self.state = checkpoint_bytes(parameters, ph)
        self.durable_write = self.state / (ph.storage_gbps(gpus) * 1e9)
        self.stall = stall_seconds(policy.kind, self.state, gpus, ph.storage_gbps(gpus), ph.host_copy_gbps)
        self.interval = self._interval()
        self.tier = tiers.RecoveryTier(policy.tier)
        self.step_s = tiers.step_seconds(parameters, gpus)
        self.replica_groups = policy.replica_groups
        self.replicas = (
            tiers.has(self.tier, tiers.RecoveryTier.REPLICA_GROUPS) and gpus >= 2 * self.replica_groups
        )
        self.in_memory = tiers.has(self.tier, tiers.RecoveryTier.IN_MEMORY)
        self.copy_interval = tiers.in_memory_interval(self.state, gpus, self.step_s, ph)
        self.coordination = tiers.coordination_share(self.tier, self.step_s) if self.replicas else 0.0
        self.groups_back: list[float] = []  # when each replica group that is out rejoins
        self.report = RunReport(policy.label, gpus, Ettr(), interval_s=self.interval, tier=self.tier)
        self.buckets = self.report.account.buckets
        self.t = 0.0
        self.resumed_at = 0.0  # when training last (re)started: in-memory copies and steps count from it
        self.progress = 0.0  # compute seconds of training done (in the current timeline)
        self.durable = 0.0  # progress safe in durable storage
        self.pending_write: tuple[float, float] | None = None  # (progress, wall time it lands), async
        self.since_ckpt = 0.0

    def _interval(self) -> float:
        policy, periodic = self.policy, self.policy.kind == CheckpointKind.PERIODIC
        if policy.interval_s is None:
            job_rate = float(self.rate[self.in_job].sum())
            interval = max(daly_interval(self.stall, 1.0 / job_rate), 1.0 if periodic else self.durable_write)
        else:
            interval = policy.interval_s
        return interval if periodic else max(interval, self.durable_write)  # a copy waits for the last

    def _next_fault(self) -> float:
        return self.t + self.rng.exponential(1.0 / float(self.rate[self.in_job].sum()))

    def _land_writes(self) -> None:
        if self.pending_write is not None and self.pending_write[1] <= self.t:
            self.durable = max(self.durable, self.pending_write[0])
            self.pending_write = None

    def _train(self, dt: float) -> None:
        """Train for ``dt`` wall seconds: progress at full rate less the replica groups' quorum and
        the groups that are out (until each rejoins); what is given up is degraded time."""
        end = self.t + dt
        done, at = 0.0, self.t
        out = sorted(b for b in self.groups_back if b > self.t)
        for back in [*out, end]:
            upto = min(back, end)
            if upto > at:
                share = (
                    (self.replica_groups - len([b for b in out if b > at])) / self.replica_groups
                    if self.replicas
                    else 1.0
                )
                done += (upto - at) * share * (1.0 - self.coordination)
                at = upto
            if back >= end:
                break
        self.groups_back = [b for b in self.groups_back if b > end]
        done = min(done, dt)  # rounding never makes degraded time negative
        self.progress += done
        self.buckets["degraded"] += dt - done
        self.t = end

    def run(self, end: float) -> RunReport:
        next_fault = self._next_fault()
        while self.t < end:
            to_ckpt = self.interval - self.since_ckpt
            if next_fault >= self.t + to_ckpt and self.t + to_ckpt < end:
                self._checkpoint(to_ckpt)
                continue
            if next_fault >= end:
                self._train(end - self.t)
                break
            # a fault: train until it, then recover
            self.since_ckpt += next_fault - self.t
            self._train(next_fault - self.t)
            self._land_writes()
            self._fault()
            next_fault = self._next_fault()
        # wall time = training time that survived + every loss bucket (a recovery may end later)
        self.report.account.wall_s = self.t
        self.report.productive_s = self.progress
        return self.report

    def _checkpoint(self, to_ckpt: float) -> None:
        """Train until the checkpoint, then take it."""
        self._train(to_ckpt)
        self.since_ckpt = 0.0
        self._land_writes()
        self.t += self.stall
        self.buckets["checkpoint_stall"] += self.stall
        self.report.checkpoints += 1
        if self.policy.kind == CheckpointKind.PERIODIC:
            self.durable = self.progress
        else:
            self.pending_write = (self.progress, self.t + self.durable_write)

    def _fault(self) -> None:
        """A fault on one of the job's nodes, drawn by the physics' rates and cause mix."""
        rng = self.rng
        weights = self.rate[self.in_job]
        victim_pos = int(rng.choice(len(self.in_job), p=weights / weights.sum()))
        names, shares = self.ph.cause_shares()
        cause = names[int(rng.choice(len(names), p=shares))]
        _, source, xid = self.ph.causes[cause]
        self.hit(victim_pos, source, xid)

    def hit(self, victim_pos: int, source: str, xid: int | None = None) -> Verdict:
        """A fault of ``source`` (and ``xid``) now on the job's node at ``victim_pos``, judged and
        recovered from as the controller does."""
        report = self.report
        report.faults += 1
        victim = self.in_job[victim_pos]
        history = self.fault_times.setdefault(victim, [])
        v = judge(history, self.t, source, xid)
        history.append((self.t, source, xid))
        report.verdicts.append((self.t, v))
        c = v.classification
        if not c.interrupts_job:
            return v
        report.interruptions += 1
        started = self.t
        moved = v.out != ""  # the job moves off what left service; a restart or a link keeps its nodes
        if self.replicas:
            self._drop_group(c, victim_pos, victim, v, moved)
            report.recoveries_s.append(self.t - started)
            return v
        detection = tiers.detection_seconds(c, self.tier, self.step_s)
        self.t += detection
        self.buckets["detection"] += detection
        from_memory = self._restore(c)
        if moved:  # the controller's rule: replace what left service
            available = self._swap(victim_pos, victim, v)
            wait = max(0.0, available - self.t)
            self.t += wait
            self.buckets["waiting"] += wait
        steps = tiers.recovery_steps(
            c,
            self.tier,
            gpus=self.gpus,
            state=self.state,
            from_memory=from_memory,
            moved=moved,
            step_s=self.step_s,
            replica_groups=self.replica_groups,
            ph=self.ph,
        )
        restart = sum(s.seconds for s in steps if s.name != "detect" and s.throughput_lost == 1.0)
        self.t += restart
        self.buckets["restart"] += restart
        self.resumed_at = self.t
        report.recoveries_s.append(self.t - started)
        return v

    def _drop_group(self, c, victim_pos: int, victim: int, v: Verdict, moved: bool) -> None:
        """Replica groups: the job stops until the fault is found, loses its in-flight step, and
        trains on without the victim's group until the group rejoins."""
        detection = tiers.detection_seconds(c, self.tier, self.step_s)
        in_step = unsaved_s(self.t, self.resumed_at, None, every=self.step_s)
        lost = min(self.progress - self.durable, in_step * (1.0 - self.coordination))
        self.progress -= lost
        self.buckets["lost_work"] += lost
        self.t += detection
        self.buckets["detection"] += detection
        available = self._swap(victim_pos, victim, v) if moved else self.t
        rejoin = tiers.rejoin_seconds(self.state, self.gpus, self.replica_groups, self.ph)
        self.groups_back.append(max(available, self.t) + rejoin)
        self.resumed_at = self.t

    def _restore(self, c) -> bool:
        """Roll back to what survives the fault; returns whether it is restored from host memory."""
        kind = self.policy.kind
        if (
            kind == CheckpointKind.TRIGGERED
            and c.memory_readable
            and self.luck.random() < self.policy.triggered_success
        ):
            recovered, from_memory = self.progress, True
            self.report.triggered_saved += 1
        elif self.in_memory:  # the newest copy in a peer's host memory
            since_copy = unsaved_s(self.t, self.resumed_at, None, every=self.copy_interval)
            recovered, from_memory = max(self.durable, self.progress - since_copy), True
            self.durable = max(self.durable, recovered)
        elif (
            kind != CheckpointKind.PERIODIC
            and self.pending_write is None
            and self.durable >= self.progress - self.since_ckpt
        ):
            recovered, from_memory = self.durable, True  # the last copy landed and is also in memory
        else:
            recovered, from_memory = self.durable, kind != CheckpointKind.PERIODIC
        self.pending_write = None
        self.buckets["lost_work"] += self.progress - recovered
        self.progress = recovered
        self.since_ckpt = 0.0
        return from_memory

    def _swap(self, victim_pos: int, victim: int, v: Verdict) -> float:
        """The faulty node leaves (for a reset, a reboot or a repair, as long as the physics says;
        for good as a lemon) and a spare takes its place; returns when the replacement is there (a
        repaired node's return when no spare is left)."""
        self.in_job.pop(victim_pos)
        if v.lemon:
            self.report.lemons_quarantined += 1
        else:
            heapq.heappush(self.repairs, (self.t + self.ph.out_of_service_s(v.returns, self.rng), victim))
        while self.repairs and self.repairs[0][0] <= self.t:
            self.spare_pool.append(heapq.heappop(self.repairs)[1])
        available = self.t
        if not self.spare_pool:
            back_at, node = heapq.heappop(self.repairs)
            available = max(self.t, back_at)
            self.spare_pool.append(node)
        self.in_job.append(self.spare_pool.pop(0))
        return available
