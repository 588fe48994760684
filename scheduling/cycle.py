"""One scheduling cycle against the database: load a snapshot, call the engine, apply every
decision in one transaction with bulk writes, record events, publish after commit."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cluster.models import ChipType
from cluster.snapshot import topology_cache
from engine.checkpoint import PolicyKind
from engine.placement import Layout
from engine.scheduler import SchedulerConfig, schedule
from engine.steptime import describe_ranking
from engine.workload import CycleResult, PendingJob, QueueSpec, RunningJob
from scheduling.bulk import update_rows
from scheduling.choices import EventKind, JobState
from scheduling.locks import cycle_lock
from scheduling.models import Allocation, Checkpoint, Job, JobEvent, Queue
from scheduling.plans import plan_for, plan_summary, resize_job

_layout_cache: dict[str, object] = {"key": None, "layout": None}
_allocation_cache: dict[str, object] = {}
log = logging.getLogger("myriad.scheduling")
REASON_REFRESH_CYCLES = 10
_reason_state = {"cycles": 0}
_DIGITS = re.compile(r"\d+")


@functools.lru_cache(maxsize=1 << 16)
def _wording(reason: str) -> str:
    """A reason with its numbers blanked. Cached: this cycle's old reasons are the last cycle's
    new ones, and many jobs share a reason, so each text is blanked about once."""
    return _DIGITS.sub("#", reason)


@dataclass
class CycleSummary:
    ran: bool
    considered: int = 0
    admitted: int = 0
    preempted: int = 0
    reserved: int = 0
    pending: int = 0
    gpus_allocated: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def reset_caches() -> None:
    """Forget what earlier cycles read (tests that roll the database back call this)."""
    _layout_cache.update(key=None, layout=None)
    _allocation_cache.clear()


def _layout(snapshot) -> Layout:
    key = topology_cache._key
    cached = _layout_cache["layout"]
    if _layout_cache["key"] != key or cached is None:
        cached = Layout(snapshot)
        _layout_cache.update(key=key, layout=cached)
        return cached
    return cached.with_states(snapshot)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def load_queues() -> list[QueueSpec]:
    specs = []
    for q in Queue.objects.select_related("cohort").prefetch_related("quotas__chip_type"):
        quotas = list(q.quotas.all())
        specs.append(
            QueueSpec(
                name=q.name,
                cohort=q.cohort.name if q.cohort else None,
                priority=q.priority,
                weight=q.weight,
                nominal={x.chip_type.name: x.nominal for x in quotas},
                borrowing_limit={x.chip_type.name: x.borrowing_limit for x in quotas},
                lending_limit={x.chip_type.name: x.lending_limit for x in quotas},
                reclaim_within_cohort=q.reclaim_within_cohort,
                within_queue=q.within_queue,
                stopped=q.stopped,
            )
        )
    return specs


def _active_allocations() -> np.ndarray:
    """(job id, GPU id) of every active allocation, ordered by job. One row per job comes back, its
    GPU ids packed in a string, so 100,000 allocations are not 100,000 Python tuples."""
    table = Allocation._meta.db_table
    with connection.cursor() as cursor:
        key = _allocation_key(cursor)
        if _allocation_cache.get("key") == key:
            return _allocation_cache["pairs"]
        if connection.vendor == "postgresql":
            packed = "string_agg(gpu_id::text, ',')"
        else:
            packed = "group_concat(gpu_id, ',')"
        cursor.execute(f"SELECT job_id, {packed} FROM {table} WHERE active GROUP BY job_id ORDER BY job_id")
        rows = cursor.fetchall()
    if not rows:
        pairs = np.zeros((0, 2), dtype=np.int64)
    else:
        # numpy parses the joined text in one pass (a list of 100,000 strings costs 20 ms more)
        gpus = np.fromstring(",".join(r[1] for r in rows), dtype=np.int64, sep=",")
        counts = [r[1].count(",") + 1 for r in rows]
        jobs = np.repeat(np.array([r[0] for r in rows], dtype=np.int64), counts)
        order = np.lexsort((gpus, jobs))  # by job, then GPU: the order the carried pairs keep
        pairs = np.stack([jobs[order], gpus[order]], axis=1)
    _allocation_cache.update(key=key, pairs=pairs)
    return pairs


def load_running() -> list[RunningJob]:
    jobs = list(
        Job.objects.filter(state=JobState.RUNNING).values_list(
            "id",
            "queue__name",
            "chip__name",
            "priority",
            "started_at",
            "estimated_duration_s",
            "last_checkpoint_at",
            "min_gpus",
            "gpus",
            "size_step",
            "topology",
            "share",
            "mixed_chips",
        )
    )
    pairs = _active_allocations()  # also with nothing running: the cycle then carries it over
    if not jobs:
        return []
    gpu_index = topology_cache.gpu_indices(pairs[:, 1])
    snapshot = topology_cache.structure()
    snapshot_chips = (snapshot.chip_names, snapshot.gpu_chip)
    bounds = np.searchsorted(pairs[:, 0], [j[0] for j in jobs])
    ends = np.searchsorted(pairs[:, 0], [j[0] for j in jobs], side="right")
    running = []
    for row, lo, hi in zip(jobs, bounds, ends, strict=True):
        job_id, queue, chip, priority, started, duration, checkpoint = row[:7]
        low, high, step, topology, share, mixed = row[7:]
        gpus = gpu_index[lo:hi]
        parts = _parts(snapshot_chips, gpus) if mixed else ()
        start = _ts(started) or 0.0
        running.append(
            RunningJob(
                id=job_id,
                queue=queue,
                gpus=gpus,
                chip=chip or "",
                priority=priority,
                started_at=start,
                estimated_end=start + duration if duration is not None else None,
                last_checkpoint_at=_ts(checkpoint),
                min_gpus=low,
                max_gpus=high if low is not None else None,
                size_step=step,
                topology=topology,
                share=share,
                parts=parts,
            )
        )
    return running


def _parts(snapshot_chips, gpus) -> tuple[tuple[str, int], ...]:
    chip_names, gpu_chip = snapshot_chips
    chips, counts = np.unique(gpu_chip[gpus], return_counts=True)
    return tuple((chip_names[c], int(n)) for c, n in zip(chips, counts, strict=True))


def load_pending() -> tuple[list[PendingJob], dict[int, str], dict[int, str]]:
    """Pending jobs in one plain query (10,000 of them are normal on a busy cluster); submit times
    come back as epoch seconds so no row needs a datetime object. Returns the jobs, their current
    reasons, and the chip ranking to show in the reason of jobs whose chip types were ranked."""
    job, queue = Job._meta.db_table, Queue._meta.db_table
    if connection.vendor == "postgresql":
        epoch = "EXTRACT(EPOCH FROM j.submitted_at)::float8"
        as_text = "::text"  # JSON as text: most jobs share a handful of chip lists, parsed once each
    else:
        epoch = "(julianday(j.submitted_at) - 2440587.5) * 86400.0"
        as_text = ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT j.id, q.name, j.gpus, j.priority, j.chip_types{as_text}, j.topology, {epoch}, "
            f"j.estimated_duration_s, j.pending_reason, j.min_gpus, j.size_step, j.share, j.mixed_chips, "
            f"j.chip_ranking{as_text} FROM {job} j JOIN {queue} q ON q.id = j.queue_id "
            f"WHERE j.state = %s",
            [JobState.PENDING.value],
        )
        rows = cursor.fetchall()
    pending, reasons, ranked = [], {}, {}
    chip_lists: dict[str | None, tuple[str, ...]] = {None: ()}
    for row in rows:
        job_id, queue_name, gpus, priority, chips_text, topology, submitted, duration, reason = row[:9]
        low, step, share, mixed, ranking = row[9:]
        chips = chip_lists.get(chips_text)
        if chips is None:
            chips = chip_lists[chips_text] = tuple(json.loads(chips_text) or ())
        if ranking and ranking.replace(" ", "") != "[]":
            ranking = json.loads(ranking)
            if len(ranking) > 1:
                ranked[job_id] = describe_ranking(ranking)
        pending.append(
            PendingJob(
                job_id,
                queue_name,
                gpus,
                priority,
                chips,
                topology,
                submitted,
                duration,
                low,
                step,
                share,
                bool(mixed),
            )
        )
        reasons[job_id] = reason
    return pending, reasons, ranked


def run_cycle(
    now: datetime | None = None, wait: bool = True, config: SchedulerConfig | None = None
) -> CycleSummary:
    """Run one cycle. With ``wait=False`` a cycle already running elsewhere makes this one skip."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with transaction.atomic(), cycle_lock(wait=wait) as held:
        if not held:
            return CycleSummary(ran=False)
        now = now or timezone.now()
        snapshot = topology_cache.current()
        layout = _layout(snapshot)
        queues = load_queues()
        running = load_running()
        pending, old_reasons, ranked = load_pending()
        t1 = time.perf_counter()
        timings["load"] = (t1 - t0) * 1000
        if config is None:
            config = SchedulerConfig(max_start_gpus=settings.CYCLE_MAX_START_GPUS or None)
        result = schedule(layout, queues, running, pending, now.timestamp(), config)
        t2 = time.perf_counter()
        timings["engine"] = (t2 - t1) * 1000
        gpus = apply_decisions(result, snapshot, now, old_reasons, ranked)
        timings["apply"] = (time.perf_counter() - t2) * 1000
        summary = CycleSummary(
            ran=True,
            considered=result.considered,
            admitted=len(result.admissions),
            preempted=len(result.preemptions),
            reserved=len(result.reservations),
            pending=len(result.pending),
            gpus_allocated=gpus,
            timings_ms={k: round(v, 1) for k, v in timings.items()},
        )
        transaction.on_commit(lambda: _publish(summary))
        if result.start_limited:  # the jobs past this cycle's start limit go next, at once
            from scheduling.trigger import request_cycle

            request_cycle()  # after the commit
    log.info(
        "cycle: %d considered, %d admitted, %d preempted, %d reserved, %d pending; %s; %.1f ms in all",
        summary.considered,
        summary.admitted,
        summary.preempted,
        summary.reserved,
        summary.pending,
        summary.timings_ms,
        (time.perf_counter() - t0) * 1000,  # with the commit
    )
    return summary


