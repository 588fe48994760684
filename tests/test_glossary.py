"""The glossary names every value of the engine's enums an operator meets on the pages and in the
API, so a new state, bucket or policy cannot ship without its meaning written down."""

from pathlib import Path

import pytest

from engine import checkpoint, faults, lifecycle, reasons, sites, states, tiers
from engine.ettr import ETTR_BUCKETS
from engine.placement import TOPOLOGY_CONSTRAINTS
from engine.workload import QUEUEING_STRATEGIES, RECLAIM_POLICIES, WITHIN_QUEUE_POLICIES

GLOSSARY = (Path(__file__).resolve().parent.parent / "docs" / "glossary.md").read_text()

ENUMS = {
    "ETTR loss buckets": ETTR_BUCKETS,
    "job states": lifecycle.JOB_STATES,
    "node states": states.NODE_STATES,
    "GPU states": states.GPU_STATES,
    "GPU health": states.GPU_HEALTH,
    "port kinds": states.PORT_KINDS,
    "node actions and events": tuple(states.NODE_TRANSITIONS),
    "checkpoint kinds": tuple(checkpoint.CheckpointKind),
    "recovery tiers": tiers.TIERS,
    "fault actions": tuple(faults.Action),
    "fault sources": faults.FAULT_SOURCES,
    "topology constraints": TOPOLOGY_CONSTRAINTS,
    "reclaim policies": RECLAIM_POLICIES,
    "within-queue policies": WITHIN_QUEUE_POLICIES,
    "queueing strategies": QUEUEING_STRATEGIES,
    "pending kinds": reasons.PENDING_KINDS,
    "link states": sites.LINK_STATES,
    "span policies": sites.SPAN_POLICIES,
}


@pytest.mark.parametrize("name", list(ENUMS))
def test_the_glossary_names_every_value(name):
    missing = [str(v) for v in ENUMS[name] if f"`{v}`" not in GLOSSARY]
    assert not missing, f"docs/glossary.md does not name these {name}: {', '.join(missing)}"
