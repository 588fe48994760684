"""What a scheduling cycle reads and the allocations it writes, with the vendor-specific SQL.

The cycle, fault recovery, the overview and the simulated fleet all read who holds which GPUs
through ``allocations`` (one object, cached across cycles) and the placement layout through
``layouts``; nothing outside this module touches their caches.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import NamedTuple

import numpy as np
from django.db import connection, transaction

from cluster.models import ChipType
from cluster.snapshot import topology_cache
from engine.placement import Layout
from engine.workload import QueueSpec
from scheduling.allocation_models import BANK
from scheduling.bulk import update_rows
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


# a hash of each active row (job, place = node id x 16 + bank, slots), summed with the counts: two
# different sets of rows with the same count and sums still differ (migration 0035's triggers keep
# the same sums)
_JOB_FACTOR, _PLACE_FACTOR, _SLOTS_FACTOR, _MODULUS = 2654435761, 40503, 69069, 1000000007
_BANKS = 16  # a row's place: node id x 16 + bank (banks 0-8)
PLACE = f"(node_id * {_BANKS} + bank)"
MIX = f"((job_id * {_JOB_FACTOR} + {PLACE} * {_PLACE_FACTOR} + slots * {_SLOTS_FACTOR}) % {_MODULUS})"
FOLD_ROWS = 256  # PostgreSQL's totals are folded into one row once they have this many
_BITS = np.arange(BANK, dtype=np.int64)


def _key(count, job_sum, place_sum, mix_sum) -> tuple:
    return (
        connection.alias,
        connection.settings_dict["NAME"],
        int(count or 0),
        int(job_sum or 0),
        int(place_sum or 0),
        int(mix_sum or 0),
    )


def _rows_key(rows: np.ndarray) -> tuple:
    """The key of (job, node, bank, slots) rows, as the database computes it."""
    jobs, place = rows[:, 0], rows[:, 1] * _BANKS + rows[:, 2]
    mix = (jobs * _JOB_FACTOR + place * _PLACE_FACTOR + rows[:, 3] * _SLOTS_FACTOR) % _MODULUS
    return _key(len(rows), jobs.sum(), place.sum(), mix.sum())


def _sorted(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))]


def node_rows(pairs: np.ndarray) -> np.ndarray:
    """(job id, node id, bank, slots) rows for (job id, GPU id) pairs: one per job, node and bank
    of eight GPUs, the GPUs' bits or-ed together, sorted."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if not len(pairs):
        return np.zeros((0, 4), dtype=np.int64)
    nodes, index = topology_cache.gpu_cells(pairs[:, 1])
    jobs, banks, bits = pairs[:, 0], index // BANK, np.left_shift(1, index % BANK)
    order = np.lexsort((banks, nodes, jobs))
    jobs, nodes, banks, bits = jobs[order], nodes[order], banks[order], bits[order]
    starts = np.flatnonzero(
        np.r_[True, (jobs[1:] != jobs[:-1]) | (nodes[1:] != nodes[:-1]) | (banks[1:] != banks[:-1])]
    )
    return np.column_stack([jobs[starts], nodes[starts], banks[starts], np.bitwise_or.reduceat(bits, starts)])