def _publish(summary: CycleSummary) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)("scheduling", {"type": "cycle.summary", "summary": summary.as_dict()})


class NewAllocations:
    """The allocations a cycle writes: per job, the database ids of its new GPUs (numpy)."""

    def __init__(self) -> None:
        self.jobs: list[int] = []
        self.gpus: list[np.ndarray] = []

    def add(self, job_id: int, gpu_ids) -> None:
        gpu_ids = np.asarray(gpu_ids, dtype=np.int64)
        if len(gpu_ids):
            self.jobs.append(int(job_id))
            self.gpus.append(gpu_ids)

    def __len__(self) -> int:
        return sum(len(g) for g in self.gpus)

    def pairs(self) -> np.ndarray:
        """(job id, GPU id) rows, shape (n, 2), in insertion order."""
        if not self.jobs:
            return np.zeros((0, 2), dtype=np.int64)
        counts = [len(g) for g in self.gpus]
        return np.column_stack(
            [np.repeat(np.array(self.jobs, dtype=np.int64), counts), np.concatenate(self.gpus)]
        )


def _insert_allocations(rows: NewAllocations, now: datetime, shares: dict[int, int] | None = None) -> None:
    """Active allocations for the new rows; ``shares``: job id -> thousandths for jobs that share
    a GPU (everyone else takes whole GPUs)."""
    table = Allocation._meta.db_table
    shares = shares or {}
    columns = "(job_id, gpu_id, active, share, created_at)"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            stamp = now.isoformat()
            # one join per job over its GPU ids, not one formatted string per GPU
            parts = []
            for j, gpus in zip(rows.jobs, rows.gpus, strict=True):
                head, tail = f"{j}\t", f"\tt\t{shares.get(j, 1000)}\t{stamp}\n"
                parts.append(head + (tail + head).join(map(str, gpus.tolist())) + tail)
            block = "".join(parts)
            # COPY is not wrapped by Django: map driver errors to Django's (IntegrityError...)
            with (
                connection.wrap_database_errors,
                cursor.copy(f"COPY {table} {columns} FROM STDIN") as copy,
            ):
                copy.write(block)
        else:
            # one timestamp, adapted once as the ORM would (not 100,000 datetime conversions), and
            # the id columns from numpy (no Python tuple built per GPU)
            stamp = connection.ops.adapt_datetimefield_value(now)
            pairs = rows.pairs()
            share = np.repeat([shares.get(j, 1000) for j in rows.jobs], [len(g) for g in rows.gpus])
            cursor.executemany(
                f"INSERT INTO {table} {columns} VALUES (%s, %s, %s, %s, %s)",
                list(  # a list: Django's debug cursor counts the rows
                    zip(
                        pairs[:, 0].tolist(),
                        pairs[:, 1].tolist(),
                        itertools.repeat(True),
                        share.tolist(),
                        itertools.repeat(stamp),
                    )
                ),
            )


