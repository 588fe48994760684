"""State choices with one colour each, used identically by the admin, the API and the pages.

The values are built from ``engine.states`` (``engine_choices``) so the database and the engine's
arrays agree.
Colours are from the Okabe-Ito colour-blind-safe palette; state is never shown by colour alone.
"""

from __future__ import annotations

from django.db import models

from engine import states


def engine_choices(name: str, values, labels: dict[str, str] | None = None) -> type[models.TextChoices]:
    """Django choices whose values are the engine's, in the engine's order (``values``: a tuple of
    names or a StrEnum), so the database and the engine never disagree. A value's label is in
    ``labels``, else the value in words ("lower_priority": "Lower priority"); a label naming a
    value the engine does not have is an error."""
    values = tuple(str(v) for v in values)
    labels = labels or {}
    unknown = set(labels) - set(values)
    if unknown:
        raise ValueError(f"{name}: labels for values the engine does not have: {', '.join(sorted(unknown))}")
    return models.TextChoices(
        name, [(v.upper(), (v, labels.get(v, v.replace("_", " ").capitalize()))) for v in values]
    )


NodeState = engine_choices("NodeState", states.NODE_STATES)
GPUState = engine_choices("GPUState", states.GPU_STATES)
GPUHealth = engine_choices("GPUHealth", states.GPU_HEALTH, {"ok": "OK"})
PortKind = engine_choices("PortKind", states.PORT_KINDS, {"ib": "InfiniBand or RoCE", "eth": "Ethernet"})


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


def colour(state: str) -> str:
    return COLOURS.get(state, "#999999")
