"""What kind of thing keeps a job pending, read from the reason the scheduler gave it.

The scheduler explains every pending job in words (``engine.scheduler``, ``engine.steps``,
``engine.quota``); operators and metrics also need the kind: ``stopped`` (its queue is stopped),
``quota`` (no quota it may use, nor any to borrow), ``topology`` (enough free GPUs, but not in one
node, rack or pod as the job asks), ``capacity`` (no datacenter or region with room), ``reservation``
(GPUs are held for it and expected free), ``ordering`` (held behind an earlier job of its queue).
A reason joined from several chip types ("; ") takes the kind of its first part: the job's
preferred chip type.
"""

from __future__ import annotations

PENDING_KINDS = ("stopped", "quota", "topology", "capacity", "reservation", "ordering", "other")

_TOPOLOGY_LEVELS = ("node", "rack", "pod")


def pending_kind(reason: str) -> str:
    first = reason.split("; ", 1)[0]
    if first.startswith("queue ") and first.endswith(" is stopped"):
        return "stopped"
    if first.startswith("waiting for reservation"):
        return "reservation"
    if first.startswith("waiting behind job"):
        return "ordering"
    if first.startswith("no "):
        level = first[3:].split(" ", 1)[0]
        return "topology" if level in _TOPOLOGY_LEVELS else "capacity"
    if "quota" in first or "borrow" in first or "lend" in first:
        return "quota"
    if first.startswith("preemption deferred"):
        return "capacity"
    return "other"