def apply_decisions(
    result: CycleResult,
    snapshot,
    now: datetime,
    old_reasons: dict[int, str],
    ranked: dict[int, str] | None = None,
) -> int:
    """Write a cycle's decisions; returns the number of GPUs newly allocated."""
    chip_ids = dict(ChipType.objects.values_list("name", "id"))
    events: list[JobEvent] = []

    # preemptions first: their GPUs are released before the preemptors take them
    if result.preemptions:
        events.extend(_apply_preemptions(result.preemptions, now))

    # shrinks release their GPUs before anyone takes them; growths are inserted with admissions
    rows = NewAllocations()
    if result.resizes:
        events.extend(_apply_resizes(result.resizes, snapshot, now, rows))

    admitted_jobs = []
    for a in result.admissions:
        gpu_ids = snapshot.gpu_id[a.gpus]
        rows.add(a.job_id, gpu_ids)
        admitted_jobs.append(
            (a.job_id, JobState.RUNNING.value, now, chip_ids[a.chip], a.domain[:128], "", len(a.gpus))
        )
        admit_data = {"chip": a.chip, "gpus": len(a.gpus), "borrowed": a.borrowed}
        if a.parts:
            admit_data["parts"] = dict(a.parts)
        if a.preempted:
            admit_data["preempted"] = list(a.preempted)
        events.append(
            JobEvent(
                job_id=a.job_id,
                kind=EventKind.ADMITTED,
                at=now,
                reason=(
                    "admitted on "
                    + (" + ".join(f"{n} {c}" for c, n in a.parts) if a.parts else a.chip)
                    + (f", borrowing {a.borrowed}" if a.borrowed else "")
                ),
                data=admit_data,
            )
        )
        events.append(
            JobEvent(
                job_id=a.job_id,
                kind=EventKind.PLACED,
                at=now,
                reason=f"placed in {a.domain}" + (" (backfilled)" if a.backfilled else ""),
                data={"domain": a.domain, "gpus": len(a.gpus), "backfilled": a.backfilled},
            )
        )
    if admitted_jobs:
        update_rows(
            Job,
            ["state", "started_at", "chip", "placement", "pending_reason", "allocated_gpus"],
            admitted_jobs,
        )
        _plan_admitted(result, snapshot, now, events)
    if rows:
        _insert_allocations(rows, now, _shares(result))

    # Reasons carry live numbers ("largest free block: 312 in pod bj2-p04") that move every cycle;
    # rewriting ten thousand rows each cycle for a number is wasteful, so a reason whose wording is
    # unchanged is refreshed every REASON_REFRESH_CYCLES cycles only.
    for job_id, ranking in (ranked or {}).items():  # jobs whose chip types were ranked say so
        if job_id in result.pending:
            result.pending[job_id] = f"{result.pending[job_id]} ({ranking})"
    _reason_state["cycles"] += 1
    refresh = _reason_state["cycles"] % REASON_REFRESH_CYCLES == 0
    changed = [
        (job_id, reason[:2000])
        for job_id, reason in result.pending.items()
        if old_reasons.get(job_id) != reason
        and (refresh or _wording(old_reasons.get(job_id) or "") != _wording(reason))
    ]
    update_rows(Job, ["pending_reason"], changed)
    JobEvent.objects.bulk_create(events, batch_size=1000)
    _carry_allocations(result, snapshot, rows)
    return len(rows)


