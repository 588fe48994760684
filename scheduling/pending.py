"""The pending jobs a scheduling cycle reads, kept between cycles.

A busy cluster has ten thousand pending jobs, and building each from its row every cycle (fifteen
columns, JSON chip lists, rankings and models made into Python objects) cost a cycle 30-75 ms on
SQLite and 60 ms on PostgreSQL for jobs that had not changed. So each read asks the database only
for every due pending job's id, revision, pending reason and its array's running limit. The
revision is a number the database raises itself, by a trigger (migrations 0026 and 0031), whenever
an UPDATE names a column read here; a job whose revision is what the last read saw is the same job,
and its ``PendingJob`` is reused: only the new and the changed ones are read whole. The reason is
read every time, since the cycle writes only the reasons that changed against it; so is the
array's limit, which an operator changes on the array, not on its jobs. Queue names are part of
the key: a rename reads everything again.

With ``array_window``, of each job array only its first that many pending jobs (by id) are read:
an array's jobs are alike and queue behind one another, so a cycle that may start no more jobs
than that decides the same with the window as with the whole array, and the rest are neither read
nor given a reason (index job_state_array: state, array, id).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

from django.db import connection
from django.utils import timezone

from engine.steptime import ModelSpec, describe_ranking
from engine.workload import PendingJob
from scheduling.choices import JobState
from scheduling.models import Job, JobArray
from scheduling.store import epoch, queue_names

_ARRAYS_PER_STATEMENT = 200  # UNION ALL terms per statement (SQLite allows 500)
_CHUNK = 10_000  # ids per IN (...) list
# what each read asks of every due pending job, and of the ones it builds, after their columns
_CURRENT = "j.revision, j.pending_reason, a.max_running"


def _due(now: datetime | None) -> list:
    return [JobState.PENDING.value, connection.ops.adapt_datetimefield_value(now or timezone.now())]


def _select(columns: str) -> str:
    """``columns`` of the pending jobs due now (a requeued job waits for its backoff)."""
    job, array = Job._meta.db_table, JobArray._meta.db_table
    return (
        f"SELECT {columns} FROM {job} j LEFT JOIN {array} a ON a.id = j.array_id "
        "WHERE j.state = %s AND (j.requeue_at IS NULL OR j.requeue_at <= %s)"
    )


def _columns() -> str:
    """What a PendingJob is built from (``_Builder.job``), JSON as text: most jobs share a handful of chip
    lists, parsed once each."""
    as_text = "::text" if connection.vendor == "postgresql" else ""
    return (
        f"j.id, j.queue_id, j.gpus, j.priority, j.chip_types{as_text}, j.topology, "
        f"{epoch('j.submitted_at')}, j.estimated_duration_s, j.min_gpus, j.size_step, j.share, "
        f"j.mixed_chips, j.chip_ranking{as_text}, "
        f"CASE WHEN j.topology IN ('region', 'any') THEN j.model{as_text} END, j.array_id"
    )


def _windowed(cursor, select: str, due: list, array_window: int | None) -> list[tuple]:
    """The rows of ``select``: all of them, or with ``array_window`` the jobs outside arrays and
    the first that many of each array that has a pending job."""
    if array_window is None:
        cursor.execute(select, due)
        return cursor.fetchall()
    job, array = Job._meta.db_table, JobArray._meta.db_table
    cursor.execute(select + " AND j.array_id IS NULL", due)
    rows = cursor.fetchall()
    # one probe of job_state_array per array (a scalar subquery stays one; as EXISTS, PostgreSQL
    # planned a join over every job under stale statistics: 21 ms a cycle with 100,000 array jobs)
    cursor.execute(
        f"SELECT a.id FROM {array} a WHERE "
        f"(SELECT j.id FROM {job} j WHERE j.state = %s AND j.array_id = a.id LIMIT 1) IS NOT NULL "
        "ORDER BY a.id",
        due[:1],
    )
    waiting = [r[0] for r in cursor.fetchall()]
    for i in range(0, len(waiting), _ARRAYS_PER_STATEMENT):
        chunk = waiting[i : i + _ARRAYS_PER_STATEMENT]
        part = f"SELECT * FROM ({select} AND j.array_id = %s ORDER BY j.id LIMIT %s) AS w"
        cursor.execute(
            " UNION ALL ".join(f"{part}{n}" for n in range(len(chunk))),
            [v for a in chunk for v in (*due, a, array_window)],
        )
        rows += cursor.fetchall()
    return rows


class _Builder:
    """PendingJobs from rows of ``_columns``; each distinct chip list and model parsed once."""

    def __init__(self, queues: dict[int, str]) -> None:
        self.queues = queues
        self.chip_lists: dict[str | None, tuple[str, ...]] = {None: ()}
        self.models: dict[str, ModelSpec | None] = {}

    def model(self, text) -> ModelSpec | None:
        """The model a job trains (of jobs that may span datacenters: the cost of doing so)."""
        key = text if isinstance(text, str) else json.dumps(text, sort_keys=True)
        if key not in self.models:
            data = json.loads(text) if isinstance(text, str) else text
            try:
                self.models[key] = ModelSpec.from_dict(data) if data else None
            except (ValueError, TypeError, KeyError):
                self.models[key] = None
        return self.models[key]

    def job(self, row, array_limit: int | None) -> tuple[PendingJob, str | None]:
        """The job of a row, and how its chip types were ranked (None: they were not)."""
        job_id, queue, gpus, priority, chips_text, topology, submitted, duration = row[:8]
        low, step, share, mixed, ranking, model_text, array_id = row[8:]
        chips = self.chip_lists.get(chips_text)
        if chips is None:
            chips = self.chip_lists[chips_text] = tuple(json.loads(chips_text) or ())
        ranked = None
        if ranking and ranking.replace(" ", "") != "[]":
            ranking = json.loads(ranking)
            if len(ranking) > 1:
                ranked = describe_ranking(ranking)
        job = PendingJob(
            job_id,
            self.queues.get(queue, ""),
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
            self.model(model_text) if model_text else None,
            array_id,
            array_limit,
        )
        return job, ranked


class PendingStore:
    """The pending jobs of the last read, with their revisions and chip rankings."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._jobs: dict[int, tuple[int, PendingJob, str | None]] = {}  # id -> (revision, job, ranking)

    def reset(self) -> None:
        """Forget what earlier reads saw (tests that roll the database back call this)."""
        self.__init__()

    def load(
        self,
        now: datetime | None = None,
        array_window: int | None = None,
        queues: dict[int, str] | None = None,
    ) -> tuple[list[PendingJob], dict[int, str], dict[int, str]]:
        """The pending jobs due at ``now``, their current reasons, and the chip ranking to show in
        the reason of jobs whose chip types were ranked. ``queues``: the queues' names by id, when
        the caller has read them already."""
        if queues is None:
            queues = queue_names()
        key = (connection.alias, connection.settings_dict["NAME"], tuple(sorted(queues.items())))
        if key != self._key:
            self._key, self._jobs = key, {}
        due = _due(now)
        with connection.cursor() as cursor:
            if self._jobs:
                select = _select(f"j.id, {_CURRENT}")
                current = _windowed(cursor, select, due, array_window)
                cached = self._jobs
                stale = {i for i, rev, _, _ in current if cached.get(i, (-1,))[0] != rev}
                everything = len(stale) > len(current) // 2
                built = self._build(cursor, sorted(stale), everything, due, array_window, queues)
            else:  # nothing kept (a first read, or the key changed): one read of everything
                rows = _windowed(cursor, _select(f"{_columns()}, {_CURRENT}"), due, array_window)
                cached, built = {}, _built(rows, queues)
                current, stale = [(row[0], *row[-3:]) for row in rows], set(built)
        jobs, reasons, ranked = {}, {}, {}
        for job_id, _, reason, limit in current:
            entry = built.get(job_id) if job_id in stale else cached[job_id]
            if entry is None:  # (it stopped pending between the two reads)
                continue
            rev, job, ranking = entry
            if job.array_limit != limit:  # the array's running limit changed: not the job
                job = replace(job, array_limit=limit)
            jobs[job_id] = (rev, job, ranking)
            reasons[job_id] = reason
            if ranking:
                ranked[job_id] = ranking
        self._jobs = jobs
        return [job for _, job, _ in jobs.values()], reasons, ranked

    def _build(self, cursor, ids, everything: bool, due, array_window, queues) -> dict[int, tuple]:
        """(revision, job, ranking) of ``ids`` (``everything``: read every due pending job,
        cheaper than a long list of ids)."""
        if not ids:
            return {}
        select = _select(f"{_columns()}, {_CURRENT}")
        if everything:
            rows = _windowed(cursor, select, due, array_window)
        else:
            rows = []
            for i in range(0, len(ids), _CHUNK):
                chunk = ",".join(str(int(x)) for x in ids[i : i + _CHUNK])
                cursor.execute(f"{select} AND j.id IN ({chunk})", due)
                rows += cursor.fetchall()
        return _built(rows, queues)


def _built(rows, queues) -> dict[int, tuple]:
    """(revision, job, ranking) by job id, from rows of ``_columns`` followed by ``_CURRENT``."""
    builder = _Builder(queues)
    return {row[0]: (row[-3], *builder.job(row[:-3], row[-1])) for row in rows}


pending_jobs = PendingStore()


def load_pending(
    now: datetime | None = None, array_window: int | None = None, queues: dict[int, str] | None = None
) -> tuple[list[PendingJob], dict[int, str], dict[int, str]]:
    """The cycle's read: the pending jobs (kept between cycles), their reasons, their rankings."""
    return pending_jobs.load(now, array_window, queues)


def read_pending(now: datetime | None = None) -> list[PendingJob]:
    """Every due pending job read afresh, for readers outside the cycle (the forecast)."""
    return PendingStore().load(now)[0]
