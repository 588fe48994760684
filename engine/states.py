"""State codes shared by the engine's arrays and the database's choices.

The engine holds states as small integers in NumPy arrays; the database stores the names.
The order here is the code: never reorder, only append.
"""

from __future__ import annotations

NODE_STATES: tuple[str, ...] = ("ready", "cordoned", "draining", "down", "repairing", "drained")
GPU_STATES: tuple[str, ...] = ("ready", "cordoned", "down", "repairing")
GPU_HEALTH: tuple[str, ...] = ("ok", "warning", "critical", "unknown")
PORT_KINDS: tuple[str, ...] = ("ib", "eth")  # a node's network ports: InfiniBand or RoCE, Ethernet

NODE_STATE_CODE = {name: code for code, name in enumerate(NODE_STATES)}
GPU_STATE_CODE = {name: code for code, name in enumerate(GPU_STATES)}
GPU_HEALTH_CODE = {name: code for code, name in enumerate(GPU_HEALTH)}

# Node actions an operator can take, as {action: (states it may start from, resulting state)}.
# A drain moves running work off the node (checkpointed, then requeued; an optional deadline lets
# it finish first); the controller marks the node drained once nothing runs on it.
NODE_ACTIONS: dict[str, tuple[frozenset[str], str]] = {
    "cordon": (frozenset({"ready"}), "cordoned"),
    "drain": (frozenset({"ready", "cordoned"}), "draining"),
    "uncordon": (frozenset({"cordoned", "draining", "drained"}), "ready"),
    # the health path: a fault takes a node down, repair starts, the repaired node returns
    "mark_down": (frozenset({"ready", "cordoned", "draining", "drained"}), "down"),
    "repair": (frozenset({"down", "drained"}), "repairing"),
    "return": (frozenset({"repairing"}), "ready"),
}
# Transitions the controller takes by itself, in the same form.
NODE_EVENTS: dict[str, tuple[frozenset[str], str]] = {
    "drained": (frozenset({"draining"}), "drained"),  # the last job left a draining node
    "fault": (frozenset({"ready", "cordoned", "draining", "drained"}), "down"),  # a fault takes it down
    "quarantine": (frozenset({"ready", "cordoned", "draining", "drained", "down"}), "down"),  # a lemon
}
NODE_TRANSITIONS = {**NODE_ACTIONS, **NODE_EVENTS}


class InvalidTransition(ValueError):
    """An action was asked of a node in a state it cannot be taken from."""


def transition_target(
    table: dict[str, tuple[frozenset[str], str]],
    action: str,
    current: str,
    *,
    what: str,
    states: tuple[str, ...],
    known: list[str],
    error: type[InvalidTransition] = InvalidTransition,
) -> str:
    """The state ``what`` (a node, a job) moves to when ``action`` is taken from ``current``,
    by a transition table of {action: (states it may start from, resulting state)}."""
    if action not in table:
        raise error(f"action: unknown {what} action {action!r}; known: {', '.join(known)}")
    allowed_from, target = table[action]
    if current not in allowed_from:
        allowed = ", ".join(s for s in states if s in allowed_from)
        raise error(f"cannot {action} a {what} that is {current}; {action} applies to: {allowed}")
    return target


def node_action_target(action: str, current: str) -> str:
    """The state a node moves to when ``action`` is taken from ``current``."""
    return transition_target(
        NODE_TRANSITIONS, action, current, what="node", states=NODE_STATES, known=sorted(NODE_ACTIONS)
    )


# GPU transitions the controller takes, in the same form: a fault takes the GPU down until it is
# reset; a reset brings it back.
GPU_EVENTS: dict[str, tuple[frozenset[str], str]] = {
    "fault": (frozenset({"ready", "cordoned"}), "down"),
    "reset": (frozenset({"down"}), "ready"),
}


def node_event_code(code: int, action: str) -> int:
    """The state code a node in state code ``code`` moves to by ``action``: the node table on the
    engine's codes (the cluster simulator's arrays); raises InvalidTransition as the table does."""
    return NODE_STATE_CODE[node_action_target(action, NODE_STATES[code])]


def gpu_event_code(code: int, action: str) -> int:
    """The state code a GPU in state code ``code`` moves to by ``action`` (GPU_EVENTS)."""
    target = transition_target(
        GPU_EVENTS, action, GPU_STATES[code], what="GPU", states=GPU_STATES, known=list(GPU_EVENTS)
    )
    return GPU_STATE_CODE[target]
