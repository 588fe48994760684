"""State choices with one colour each, used identically by the admin, the API and the pages.

The names come from ``engine.states`` so the database and the engine's arrays agree.
Colours are from the Okabe-Ito colour-blind-safe palette; state is never shown by colour alone.
"""

from __future__ import annotations

from django.db import models

from engine import states


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
    DOWN = "down", "Down"
    REPAIRING = "repairing", "Repairing"
    DRAINED = "drained", "Drained"


class GPUState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DOWN = "down", "Down"
    REPAIRING = "repairing", "Repairing"


class GPUHealth(models.TextChoices):
    OK = "ok", "OK"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"
    UNKNOWN = "unknown", "Unknown"


COLOURS: dict[str, str] = {
    "ready": "#009E73",  # bluish green
    "ok": "#009E73",
    "cordoned": "#E69F00",  # orange
    "warning": "#E69F00",
    "draining": "#56B4E9",  # sky blue
    "down": "#D55E00",  # vermilion
    "critical": "#D55E00",
    "repairing": "#CC79A7",  # reddish purple
    "drained": "#0072B2",  # blue
    "unknown": "#999999",
}

assert tuple(NodeState.values) == states.NODE_STATES
assert tuple(GPUState.values) == states.GPU_STATES
assert tuple(GPUHealth.values) == states.GPU_HEALTH


def colour(state: str) -> str:
    return COLOURS.get(state, "#999999")