def _allocation_key(cursor) -> tuple:
    """(database, active rows, newest active id, sum of their job ids, sum of their GPU ids).
    Allocation ids only grow, so an insert anywhere changes the newest id or the count, a release
    changes the count; the sums tell the cycle's own view of the rows from the database's."""
    cursor.execute(
        "SELECT COUNT(*), COALESCE(MAX(id), 0), COALESCE(SUM(job_id), 0), COALESCE(SUM(gpu_id), 0) "
        f"FROM {Allocation._meta.db_table} WHERE active"
    )
    count, newest, job_sum, gpu_sum = cursor.fetchone()
    return _key(count, newest, job_sum, gpu_sum)


def _key(count, newest, job_sum, gpu_sum) -> tuple:
    return (
        connection.alias,
        connection.settings_dict["NAME"],
        int(count),
        int(newest),
        int(job_sum),
        int(gpu_sum),
    )


def _carry_allocations(result: CycleResult, snapshot, rows: NewAllocations) -> None:
    """Carry the cached active allocations over this cycle's own changes, so the next cycle does
    not read 100,000 rows again. The carried pairs are kept once the transaction commits, under
    the key they imply; the next cycle trusts them only if the database's key is the same, so any
    other writer's change makes it read everything, as before."""
    cached = _allocation_cache.get("pairs")
    _allocation_cache.clear()
    if cached is None:
        return
    victims = [p.job_id for p in result.preemptions]
    keep = ~np.isin(cached[:, 0], victims) if victims else np.ones(len(cached), dtype=bool)
    shrunk = [(r.job_id, snapshot.gpu_id[r.released]) for r in result.resizes if len(r.released)]
    if shrunk:
        released = np.concatenate([(np.int64(j) << 32) | gpus.astype(np.int64) for j, gpus in shrunk])
        keep &= ~np.isin((cached[:, 0] << 32) | cached[:, 1], released)
    added = rows.pairs()
    pairs = np.concatenate([cached[keep], added])
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]  # by job, then GPU, as a fresh read
    # The key these pairs should have in the database. It is not checked here (that would cost
    # the full key query a second time each cycle): the next cycle computes the real key first
    # thing, and any other writer's change, during this cycle or after it, makes them differ.
    # Only the newest id is read now, from the primary key's end.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {Allocation._meta.db_table} WHERE active")
        newest = cursor.fetchone()[0]
    key = _key(len(pairs), newest, pairs[:, 0].sum(), pairs[:, 1].sum())
    transaction.on_commit(lambda: _allocation_cache.update(key=key, pairs=pairs))


