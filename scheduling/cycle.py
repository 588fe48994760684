"""One scheduling cycle against the database, under the scheduling lock (scheduling.locks.cycle_scope:
on PostgreSQL one transaction throughout; on SQLite the write transaction only around the writes):

1. read a snapshot: the inventory's states, queues, running and pending jobs (scheduling.store);
2. decide: the pure engine (engine.scheduler.schedule), the same code the simulator runs;
3. apply every decision with bulk writes and events (scheduling.apply), dropping those whose jobs
   changed since they were read;
4. after commit, publish the cycle's summary and, when the start limit left work, ask for the
   next cycle at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from cluster.outages import best_effort
from cluster.snapshot import topology_cache
from engine.scheduler import SchedulerConfig, collections_deferred, schedule
from scheduling import sites, store
from scheduling.apply import apply_decisions, still_current
from scheduling.locks import cycle_scope, lock_clock
from scheduling.pending import load_pending, pending_jobs
from scheduling.running import load_running_index, running
from scheduling.signals import congestion_asked, partitions_asked
from scheduling.trigger import assignments_changed, request_cycle

log = logging.getLogger("myriad.scheduling")

__all__ = [
    "CycleSummary",
    "apply_decisions",
    "cycle_ran",
    "reset_caches",
    "run_cycle",
    "surroundings",
    "warm",
]

cycle_ran = Signal()  # after a cycle that ran: seconds (with the commit), summary; monitoring keeps metrics


@dataclass
class CycleSummary:
    ran: bool
    considered: int = 0
    admitted: int = 0
    preempted: int = 0
    reserved: int = 0
    pending: int = 0
    gpus_allocated: int = 0
    drained: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def reset_caches() -> None:
    """Forget what earlier cycles read (tests that roll the database back call this)."""
    store.reset()
    running.reset()
    pending_jobs.reset()


def warm() -> None:
    """Read what a cycle reads, outside the lock and deciding nothing, so that the first cycle of a
    process reads only what changed since (the pending jobs are kept between reads and read again
    only where their revision moved): a worker that restarts with 10,000 jobs pending builds them
    here, before it takes its first cycle, as a restarted scheduler syncs its caches before it
    schedules. Without it the first cycle read 40-60 ms more, and the links and partitions it
    asks monitoring about took 30 ms more the first time (PostgreSQL, 100k GPUs)."""
    read = _read(timezone.now(), None)
    surroundings(read.snapshot)


class _Read(NamedTuple):
    """What a cycle reads before it decides (``_read``)."""

    snapshot: object
    layout: object
    queues: list
    names: object
    running: object
    config: SchedulerConfig
    pending: list
    old_reasons: dict
    ranked: dict


def _read(now: datetime, config: SchedulerConfig | None) -> _Read:
    """The inventory's snapshot and layout, the queues, running and pending jobs (those two kept
    between reads), and the scheduler's configuration unless given."""
    snapshot = topology_cache.current()
    layout = store.layouts.layout(snapshot)
    queues, names = store.load_queues_and_names()
    running_jobs = load_running_index(names)  # kept between cycles: grown by the jobs started since
    if config is None:
        config = sites.config()
    pending, old_reasons, ranked = load_pending(now, config.max_starts, names.queues)
    return _Read(snapshot, layout, queues, names, running_jobs, config, pending, old_reasons, ranked)


def run_cycle(
    now: datetime | None = None, wait: bool = True, config: SchedulerConfig | None = None
) -> CycleSummary:
    """Run one cycle. With ``wait=False`` a cycle already running elsewhere makes this one skip."""
    timings: dict[str, float] = {}
    after: list = []  # the pending reasons, written after the commit (scheduling.locks.cycle_scope)
    # collections held off around the whole lock: the writes after the commit run inside it too
    with collections_deferred(), cycle_scope(wait=wait, after=after) as (locked, writing):
        if not locked:
            return CycleSummary(ran=False)
        t0 = time.perf_counter()  # from the lock taken: a cycle waiting for another is not slow
        held_from = lock_clock()
        now = now or timezone.now()
        # 1. read
        snapshot, layout, queues, names, running_jobs, config, pending, old_reasons, ranked = _read(
            now, config
        )
        t1 = time.perf_counter()
        timings["load"] = (t1 - t0) * 1000
        # 2. decide
        around = surroundings(snapshot)
        result = schedule(layout, queues, running_jobs, pending, now.timestamp(), config, **around)
        t2 = time.perf_counter()
        timings["engine"] = (t2 - t1) * 1000
        # 3. apply (on SQLite the write transaction, and the database's write lock, begin here)
        with writing():
            result, decided = still_current(result)  # decisions about jobs changed since read go
            gpus = apply_decisions(result, snapshot, now, old_reasons, ranked, names.chips, decided, after)
            touched = [a.job_id for a in result.admissions] + [p.job_id for p in result.preemptions]
            running.carry(touched + [r.job_id for r in result.resizes])
            timings["apply"] = (time.perf_counter() - t2) * 1000
            summary = CycleSummary(
                ran=True,
                considered=result.considered,
                admitted=len(result.admissions),
                preempted=len(result.preemptions),
                reserved=len(result.reservations),
                pending=len(result.pending),
                gpus_allocated=gpus,
                drained=len(result.drained),
                timings_ms={k: round(v, 1) for k, v in timings.items()},
            )
            # 4. after commit
            transaction.on_commit(lambda: best_effort("publishing the cycle's summary", _publish, summary))
            if result.admissions or result.preemptions or result.resizes:
                assignments_changed()  # agents waiting on their assignments look again
            if result.start_limited:  # the jobs past this cycle's start limit go next, at once
                request_cycle(at_once=True)
            held_to = lock_clock()  # the last moment inside the lock, before the commit releases it
    seconds = time.perf_counter() - t0  # with the commit, which releases the lock
    cycle_ran.send(sender=CycleSummary, seconds=seconds, summary=summary)
    log.info(
        "cycle: %d considered, %d admitted, %d preempted, %d reserved, %d pending; %s; %.1f ms in all; "
        "lock held %.6f-%.6f",
        summary.considered,
        summary.admitted,
        summary.preempted,
        summary.reserved,
        summary.pending,
        summary.timings_ms,
        seconds * 1000,
        held_from,
        held_to,
    )
    return summary


def _publish(summary: CycleSummary) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)("scheduling", {"type": "cycle.summary", "summary": summary.as_dict()})


def surroundings(snapshot) -> dict:
    """What the engine is given besides the jobs: congested pods, the datacenter links with the
    loads of the jobs crossing them, and the datacenters a partition cuts off (the forecast plays
    the queue with the same)."""
    return {
        "congested_pods": congested_pods(snapshot),
        "links": sites.site_links(snapshot),
        "unreachable": _asked(partitions_asked, snapshot),
    }


def congested_pods(snapshot):
    """The pods whose fabric is congested now, as monitoring's telemetry says (None: unknown)."""
    return _asked(congestion_asked, snapshot)


def _asked(signal, snapshot):
    """The first answer a receiver of ``signal`` gives about ``snapshot`` (None: none does)."""
    for _, answer in signal.send(sender=CycleSummary, snapshot=snapshot):
        if answer is not None:
            return answer
    return None
