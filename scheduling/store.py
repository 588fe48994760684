"""What a scheduling cycle reads and the allocations it writes, with the vendor-specific SQL.

The cycle, fault recovery, the overview and the simulated fleet all read who holds which GPUs
through ``allocations`` (one object, cached across cycles) and the placement layout through
``layouts``; nothing outside this module touches their caches.
"""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
from django.db import connection, transaction

from cluster.snapshot import topology_cache
from engine.placement import Layout
from engine.workload import QueueSpec
from scheduling.models import Allocation, AllocationTotals, Job, Queue


class LayoutCache:
    """The placement layout of the current inventory: rebuilt when the inventory changes, else
    the cached one with the snapshot's fresh states."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._layout: Layout | None = None

    def reset(self) -> None:
        self.__init__()

    def layout(self, snapshot) -> Layout:
        key = topology_cache.key
        if self._key != key or self._layout is None:
            self._layout = Layout(snapshot)
            self._key = key
            return self._layout
        return self._layout.with_states(snapshot)


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


# a hash of each (job, GPU) pair, summed with the counts: two different sets of active pairs with
# the same count and sums still differ (migration 0028's triggers keep the same sum)
_JOB_FACTOR, _GPU_FACTOR, _MODULUS = 2654435761, 40503, 1000000007
MIX = f"((job_id * {_JOB_FACTOR} + gpu_id * {_GPU_FACTOR}) % {_MODULUS})"
FOLD_ROWS = 256  # PostgreSQL's totals are folded into one row once they have this many


def _mix(pairs: np.ndarray) -> int:
    return int(((pairs[:, 0] * _JOB_FACTOR + pairs[:, 1] * _GPU_FACTOR) % _MODULUS).sum())


def _key(count, job_sum, gpu_sum, mix_sum) -> tuple:
    return (
        connection.alias,
        connection.settings_dict["NAME"],
        int(count or 0),
        int(job_sum or 0),
        int(gpu_sum or 0),
        int(mix_sum or 0),
    )


def fold_totals(model) -> None:
    """PostgreSQL: a totals table's rows (AllocationTotals, RunningTotals: a row of changes per
    statement, added by trigger) folded into one once there are many (run by the cycle, under the
    scheduling lock; rows other writers add meanwhile are left as they are)."""
    if connection.vendor != "postgresql":
        return
    table = model._meta.db_table
    sums = [f.column for f in model._meta.concrete_fields if not f.primary_key]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) >= %s FROM {table}", [FOLD_ROWS])
        if cursor.fetchone()[0]:
            cursor.execute(
                f"WITH gone AS (DELETE FROM {table} RETURNING *) "
                f"INSERT INTO {table} ({', '.join(sums)}) "
                f"SELECT {', '.join(f'COALESCE(SUM({c}), 0)' for c in sums)} FROM gone"
            )


class AllocationStore:
    """Active allocations as (job id, GPU id) pairs, cached between reads under a key that any
    other writer's change alters, and carried over a cycle's own changes without a re-read."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._pairs: np.ndarray | None = None

    def reset(self) -> None:
        """Forget what earlier reads saw (tests that roll the database back call this)."""
        self.__init__()

    @property
    def cached(self) -> np.ndarray | None:
        return self._pairs

    def key(self, cursor) -> tuple:
        """(database, active rows, the sums of their job ids, of their GPU ids and of a hash of
        each pair): any insert, release or delete by anyone changes it, and the cycle's own view of
        the rows gives the same figures as the database's. PostgreSQL keeps the figures as it writes
        (AllocationTotals, by trigger) and this reads a few rows; SQLite sums its covering index of
        the active rows."""
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT SUM(count), SUM(job_sum), SUM(gpu_sum), SUM(mix_sum) "
                f"FROM {AllocationTotals._meta.db_table}"
            )
        else:
            cursor.execute(
                f"SELECT COUNT(*), SUM(job_id), SUM(gpu_id), SUM({MIX}) "
                f"FROM {Allocation._meta.db_table} WHERE active"
            )
        return _key(*cursor.fetchone())

    @staticmethod
    def fold() -> None:
        fold_totals(AllocationTotals)

    def is_current(self) -> bool:
        with connection.cursor() as cursor:
            return self._pairs is not None and self._key == self.key(cursor)

    def active_pairs(self, left=None) -> np.ndarray:
        """(job id, GPU id) of every active allocation, ordered by job then GPU. One row per job
        comes back, its GPU ids packed in a string, so 100,000 allocations are not 100,000 Python
        tuples. ``left``: jobs the caller knows stopped since the last read (they finished, failed
        or were cancelled, releasing their GPUs): when the cached pairs without theirs give the
        database's key, nothing is read (between two cycles that is most of what changes)."""
        table = Allocation._meta.db_table
        with connection.cursor() as cursor:
            key = self.key(cursor)
            if self._key == key and self._pairs is not None:
                return self._pairs
            if left is not None and len(left) and self._pairs is not None:
                cached = self._pairs
                pairs = cached[~np.isin(cached[:, 0], left)]
                if _key(len(pairs), pairs[:, 0].sum(), pairs[:, 1].sum(), _mix(pairs)) == key:
                    self._key, self._pairs = key, pairs
                    return pairs
            if connection.vendor == "postgresql":
                packed = "string_agg(gpu_id::text, ',')"
            else:
                packed = "group_concat(gpu_id, ',')"
            cursor.execute(
                f"SELECT job_id, {packed} FROM {table} WHERE active GROUP BY job_id ORDER BY job_id"
            )
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
        self._key, self._pairs = key, pairs
        return pairs

    def insert(self, rows: NewAllocations, now: datetime, shares: dict[int, int] | None = None) -> None:
        """Active allocations for the new rows; ``shares``: job id -> thousandths for jobs that
        share a GPU (everyone else takes whole GPUs)."""
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
                # one statement per share (whole GPUs: one): the GPU ids travel as one JSON object
                # of job id -> GPU ids that SQLite unpacks itself, three times faster than an
                # executemany of one tuple per GPU. The timestamp is adapted once, as the ORM would.
                stamp = connection.ops.adapt_datetimefield_value(now)
                by_share: dict[int, dict[str, list[int]]] = {}
                for j, gpus in zip(rows.jobs, rows.gpus, strict=True):
                    doc = by_share.setdefault(shares.get(j, 1000), {})
                    doc.setdefault(str(j), []).extend(gpus.tolist())
                for share, doc in by_share.items():
                    cursor.execute(
                        f"INSERT INTO {table} {columns} SELECT CAST(j.key AS INTEGER), g.value, 1, %s, %s "
                        "FROM json_each(%s) AS j, json_each(j.value) AS g",
                        [share, stamp, json.dumps(doc)],
                    )

    def release(self, now: datetime, *, jobs=None, job=None, gpu_ids=None) -> int:
        """Release the active allocations of ``jobs`` (ids), or of ``job`` (optionally only on
        ``gpu_ids``). Returns how many were released."""
        qs = Allocation.objects.filter(active=True)
        qs = qs.filter(job_id__in=list(jobs)) if jobs is not None else qs.filter(job=job)
        if gpu_ids is not None:
            qs = qs.filter(gpu_id__in=list(gpu_ids))
        return qs.update(active=False, released_at=now)

    def carry(self, victims, shrunk, added: np.ndarray) -> None:
        """Carry the cached pairs over a cycle's own changes (``victims``: job ids that lost all
        their GPUs; ``shrunk``: (job id, GPU ids released); ``added``: new pairs), so the next
        cycle does not read 100,000 rows again. They are kept once the transaction commits, under
        the key they imply; the next read trusts them only if the database's key is the same, so
        any other writer's change makes it read everything, as before."""
        cached = self._pairs
        self._key = self._pairs = None
        if cached is None:
            return
        keys = (cached[:, 0] << 32) | cached[:, 1]  # ascending: the pairs are by job, then GPU
        keep = ~np.isin(cached[:, 0], list(victims)) if victims else np.ones(len(cached), dtype=bool)
        if shrunk:
            released = np.concatenate([(np.int64(j) << 32) | gpus.astype(np.int64) for j, gpus in shrunk])
            keep &= ~np.isin(keys, released)
        # the new pairs merged in where they sort (by job, then GPU, as a fresh read): a binary
        # search each instead of sorting 100,000 pairs again
        added = np.asarray(added, dtype=np.int64).reshape(-1, 2)
        new_keys = (added[:, 0] << 32) | added[:, 1]
        order = np.argsort(new_keys, kind="stable")
        at = np.searchsorted(keys[keep], new_keys[order])
        pairs = np.insert(cached[keep], at, added[order], axis=0)
        # The key these pairs should have in the database. It is not checked here: the next read
        # asks the database's key first thing, and any other writer's change, during this cycle or
        # after it, makes them differ.
        self.fold()
        key = _key(len(pairs), pairs[:, 0].sum(), pairs[:, 1].sum(), _mix(pairs))

        def keep_carried() -> None:
            self._key, self._pairs = key, pairs

        transaction.on_commit(keep_carried)


