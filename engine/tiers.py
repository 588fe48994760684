"""Recovery tiers: how much of a training job a fault costs, from a whole restart down to one step.

A tier is a checkpoint policy's recovery choice. Each tier includes the ones above it:

1. ``restart``: faults are found at the standard latencies (engine.faults: 30 s for an XID read
   from the driver log, 60 s for a lost heartbeat, 300 s for a hang found by the collective
   watchdog); every process restarts and reloads the newest checkpoint.
2. ``fast_detection``: the node agent reports an XID the moment NVML raises it, heartbeats every
   few seconds, and the job reports its step counter per rank, so the control plane finds a hang
   from progress (engine.progress) in tens of seconds instead of the watchdog's minutes.
3. ``warm_restart``: healthy nodes keep their processes and their state in memory; a faulty node
   is replaced by a warm standby (ByteRobust, SOSP'25: warm standbys; its processes and image are
   ready before it is needed) that loads its shard; every rank re-initializes its communicators
   (MegaScale, NSDI'24: under 30 s above 10k GPUs). Work since the last checkpoint is still lost.
4. ``in_memory``: the job also copies its state to a peer node's host memory every step or as
   often as the network allows (Gemini, SOSP'23: in-memory checkpoints every iteration, traffic
   interleaved with training, over 13x faster recovery than from remote storage); a fault loses
   the work since the last copy and the replaced node loads its shard from the peer.
5. ``replica_groups``: the job runs as R data-parallel replica groups that each hold the whole
   model (TorchFT's fault-tolerant HSDP; Oobleck, SOSP'23, pipeline replicas): a fault removes the
   group that holds the node, the others keep training at (R-1)/R throughput, the in-flight step
   is lost (about one step of work), and a replacement node with the rest of its group rejoins
   by copying state from a peer group. The cost is a per-step quorum the groups agree on
   (TorchFT's Lighthouse) and the throughput of the missing group while it is out.

Every figure is a ``TierPhysics`` field with its source or, where no source gives it, the
assumption written next to it; none is free: host memory, network share and throughput are
reported by ``costs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from engine.faults import Classification, Signal
from engine.physics import Physics
from engine.progress import ProgressRule


class RecoveryTier(StrEnum):
    RESTART = "restart"
    FAST_DETECTION = "fast_detection"
    WARM_RESTART = "warm_restart"
    IN_MEMORY = "in_memory"
    REPLICA_GROUPS = "replica_groups"


TIERS: tuple[str, ...] = tuple(RecoveryTier)
DEFAULT_REPLICA_GROUPS = 8


def has(tier: str, mechanism: RecoveryTier) -> bool:
    """Whether ``tier`` includes ``mechanism`` (each tier includes the ones before it)."""
    return TIERS.index(RecoveryTier(tier)) >= TIERS.index(mechanism)


@dataclass(frozen=True)
class TierPhysics:
    # fast detection
    xid_event_s: float = 2.0  # NVML event wait wakes the agent, which posts at once (seconds)
    link_event_s: float = 2.0  # a NIC's port state change, read the same way
    heartbeat_period_s: float = 5.0
    heartbeat_misses: int = 3  # a node is lost after three missed heartbeats: 15 s
    progress_period_s: float = 5.0  # how often the job's per-rank step counter reaches the agent
    # the step-time model (Llama 3: 16M-token global batch, 380-430 TFLOPs per H100 in BF16)
    tokens_per_step: float = 16e6
    achieved_flops: float = 400e12
    # in-memory checkpoints: the copy to a peer may use this share of a NIC's time (Gemini
    # schedules its traffic into the network's idle time; 10% is our assumption, not Gemini's)
    in_memory_nic_share: float = 0.10
    # replica groups: per-step quorum and commit vote not hidden behind the backward pass
    # (TorchFT overlaps the quorum with backward; 30 ms per step is our conservative assumption)
    quorum_s_per_step: float = 0.03

    def heartbeat_s(self) -> float:
        return self.heartbeat_period_s * self.heartbeat_misses

    def hang_s(self, step_s: float) -> float:
        """Time from a hang to the control plane naming it from progress reports: the hang rule
        of engine.progress (no rank moved for three steps, at least 30 s) and one report."""
        return ProgressRule().hang_s(step_s) + self.progress_period_s


def step_seconds(parameters: float, gpus: int, tp: TierPhysics | None = None) -> float:
    """One optimizer step: 6 x parameters x tokens per step / (GPUs x achieved FLOP/s)."""
    tp = tp or TierPhysics()
    return 6.0 * parameters * tp.tokens_per_step / (max(gpus, 1) * tp.achieved_flops)


def detection_seconds(c: Classification, tier: str, step_s: float, tp: TierPhysics | None = None) -> float:
    """How long after the fault the control plane knows of it under ``tier``."""
    if not has(tier, RecoveryTier.FAST_DETECTION):
        return c.detection_s
    tp = tp or TierPhysics()
    fast = {
        Signal.XID: tp.xid_event_s,
        Signal.LINK: tp.link_event_s,
        Signal.HEARTBEAT: tp.heartbeat_s(),
        Signal.HANG: tp.hang_s(step_s),
    }
    return min(c.detection_s, fast.get(c.signal, c.detection_s))


def shard_bytes_per_node(state: float, gpus: int, gpus_per_node: int = 8) -> float:
    return state / max(gpus, 1) * min(gpus_per_node, max(gpus, 1))


def in_memory_interval(
    state: float, gpus: int, step_s: float, ph: Physics | None = None, tp: TierPhysics | None = None
) -> float:
    """Seconds between in-memory copies: every step, unless copying a node's shard to its peer
    would take more than the NIC share the copy may use."""
    ph, tp = ph or Physics(), tp or TierPhysics()
    copy_s = shard_bytes_per_node(state, gpus) / (ph.peer_load_gbps * 1e9)
    return max(step_s, copy_s / tp.in_memory_nic_share)


def replica_group_gpus(gpus: int, replica_groups: int) -> int:
    return max(1, gpus // max(replica_groups, 1))


def rejoin_seconds(state: float, gpus: int, replica_groups: int, ph: Physics | None = None) -> float:
    """A replacement node and the rest of its group back in the job: choose the node, start its
    processes, build the group's communicators, copy the group's shard of the state from a peer
    group over one NIC."""
    ph = ph or Physics()
    group = replica_group_gpus(gpus, replica_groups)
    copy = shard_bytes_per_node(state, group) / (ph.peer_load_gbps * 1e9)
    return ph.reschedule_s + ph.process_start_s + ph.comm_init_s(group) + copy


@dataclass(frozen=True)
class Step:
    name: str
    seconds: float
    detail: str = ""
    throughput_lost: float = 1.0  # 1: the job is stopped; less: it trains on at the rest


def recovery_steps(
    c: Classification,
    tier: str,
    *,
    gpus: int,
    state: float,
    from_memory: bool,
    moved: bool,
    step_s: float,
    replica_groups: int = DEFAULT_REPLICA_GROUPS,
    ph: Physics | None = None,
    tp: TierPhysics | None = None,
) -> list[Step]:
    """What a job does from the fault until it trains again, under ``tier``. ``moved``: a node
    was replaced. ``from_memory``: the newest checkpoint is also in host memory (asynchronous and
    triggered policies)."""
    ph, tp = ph or Physics(), tp or TierPhysics()
    steps = [Step("detect", detection_seconds(c, tier, step_s, tp), c.description)]
    r = replica_groups
    if has(tier, RecoveryTier.REPLICA_GROUPS) and gpus >= 2 * r and r >= 2:
        steps.append(
            Step(
                "rejoin",
                rejoin_seconds(state, gpus, r, ph),
                f"the group rejoins from a peer group; the others train at {r - 1}/{r}",
                throughput_lost=1.0 / r,
            )
        )
        return steps
    warm = has(tier, RecoveryTier.WARM_RESTART)
    if moved:
        steps.append(Step("reschedule", ph.reschedule_s, "replacement GPUs chosen and prepared"))
    if warm:
        # a replacement is a warm standby (processes started, image and data loaded beforehand);
        # in place, only a rank whose process an XID killed starts again, hung or cut-off ranks
        # abort their communicators and stay
        start = ph.process_start_s if not moved and c.signal == Signal.XID else 0.0
        what = (
            "healthy nodes keep their processes, a warm standby replaces a faulty node; communicators rebuilt"
        )
    else:
        start = ph.process_start_s
        what = "process start and communicator initialization"
    steps.append(Step("restart", start + ph.comm_init_s(gpus), what))
    if has(tier, RecoveryTier.IN_MEMORY) or from_memory:
        # healthy nodes restore from their own host memory, a new node from a peer's (the slower)
        load = shard_bytes_per_node(state, gpus) / (ph.peer_load_gbps * 1e9)
        steps.append(Step("load", load, "state restored from host memory (a peer's for a new node)"))
    else:
        steps.append(
            Step("load", state / (ph.storage_gbps(gpus) * 1e9), "checkpoint loaded from durable storage")
        )
    return steps


def rollback_interval(
    tier: str,
    checkpoint_interval: float,
    *,
    state: float,
    gpus: int,
    step_s: float,
    replica_groups: int = DEFAULT_REPLICA_GROUPS,
    ph: Physics | None = None,
) -> float:
    """How far apart the points a fault can roll back to are: one step with replica groups, an
    in-memory copy, else a checkpoint."""
    if has(tier, RecoveryTier.REPLICA_GROUPS) and gpus >= 2 * replica_groups and replica_groups >= 2:
        return step_s
    if has(tier, RecoveryTier.IN_MEMORY):
        return min(checkpoint_interval, in_memory_interval(state, gpus, step_s, ph))
    return checkpoint_interval


def coordination_share(tier: str, step_s: float, tp: TierPhysics | None = None) -> float:
    """Share of training time spent in the replica groups' per-step quorum (0 for other tiers)."""
    if not has(tier, RecoveryTier.REPLICA_GROUPS):
        return 0.0
    tp = tp or TierPhysics()
    return tp.quorum_s_per_step / (step_s + tp.quorum_s_per_step)


