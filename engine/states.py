"""State codes shared by the engine's arrays and the database's choices.

The engine holds states as small integers in NumPy arrays; the database stores the names.
The order here is the code: never reorder, only append.
"""

from __future__ import annotations

NODE_STATES: tuple[str, ...] = ("ready", "cordoned", "draining", "down", "repairing")
GPU_STATES: tuple[str, ...] = ("ready", "cordoned", "down", "repairing")
GPU_HEALTH: tuple[str, ...] = ("ok", "warning", "critical", "unknown")

NODE_STATE_CODE = {name: code for code, name in enumerate(NODE_STATES)}
GPU_STATE_CODE = {name: code for code, name in enumerate(GPU_STATES)}
GPU_HEALTH_CODE = {name: code for code, name in enumerate(GPU_HEALTH)}

# Node actions an operator can take, as {action: (states it may start from, resulting state)}.
NODE_ACTIONS: dict[str, tuple[frozenset[str], str]] = {
    "cordon": (frozenset({"ready"}), "cordoned"),
    "drain": (frozenset({"ready", "cordoned"}), "draining"),
    "uncordon": (frozenset({"cordoned", "draining"}), "ready"),
    # the health path: a fault takes a node down, repair starts, the repaired node returns
    "mark_down": (frozenset({"ready", "cordoned", "draining"}), "down"),
    "repair": (frozenset({"down"}), "repairing"),
    "return": (frozenset({"repairing"}), "ready"),
}


class InvalidTransition(ValueError):
    """An action was asked of a node in a state it cannot be taken from."""


def node_action_target(action: str, current: str) -> str:
    """The state a node moves to when ``action`` is taken from ``current``."""
    if action not in NODE_ACTIONS:
        raise InvalidTransition(f"unknown node action {action!r}; known: {', '.join(sorted(NODE_ACTIONS))}")
    allowed_from, target = NODE_ACTIONS[action]
    if current not in allowed_from:
        allowed = ", ".join(sorted(allowed_from))
        raise InvalidTransition(f"cannot {action} a node that is {current}; {action} applies to: {allowed}")
    return target