def _plan_admitted(result: CycleResult, snapshot, now: datetime, events: list[JobEvent]) -> None:
    """Jobs that describe their model get a modelled parallel plan for where they landed."""
    admitted = {a.job_id: a for a in result.admissions}
    modelled = Job.objects.filter(pk__in=list(admitted)).exclude(model={}).only("id", "model")
    for job in modelled:
        a = admitted[job.pk]
        plan = plan_for(job, a.chip, snapshot, a.gpus, a.parts)
        Job.objects.filter(pk=job.pk).update(plan=plan)
        events.append(
            JobEvent(
                job_id=job.pk, kind=EventKind.PLANNED, at=now, reason=plan_summary(plan), data={"plan": plan}
            )
        )


def _apply_resizes(resizes, snapshot, now: datetime, rows: NewAllocations) -> list[JobEvent]:
    """Shrink and grow elastic jobs: allocations, size, re-chosen plan, and a resized event that
    carries the old and new plan with their modelled throughput."""
    events = []
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=[r.job_id for r in resizes]).select_related("chip")}
    for r in resizes:
        job = jobs[r.job_id]
        if len(r.released):
            released_ids = snapshot.gpu_id[r.released].tolist()
            Allocation.objects.filter(job=job, active=True, gpu_id__in=released_ids).update(
                active=False, released_at=now
            )
        rows.add(job.pk, snapshot.gpu_id[r.added])
        extra = {"by_job": r.by_job} if r.by_job is not None else {}
        events.append(resize_job(job, snapshot, r.gpus, at=now, reason=r.reason, **extra))
    return events