def costs(
    tier: str,
    *,
    parameters: float,
    gpus: int,
    replica_groups: int = DEFAULT_REPLICA_GROUPS,
    ph: Physics | None = None,
    tp: TierPhysics | None = None,
) -> dict[str, float]:
    """What the tier costs the job: host memory per node, the NIC share of in-memory copies,
    the throughput given to coordination, and its recovery figures."""
    ph, tp = ph or Physics(), tp or TierPhysics()
    state = parameters * ph.bytes_per_parameter
    step_s = step_seconds(parameters, gpus, tp)
    shard = shard_bytes_per_node(state, gpus)
    out = {
        "step_s": round(step_s, 3),
        "host_memory_gb_per_node": round(shard / 1e9, 2),  # the asynchronous copy of its own shard
        "nic_share": 0.0,
        "throughput_overhead": round(coordination_share(tier, step_s, tp), 5),
    }
    if has(tier, RecoveryTier.IN_MEMORY):
        interval = in_memory_interval(state, gpus, step_s, ph, tp)
        copy_s = shard / (ph.peer_load_gbps * 1e9)
        out["host_memory_gb_per_node"] = round(2 * shard / 1e9, 2)  # its own and a peer's
        out["in_memory_interval_s"] = round(interval, 2)
        out["nic_share"] = round(copy_s / interval, 4)
    if has(tier, RecoveryTier.REPLICA_GROUPS):
        out["replica_groups"] = replica_groups
        out["replica_group_gpus"] = replica_group_gpus(gpus, replica_groups)
        out["rejoin_s"] = round(rejoin_seconds(state, gpus, replica_groups, ph), 1)
    return out


def validate_replica_groups(replica_groups: int, gpus: int | None = None) -> None:
    """A replica-group count the job can run: at least 2, and each group at least one node."""
    if replica_groups < 2:
        raise ValueError("replica_groups must be at least 2")
    if gpus is not None and replica_group_gpus(gpus, replica_groups) < 8 and gpus >= 16:
        raise ValueError(f"replica_groups {replica_groups} leaves groups under one node of {gpus} GPUs")
    if replica_groups > 4096:
        raise ValueError("replica_groups must be at most 4096")