def gpu_pairs(rows: np.ndarray) -> np.ndarray:
    """(job id, GPU id) of each GPU of (job, node, bank, slots) rows, by job then GPU (a bit whose
    GPU the inventory no longer has is left out)."""
    r, k = np.nonzero((rows[:, 3:4] >> _BITS) & 1)
    gpus = topology_cache.gpus_at(rows[r, 1], rows[r, 2] * BANK + k)
    jobs, known = rows[r, 0], gpus >= 0
    jobs, gpus = jobs[known], gpus[known]
    order = np.lexsort((gpus, jobs))
    return np.stack([jobs[order], gpus[order]], axis=1)


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
    """Active allocations as (job id, GPU id) pairs and as the database's rows (job id, node id,
    bank, slots), cached between reads under a key that any other writer's change alters, and
    carried over a cycle's own changes without a re-read."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._pairs: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._inventory: tuple | None = None  # the inventory the pairs' GPU ids were read from

    def reset(self) -> None:
        """Forget what earlier reads saw (tests that roll the database back call this)."""
        self.__init__()

    @property
    def cached(self) -> np.ndarray | None:
        return self._pairs

    @property
    def cached_rows(self) -> np.ndarray | None:
        return self._rows

    def key(self, cursor) -> tuple:
        """(database, active rows, the sums of their job ids, of their places (node id x 16 +
        bank) and of a hash of each row): any insert, release or delete by anyone changes it, and
        the cycle's own view of the rows gives the same figures as the database's. PostgreSQL keeps
        the figures as it writes (AllocationTotals, by trigger) and this reads a few rows; SQLite
        sums its covering index of the active rows."""
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT SUM(count), SUM(job_sum), SUM(gpu_sum), SUM(mix_sum) "
                f"FROM {AllocationTotals._meta.db_table}"
            )
        else:
            cursor.execute(
                f"SELECT COUNT(*), SUM(job_id), SUM({PLACE}), SUM({MIX}) "
                f"FROM {Allocation._meta.db_table} WHERE active"
            )
        return _key(*cursor.fetchone())

    @staticmethod
    def fold() -> None:
        fold_totals(AllocationTotals)

    def is_current(self) -> bool:
        with connection.cursor() as cursor:
            return self._pairs is not None and self._key == self.key(cursor)

    def active_rows(self) -> np.ndarray:
        """(job id, node id, bank, slots) of every active allocation row, sorted."""
        self.active_pairs()
        return self._rows

    def active_pairs(self, left=None) -> np.ndarray:
        """(job id, GPU id) of every active allocation, ordered by job then GPU. The rows come
        back as one string that NumPy parses, so 12,000 rows are not 12,000 Python tuples.
        ``left``: jobs the caller knows stopped since the last read (they finished, failed or were
        cancelled, releasing their GPUs): when the cached rows without theirs give the database's
        key, nothing is read (between two cycles that is most of what changes)."""
        table = Allocation._meta.db_table
        with connection.cursor() as cursor:
            key = self.key(cursor)
            if self._key == key and self._pairs is not None:
                return self._current_pairs()
            if left is not None and len(left) and self._rows is not None:
                rows = self._rows[~np.isin(self._rows[:, 0], left)]
                if _rows_key(rows) == key:
                    self._key, self._rows = key, rows
                    self._pairs = self._pairs[~np.isin(self._pairs[:, 0], left)]
                    return self._current_pairs()
            if connection.vendor == "postgresql":
                packed = "string_agg(concat_ws(',', job_id, node_id, bank, slots), ',')"
            else:
                packed = "group_concat(job_id || ',' || node_id || ',' || bank || ',' || slots, ',')"
            cursor.execute(f"SELECT {packed} FROM {table} WHERE active")
            text = cursor.fetchone()[0]
        rows = np.fromstring(text or "", dtype=np.int64, sep=",").reshape(-1, 4)
        self._key, self._rows = key, _sorted(rows)
        self._pairs, self._inventory = gpu_pairs(self._rows), topology_cache.key
        return self._pairs

    def _current_pairs(self) -> np.ndarray:
        """The cached pairs, their GPU ids found again from the rows if the inventory changed since
        (a row names a node and GPU slots; a GPU's id is the inventory's)."""
        if self._inventory != topology_cache.key:
            self._pairs, self._inventory = gpu_pairs(self._rows), topology_cache.key
        return self._pairs

    def insert(self, rows: NewAllocations, now: datetime, shares: dict[int, int] | None = None) -> np.ndarray:
        """Active allocations for the new GPUs, one row per job, node and bank; ``shares``: job id
        -> thousandths for jobs that share a GPU (everyone else takes whole GPUs). Returns the rows
        written (job id, node id, bank, slots)."""
        table = Allocation._meta.db_table
        shares = shares or {}
        written = node_rows(rows.pairs())
        share = [shares.get(j, 1000) for j in written[:, 0].tolist()]
        columns = "(job_id, node_id, bank, slots, active, share, created_at)"
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                stamp = now.isoformat()
                block = "".join(
                    f"{j}\t{n}\t{b}\t{m}\tt\t{s}\t{stamp}\n"
                    for (j, n, b, m), s in zip(written.tolist(), share, strict=True)
                )
                # COPY is not wrapped by Django: map driver errors to Django's (IntegrityError...)
                with (
                    connection.wrap_database_errors,
                    cursor.copy(f"COPY {table} {columns} FROM STDIN") as copy,
                ):
                    copy.write(block)
            else:
                # one statement: the rows travel as one JSON array that SQLite unpacks itself, three
                # times faster than an executemany. The timestamp is adapted once, as the ORM would.
                stamp = connection.ops.adapt_datetimefield_value(now)
                doc = [[*r, s] for r, s in zip(written.tolist(), share, strict=True)]
                cursor.execute(
                    f"INSERT INTO {table} {columns} SELECT t.value ->> 0, t.value ->> 1, t.value ->> 2, "
                    "t.value ->> 3, 1, t.value ->> 4, %s FROM json_each(%s) AS t",
                    [stamp, json.dumps(doc)],
                )
        return written

    def release(self, now: datetime, *, jobs=None, job=None, gpu_ids=None) -> int:
        """Release the active allocations of ``jobs`` (ids), or of ``job`` (optionally only its
        ``gpu_ids``: a row keeps the GPUs it still holds, and a released row with the same times
        records the others). Returns how many rows were released or narrowed."""
        qs = Allocation.objects.filter(active=True)
        qs = qs.filter(job_id__in=list(jobs)) if jobs is not None else qs.filter(job=job)
        if gpu_ids is None:
            return qs.update(active=False, released_at=now)
        gone = {}
        for _, node, bank, bits in node_rows([(0, g) for g in gpu_ids]).tolist():
            gone[(node, bank)] = bits
        whole, narrowed, history = [], [], []
        for a in qs.only("id", "job_id", "node_id", "bank", "slots", "share", "created_at"):
            bits = a.slots & gone.get((a.node_id, a.bank), 0)
            if bits == a.slots:
                whole.append(a.pk)
            elif bits:
                narrowed.append((a.pk, a.slots & ~bits))
                history.append(
                    Allocation(
                        job_id=a.job_id,
                        node_id=a.node_id,
                        bank=a.bank,
                        slots=bits,
                        active=False,
                        share=a.share,
                        created_at=a.created_at,
                        released_at=now,
                    )
                )
        update_rows(Allocation, ["slots"], narrowed)
        if whole:
            Allocation.objects.filter(pk__in=whole).update(active=False, released_at=now)
        Allocation.objects.bulk_create(history)
        return len(whole) + len(narrowed)

    def carry(self, victims, shrunk, added: np.ndarray, written: np.ndarray | None = None) -> None:
        """Carry the cached pairs and rows over a cycle's own changes (``victims``: job ids that
        lost all their GPUs; ``shrunk``: (job id, GPU ids released); ``added``: new pairs, written
        by one ``insert``, which returned ``written``, their rows), so the next cycle does not read
        every row again. They are worked out and kept once the transaction commits, under the key
        they imply; the next read trusts them only if the database's key is the same, so any other
        writer's change makes it read everything."""
        cached, rows = self._pairs, self._rows
        self._key = self._pairs = self._rows = None
        if cached is None or rows is None:
            return
        self.fold()
        inventory = topology_cache.key

        def keep_carried() -> None:
            # after the commit: the cycle's admissions are visible (and on PostgreSQL the lock is
            # free) a few milliseconds sooner than if this ran inside the transaction
            pairs, kept = _carried(cached, rows, victims, shrunk, added, written)
            self._key, self._pairs, self._rows, self._inventory = _rows_key(kept), pairs, kept, inventory

        transaction.on_commit(keep_carried)