def _shares(result: CycleResult) -> dict[int, int]:
    """Thousandths per admitted job that shares a GPU (one query, only when some might)."""
    single = [a.job_id for a in result.admissions if len(a.gpus) == 1]
    if not single:
        return {}
    return dict(Job.objects.filter(pk__in=single, share__lt=1000).values_list("id", "share"))


def _apply_preemptions(preemptions, now: datetime) -> list[JobEvent]:
    """Victims go back to pending with their progress. A victim whose checkpoint policy can save on
    demand (triggered or asynchronous) saves before it stops (graceful preemption); any other
    loses the work since its last durable checkpoint, recorded on the preempted event."""
    from scheduling.checkpoints import PHYSICS, policy_kind

    victims = {p.job_id: p for p in preemptions}
    Allocation.objects.filter(job_id__in=victims, active=True).update(active=False, released_at=now)
    jobs = list(
        Job.objects.filter(pk__in=victims).select_related(
            "checkpoint_policy", "queue__default_checkpoint_policy"
        )
    )
    events, checkpoints = [], []
    for job in jobs:
        p = victims[job.pk]
        since = max([t for t in (job.started_at, job.last_checkpoint_at) if t is not None] or [now])
        unsaved = max(0.0, (now - since).total_seconds())
        kind, _ = policy_kind(job)
        lost = unsaved
        if kind in (PolicyKind.TRIGGERED, PolicyKind.ASYNC) and unsaved > 0:
            job.progress_s += unsaved
            job.last_checkpoint_at = now
            lost = 0.0
            checkpoints.append(
                Checkpoint(
                    job=job,
                    at=now,
                    progress_s=job.progress_s,
                    kind=kind.value,
                    durable=True,
                    size_bytes=(job.parameters or 0.0) * PHYSICS.bytes_per_parameter,
                )
            )
            events.append(
                JobEvent(
                    job=job,
                    kind=EventKind.CHECKPOINTED,
                    at=now,
                    reason="saved before preemption",
                    data={"progress_s": job.progress_s, "preemption": True},
                )
            )
        job.state = JobState.PENDING
        job.preemptions += 1
        job.started_at = None
        job.placement = ""
        job.allocated_gpus = 0
        job.pending_reason = f"requeued after preemption: {p.reason}"
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.PREEMPTED,
                at=now,
                reason=p.reason,
                data={"by_job": p.by_job, "progress_s": job.progress_s, "lost_s": lost},
            )
        )
        events.append(
            JobEvent(
                job=job,
                kind=EventKind.REQUEUED,
                at=now,
                reason="requeued with its progress after preemption",
                data={"progress_s": job.progress_s},
            )
        )
    Checkpoint.objects.bulk_create(checkpoints)
    Job.objects.bulk_update(
        jobs,
        [
            "state",
            "preemptions",
            "started_at",
            "placement",
            "pending_reason",
            "allocated_gpus",
            "progress_s",
            "last_checkpoint_at",
        ],
    )
    return events
