"""Why a job is still pending: a kind, the facts, and the sentence an operator reads.

Every step of the scheduler that leaves a job pending says so with a ``Reason``: the sentence
itself (a ``str``, so it is written and compared as text), with its ``kind`` and its ``facts``
(the queue, chip type, GPUs, seconds... that the sentence is made of) alongside. Metrics and the
API read the kind; nothing parses the sentence.

The kinds: ``stopped`` (its queue is stopped), ``quota`` (no quota it may use, nor any to borrow),
``topology`` (enough free GPUs, but not in one node, rack or pod as the job asks), ``capacity``
(no datacenter or region with room, or preemption deferred), ``reservation`` (GPUs are held for it
and expected free, or the only free ones are held for a larger job), ``ordering`` (held behind an
earlier job of its queue), ``array`` (its array runs as many jobs as its ``%N`` limit allows),
``other`` (no such queue, the cycle's start limit). Reasons joined from
several chip types ("; ") take the kind and facts of the first: the job's preferred chip type.
"""

from __future__ import annotations

import functools
import time

PENDING_KINDS = ("stopped", "quota", "topology", "capacity", "reservation", "ordering", "array", "other")
TOPOLOGY_LEVELS = ("node", "rack", "pod")  # a gang that fits the fleet but not one of these
_KINDS = frozenset(PENDING_KINDS)


class Reason(str):
    """A pending reason: the sentence, with ``kind`` (one of PENDING_KINDS) and ``facts``.

    Ten thousand pending jobs each get one every cycle, so it is kept small: slots, and facts of
    plain values (such a dict is not tracked by the garbage collector). ``facts`` is read-only."""

    __slots__ = ("kind", "facts")

    def __new__(cls, text: str, kind: str, facts: dict | None = None) -> Reason:
        if kind not in _KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(PENDING_KINDS)}")
        self = super().__new__(cls, text)
        self.kind = kind
        self.facts = facts if facts is not None else {}
        return self

    def __getnewargs__(self):  # pickles (the what-if workers) with its kind and facts
        return str(self), self.kind, self.facts

    def but(self, more: str, **facts) -> Reason:
        """The same reason with words added (a queue's bounded wait, the chip types ranked)."""
        return Reason(f"{self}{more}", self.kind, {**self.facts, **facts})


def joined(reasons: list[Reason]) -> Reason | None:
    """One reason from a reason per chip type tried, in the job's order (None: there were none)."""
    if not reasons:
        return None
    first = reasons[0]
    return Reason("; ".join(reasons), first.kind, first.facts) if len(reasons) > 1 else first


def placement_kind(level: str) -> str:
    """No room in one domain of this level: topology below a datacenter, capacity at or above."""
    return "topology" if level in TOPOLOGY_LEVELS else "capacity"


def duration(h_or_s: float) -> str:
    """'40 s', '17 min', '3.1 h', '2.0 d'."""
    s = abs(h_or_s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


WALL_CLOCK = 1e9  # a time at or past this is seconds since 1970 (2001 on); below, a run's own clock


@functools.lru_cache(maxsize=1024)  # a cycle names its few reservation starts for thousands of jobs
def moment(t: float) -> str:
    """When something is expected, as a reason says it: on the wall clock, UTC to the minute; on a
    simulated run's clock (which starts at 0), hours into the run. A time is named, not counted
    down: a reason is rewritten only when its wording changes (scheduling.apply), so "in 65 s"
    would be shown unchanged for several cycles while the time it names does not move."""
    if t >= WALL_CLOCK:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    return f"hour {t / 3600:.1f} of the run"