def _carried(cached, rows, victims, shrunk, added, written) -> tuple[np.ndarray, np.ndarray]:
    """The pairs and rows after a cycle's own changes (``AllocationStore.carry``). The rows' key
    is not checked against the database here: the next read asks the database's key first thing,
    and any other writer's change, during the cycle or after it, makes them differ."""
    keys = (cached[:, 0] << 32) | cached[:, 1]  # ascending: the pairs are by job, then GPU
    keep = ~np.isin(cached[:, 0], list(victims)) if victims else None
    if victims:
        rows = rows[~np.isin(rows[:, 0], list(victims))]
    if shrunk:
        released = np.concatenate([(np.int64(j) << 32) | gpus.astype(np.int64) for j, gpus in shrunk])
        gone = np.isin(keys, released)
        keep = ~gone if keep is None else keep & ~gone
        rows = _narrowed(rows, node_rows(np.column_stack([released >> 32, released & 0xFFFFFFFF])))
    if keep is not None:
        cached, keys = cached[keep], keys[keep]
    # the new pairs merged in where they sort (by job, then GPU, as a fresh read): a binary
    # search each instead of sorting 100,000 pairs again
    added = np.asarray(added, dtype=np.int64).reshape(-1, 2)
    new_keys = (added[:, 0] << 32) | added[:, 1]
    order = np.argsort(new_keys, kind="stable")
    pairs = np.insert(cached, np.searchsorted(keys, new_keys[order]), added[order], axis=0)
    rows = _sorted(np.concatenate([rows, node_rows(added) if written is None else written]))
    return pairs, rows


