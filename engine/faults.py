"""Fault classification: what a fault means for the GPU, the node and the job, and what to do.

XID codes follow NVIDIA's XID catalogue (Ampere and later; docs.nvidia.com/deploy/xid-errors):
its immediate-action buckets are RESTART_APP (restart the job, the GPU is fine), RESET_GPU,
RESTART_BM (reboot the node), a few decision trees, and IGNORE. Non-XID sources (heartbeat loss,
a hang reported by the job's collective watchdog, link and switch faults, an operator) are
classified here too so every fault gets one documented action. The table is in docs/faults.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    RESTART_JOB = "restart_job"  # the job restarts from its checkpoint; hardware stays in service
    RESET_GPU = "reset_gpu"  # the GPU leaves service until it is reset
    REBOOT_NODE = "reboot_node"  # the node leaves service until it is rebooted
    RESET_WHEN_CONVENIENT = "reset_when_convenient"  # keep running; reset at the next job boundary
    REPAIR_NODE = "repair_node"  # the node needs hands-on repair or an RMA
    LINK_DOWN = "link_down"  # a network link or switch: jobs crossing it restart elsewhere
    CORDON_NODE = "cordon_node"  # the node takes no new work; what runs there runs on
    OBSERVE = "observe"  # record only


class Signal(StrEnum):
    """How the control plane learns of the fault (what fast detection shortens)."""

    XID = "xid"  # an XID from the driver
    HANG = "hang"  # no progress: the collective watchdog, or the job's step counters
    HEARTBEAT = "heartbeat"  # the node agent went quiet
    LINK = "link"  # a NIC port or switch
    NONE = "none"  # told directly (an operator, a maintenance notice, a health check)


class Scope(StrEnum):
    GPU = "gpu"
    NODE = "node"
    LINK = "link"
    JOB = "job"


@dataclass(frozen=True)
class Classification:
    action: Action
    scope: Scope
    interrupts_job: bool  # the running job stops (and restarts from a checkpoint)
    memory_readable: bool  # GPU memory still readable, so a triggered checkpoint may succeed
    detection_s: float  # typical time from the fault to the controller knowing of it
    cause: str  # the cause category used in reports (Llama 3 Table 5 categories)
    description: str
    signal: Signal = Signal.XID


XID_DETECTION_S = 30.0  # XID events surface through the driver log / DCGM within seconds to ~30 s
HANG_DETECTION_S = 300.0  # a hang is found by the collective watchdog; default kept well under NCCL's 10 min
HEARTBEAT_DETECTION_S = 60.0  # node agent heartbeat missed for a minute
NIC_DETECTION_S = 5.0  # a port's state and flaps come with the agent's next report (every 5 s)


def _xid(action, interrupts, readable, cause, text, scope=Scope.GPU):
    return Classification(action, scope, interrupts, readable, XID_DETECTION_S, cause, text)


XID_TABLE: dict[int, Classification] = {
    13: _xid(
        Action.RESTART_JOB, True, True, "software", "graphics engine exception (usually the application)"
    ),
    31: _xid(Action.RESTART_JOB, True, True, "software", "GPU memory page fault"),
    43: _xid(Action.RESTART_JOB, True, True, "software", "GPU stopped processing (application fault)"),
    45: _xid(
        Action.OBSERVE, False, True, "gpu", "preemptive cleanup after an earlier error; follow the other XID"
    ),
    46: _xid(Action.RESET_GPU, True, False, "gpu", "GPU timeout"),
    61: _xid(Action.RESET_GPU, True, False, "gpu", "internal micro-controller breakpoint (treated as 62)"),
    62: _xid(Action.RESET_GPU, True, False, "gpu", "internal micro-controller halt"),
    63: _xid(Action.RESET_WHEN_CONVENIENT, False, True, "gpu_memory", "row remap / page retirement event"),
    64: _xid(Action.RESET_GPU, True, False, "gpu_memory", "row remap / page retirement failure"),
    79: _xid(Action.REBOOT_NODE, True, False, "gpu", "GPU has fallen off the bus", Scope.NODE),
    92: _xid(Action.OBSERVE, False, True, "gpu_memory", "high single-bit ECC error rate"),
    94: _xid(Action.RESTART_JOB, True, True, "gpu_memory", "contained ECC error"),
    95: _xid(Action.RESET_GPU, True, False, "gpu_memory", "uncontained ECC error"),
    109: _xid(Action.RESET_GPU, True, False, "gpu", "context-switch timeout"),
    119: _xid(Action.RESET_GPU, True, False, "gpu", "GSP RPC timeout"),
    120: _xid(Action.RESET_GPU, True, False, "gpu", "GSP error"),
    136: _xid(Action.RESET_GPU, True, False, "gpu", "link training failure"),
    140: _xid(Action.RESET_GPU, True, False, "gpu_memory", "ECC unrecovered error escape"),
    143: _xid(Action.RESET_GPU, True, False, "gpu", "GPU initialization failure"),
    158: _xid(Action.RESET_GPU, True, False, "gpu", "fatal timeout"),
}

# The two decision trees of the catalogue, kept as code below: 48 (double-bit ECC) and 74 (NVLink);
# and the NVLink5 range, every code of which reboots the node.
TREE_XIDS = (48, 74)
NVLINK5_XIDS = range(144, 151)
CATALOGUE_XIDS = tuple(sorted({*XID_TABLE, *TREE_XIDS, *NVLINK5_XIDS}))  # every code classified by name


def classify_xid(
    xid: int, *, dbe_over_threshold: bool = False, peer_faulted: bool = False, repeated_on_node: bool = False
) -> Classification:
    """Classify an XID. ``dbe_over_threshold``: the GPU's retired-page / SRAM DBE count is over the
    RMA threshold (XID 48). ``peer_faulted``: another GPU on the NVLink fabric reported a fault at
    the same time, so this XID 74 is sympathetic. ``repeated_on_node``: the same fault repeats on
    this node within the lemon window."""
    if xid == 48:
        if dbe_over_threshold:
            return _xid(
                Action.REPAIR_NODE,
                True,
                False,
                "gpu_memory",
                "double-bit ECC error with DBEs over the threshold: replace the GPU",
                Scope.NODE,
            )
        return _xid(Action.RESET_GPU, True, False, "gpu_memory", "double-bit ECC error: reset to clear")
    if xid == 74:
        if peer_faulted:
            return _xid(
                Action.RESTART_JOB,
                True,
                True,
                "gpu",
                "NVLink error caused by a peer GPU's fault: the peer is handled, this GPU stays",
            )
        if repeated_on_node:
            return _xid(
                Action.REBOOT_NODE, True, False, "gpu", "repeated NVLink error: reboot the node", Scope.NODE
            )
        return _xid(Action.RESET_GPU, True, False, "gpu", "NVLink error: reset the GPU")
    if xid in NVLINK5_XIDS:
        return _xid(Action.REBOOT_NODE, True, False, "gpu", "NVLink5 error: reboot the node", Scope.NODE)
    known = XID_TABLE.get(xid)
    if known is not None:
        return known
    # An XID we do not know: take the GPU out until someone looks, rather than trust it.
    return _xid(Action.RESET_GPU, True, False, "unknown", f"XID {xid} is not in the catalogue; reset the GPU")


def xid_meaning(xid: int) -> str:
    """What an XID code means, in a few words, whatever its decision tree decided (the alert's
    annotation; docs/alerts)."""
    if xid == 48:
        return "double-bit ECC error"
    if xid == 74:
        return "NVLink error"
    if xid in NVLINK5_XIDS:
        return "NVLink5 error"
    known = XID_TABLE.get(xid)
    return known.description if known is not None else "not in the catalogue"


SOURCE_TABLE: dict[str, Classification] = {
    "health_check": Classification(
        Action.RESET_GPU,
        Scope.GPU,
        True,
        False,
        XID_DETECTION_S,
        "gpu",
        "DCGM-style health check failed",
        Signal.NONE,
    ),
    "heartbeat_loss": Classification(
        Action.REBOOT_NODE,
        Scope.NODE,
        True,
        False,
        HEARTBEAT_DETECTION_S,
        "host",
        "node agent heartbeat lost",
        Signal.HEARTBEAT,
    ),
    "job_hang": Classification(
        Action.RESTART_JOB,
        Scope.JOB,
        True,
        True,
        HANG_DETECTION_S,
        "unknown",
        "collective watchdog reported a hang",
        Signal.HANG,
    ),
    "link_down": Classification(
        Action.LINK_DOWN,
        Scope.LINK,
        True,
        True,
        XID_DETECTION_S,
        "network",
        "network link or switch down",
        Signal.LINK,
    ),
    "nic_port_down": Classification(
        Action.REPAIR_NODE,
        Scope.NODE,
        True,
        True,
        NIC_DETECTION_S,
        "network",
        "a NIC port of the node went down: its rail is cut off",
        Signal.LINK,
    ),
    "nic_link_flap": Classification(
        Action.CORDON_NODE,
        Scope.NODE,
        False,
        True,
        NIC_DETECTION_S,
        "network",
        "a NIC port keeps flapping: the node takes no new work until it is looked at",
        Signal.LINK,
    ),
    "host_maintenance": Classification(
        Action.REPAIR_NODE,
        Scope.NODE,
        True,
        True,
        0.0,
        "host_maintenance",
        "unplanned host maintenance",
        Signal.NONE,
    ),
    "operator": Classification(
        Action.REPAIR_NODE,
        Scope.NODE,
        True,
        True,
        0.0,
        "operator",
        "taken out of service by an operator",
        Signal.NONE,
    ),
}


# Every source a fault may come from, in the order the pages list them.
FAULT_SOURCES: tuple[str, ...] = ("xid", *SOURCE_TABLE)


def classify(source: str, xid: int | None = None, **context) -> Classification:
    if source == "xid":
        if xid is None:
            raise ValueError("an XID fault needs its code")
        return classify_xid(xid, **context)
    if source not in SOURCE_TABLE:
        raise ValueError(f"unknown fault source {source!r}; known: xid, {', '.join(SOURCE_TABLE)}")
    return SOURCE_TABLE[source]