class Holdings:
    """Who holds which GPUs, in snapshot indices (read once, updated by the caller as it moves
    jobs): for fault recovery and anything else that plans outside the cycle."""

    def __init__(self) -> None:
        self.snapshot = topology_cache.current()
        self.layout = layouts.layout(self.snapshot)
        pairs = allocations.active_pairs()
        self.jobs = pairs[:, 0]
        self.gpus = topology_cache.gpu_indices(pairs[:, 1])
        self.owned = np.zeros(self.snapshot.num_gpus, dtype=bool)
        self.owned[self.gpus] = True
        self.owner = np.full(self.snapshot.num_gpus, -1, dtype=np.int64)
        self.owner[self.gpus] = self.jobs
        self._borrowers: list[int] | None = None  # jobs on spares whose queue may borrow them

    def yielding(self) -> np.ndarray:
        """Spare GPUs held by jobs of queues allowed to borrow spares: recovery may take them.
        Which jobs those are is read once per ``Holdings`` (one fault), not once per job it hits."""
        snap = self.snapshot
        on_spares = self.owned & snap.node_spare[snap.gpu_node]
        if not on_spares.any():
            return on_spares
        if self._borrowers is None:
            self._borrowers = list(
                Job.objects.filter(
                    pk__in=np.unique(self.owner[on_spares]).tolist(), queue__may_use_spares=True
                ).values_list("id", flat=True)
            )
        return on_spares & np.isin(self.owner, self._borrowers)

    def gpus_of(self, job_id: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.jobs, [job_id, job_id + 1])
        return self.gpus[lo:hi]


allocations = AllocationStore()
layouts = LayoutCache()


def reset() -> None:
    """Forget every cached read (tests that roll the database back call this)."""
    allocations.reset()
    layouts.reset()


# --- the cycle's reads -------------------------------------------------------------------------


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
                queueing=q.queueing_strategy,
                head_wait_s=float(q.head_wait_s) if q.head_wait_s is not None else None,
                may_use_spares=q.may_use_spares,
                borrow_preempt_max_priority=q.borrow_preempt_max_priority,
            )
        )
    return specs


def epoch(column: str) -> str:
    """SQL for a datetime column as epoch seconds (a float), so that no row needs a datetime."""
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})::float8"
    return f"(julianday({column}) - 2440587.5) * 86400.0"