def _narrowed(rows: np.ndarray, released: np.ndarray) -> np.ndarray:
    """``rows`` less the GPUs of ``released`` rows (as ``AllocationStore.release`` narrows them in
    the database): a row left with no GPU is gone."""
    if not len(released):
        return rows
    key = lambda r: (r[:, 0] << 40) | (r[:, 1] << 8) | r[:, 2]  # noqa: E731 - job, node, bank
    gone_keys = key(released)
    order = np.argsort(gone_keys)
    gone_keys, gone_bits = gone_keys[order], released[order, 3]
    row_keys = key(rows)
    at = np.minimum(np.searchsorted(gone_keys, row_keys), len(gone_keys) - 1)
    hit = gone_keys[at] == row_keys
    rows = rows.copy()
    rows[hit, 3] &= ~gone_bits[at[hit]]
    return rows[rows[:, 3] != 0]


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


class Names(NamedTuple):
    """Database id -> name of the queues and of the chip types, as a cycle reads them once."""

    queues: dict[int, str]
    chips: dict[int, str]


_QUEUE_FIELDS = (  # a queue's settings, then one quota per row (None without quotas)
    *("id", "name", "cohort__name", "priority", "weight", "reclaim_within_cohort", "within_queue"),
    *("stopped", "queueing_strategy", "head_wait_s", "may_use_spares", "borrow_preempt_max_priority"),
    *("quotas__chip_type__name", "quotas__nominal", "quotas__borrowing_limit", "quotas__lending_limit"),
)


def queue_names() -> dict[int, str]:
    return dict(Queue.objects.values_list("id", "name"))


def chip_names() -> dict[int, str]:
    return dict(ChipType.objects.values_list("id", "name"))


def load_names() -> Names:
    """The names alone, for a reader that does not need the queues' settings."""
    return Names(queue_names(), chip_names())


def load_queues_and_names() -> tuple[list[QueueSpec], Names]:
    """The queues as the engine takes them (by name, each quota by chip type in id order), and the
    names of the queues and chip types by id: two statements (a queue and its quotas are one row
    per quota, joined)."""
    rows = Queue.objects.order_by("name", "quotas__chip_type_id").values_list(*_QUEUE_FIELDS)
    grouped: dict[int, list[tuple]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    specs = []
    for queue_rows in grouped.values():
        (_, name, cohort, priority, weight, reclaim, within, stopped, strategy, head_wait, spares, up_to) = (
            queue_rows[0][:12]
        )
        quotas = [q[12:] for q in queue_rows if q[12] is not None]
        specs.append(
            QueueSpec(
                name=name,
                cohort=cohort,
                priority=priority,
                weight=weight,
                nominal={chip: nominal for chip, nominal, _, _ in quotas},
                borrowing_limit={chip: limit for chip, _, limit, _ in quotas},
                lending_limit={chip: limit for chip, _, _, limit in quotas},
                reclaim_within_cohort=reclaim,
                within_queue=within,
                stopped=stopped,
                queueing=strategy,
                head_wait_s=float(head_wait) if head_wait is not None else None,
                may_use_spares=spares,
                borrow_preempt_max_priority=up_to,
            )
        )
    queues = {queue_id: rows[0][1] for queue_id, rows in grouped.items()}
    return specs, Names(queues, chip_names())


def load_queues() -> list[QueueSpec]:
    return load_queues_and_names()[0]


def epoch(column: str) -> str:
    """SQL for a datetime column as epoch seconds (a float), so that no row needs a datetime."""
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})::float8"
    return f"(julianday({column}) - 2440587.5) * 86400.0"
