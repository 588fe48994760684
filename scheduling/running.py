"""The running jobs a scheduling cycle reads, kept between cycles.

A cluster of one-GPU jobs runs 100,000 of them, and rebuilding each from its row every cycle
cost half a second (fetching 14 columns of 100,000 rows makes 1.4 million Python values). So
each read asks the database only for every running job's id and revision: a number the database
raises itself, by a trigger (migration 0026), whenever an UPDATE names a column the engine reads
(any writer alike: the ORM, bulk statements, raw SQL). A job whose revision and GPUs are what the
last read saw is the same job, and its ``RunningJob`` is reused; only the new and the changed
ones are read whole. The names of queues and chip types and the inventory's layout are part of
the cache's key, so a rename or an inventory change reads everything again.

The ids and revisions come back as one packed string that NumPy parses, and are compared with
the last read's as arrays. The engine's index of the running jobs (quota usage, the jobs by queue
and chip, the GPUs they hold, each array's count: engine.steps.state.RunningIndex) is kept too:
when the only change is jobs started since, after every job read before (a cluster filling up),
it grows by them; anything else builds it again.
"""

from __future__ import annotations

import numpy as np
from django.db import connection, transaction

from cluster.snapshot import topology_cache
from engine.steps.state import RunningIndex
from engine.workload import RunningJob
from scheduling.choices import JobState
from scheduling.models import Job, RunningTotals
from scheduling.store import Names, allocations, epoch, fold_totals, load_names

# the columns the engine reads, in RunningJob's order after the queue and chip names
COLUMNS = (
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
    "array_id",
)
_CHUNK = 10_000  # ids per IN (...) list
# a hash of each (id, revision), summed with the counts (migration 0033's trigger keeps the same sum)
_ID_FACTOR, _REVISION_FACTOR, _MODULUS = 2654435761, 40503, 1000000007


def _figures(read: np.ndarray) -> tuple[int, int, int, int]:
    """What RunningTotals adds up for these (id, revision) rows."""
    mix = (read[:, 0] * _ID_FACTOR + read[:, 1] * _REVISION_FACTOR) % _MODULUS
    return len(read), int(read[:, 0].sum()), int(read[:, 1].sum()), int(mix.sum())


def _totals() -> tuple[int, int, int, int]:
    """What the running jobs add up to, as PostgreSQL keeps it (RunningTotals)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT SUM(count), SUM(id_sum), SUM(revision_sum), SUM(mix_sum) "
            f"FROM {RunningTotals._meta.db_table}"
        )
        return tuple(int(x or 0) for x in cursor.fetchone())


def _present(keys: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in ``among``; both sorted (a binary search each, no sort)."""
    if not len(among):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(among, keys), len(among) - 1)
    return among[at] == keys


def _moved(old: np.ndarray | None, new: np.ndarray) -> set[int]:
    """Jobs whose (job, GPU) pairs differ between two reads of the allocations (both ordered by
    job, then GPU, as the allocation store keeps them)."""
    if old is None or old is new:
        return set()
    old_keys, new_keys = ((p[:, 0] << 32) | p[:, 1] for p in (old, new))
    gone = old[:, 0][~_present(old_keys, new_keys)]
    added = new[:, 0][~_present(new_keys, old_keys)]
    return set(gone.tolist()) | set(added.tolist())


class RunningStore:
    """The running jobs of the last read, with their revisions, the allocations they held and
    their index for the engine (engine.steps.state.RunningIndex), kept in id order."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._pairs: np.ndarray | None = None
        self._ids = np.zeros(0, dtype=np.int64)  # ascending
        self._revisions = np.zeros(0, dtype=np.int64)
        self._jobs: list[RunningJob] = []  # one per id
        self.index = RunningIndex()
        # PostgreSQL: the (id, revision) rows the last cycle left, with what they add up to
        self._carried: tuple[tuple, np.ndarray] | None = None

    def reset(self) -> None:
        """Forget what earlier reads saw (tests that roll the database back call this)."""
        self.__init__()

    def load(self, names: Names | None = None) -> list[RunningJob]:
        """Every running job, by id, with the GPUs it holds (snapshot indices). ``names``: the
        queues' and chip types' names by id, when the caller has read them already."""
        queues, chips = names or load_names()
        key = (
            connection.alias,
            connection.settings_dict["NAME"],
            topology_cache.key,
            tuple(sorted(queues.items())),
            tuple(sorted(chips.items())),
        )
        carried, self._carried = self._carried, None
        if carried is not None and key == self._key and _totals() == carried[0]:
            read = carried[1]  # nobody but the last cycle changed a running job since
        else:
            read = _read_running()
        ids, revisions = read[:, 0], read[:, 1]
        if key != self._key:
            self._key, self._pairs, self._ids, self._revisions, self._jobs = key, None, ids[:0], ids[:0], []
            self.index = RunningIndex()
        old_ids = self._ids
        # the jobs that stopped since the last read have released their GPUs: usually no
        # allocation needs reading again (scheduling.store)
        left = old_ids[~_present(old_ids, ids)]
        pairs = allocations.active_pairs(left)
        at = np.minimum(np.searchsorted(old_ids, ids), max(len(old_ids) - 1, 0))
        # present in the last read with the same revision
        kept = np.zeros(len(ids), dtype=bool)
        if len(old_ids):
            kept = (old_ids[at] == ids) & (self._revisions[at] == revisions)
        moved = _moved(self._pairs, pairs)
        if moved:
            kept &= ~np.isin(ids, list(moved))
        stale = ids[~kept]
        built = self._build(stale.tolist(), len(stale) > len(ids) // 2, pairs, queues, chips)
        gone = [i for i in stale.tolist() if i not in built]  # it stopped between the two reads
        if gone:
            keep = ~np.isin(ids, gone)
            ids, revisions, kept, at = ids[keep], revisions[keep], kept[keep], at[keep]
        n = len(old_ids)
        if not len(left) and int(kept.sum()) == n and kept[:n].all():
            # every job read before unchanged and first, the rest new (a growing cluster of
            # started jobs): the index grows by them instead of a pass over every running job
            started = [built[i] for i in ids[n:].tolist()]
            jobs = self._jobs + started
            self.index.extend(started)
        else:
            old = self._jobs
            rows = zip(ids.tolist(), kept.tolist(), at.tolist(), strict=True)
            jobs = [old[a] if k else built[i] for i, k, a in rows]
            self.index = RunningIndex(jobs)
        self._pairs, self._ids, self._revisions, self._jobs = pairs, ids, revisions, jobs
        return jobs

    def carry(self, touched) -> None:
        """PostgreSQL, inside a cycle after its writes: the running jobs' ids and revisions as the
        cycle leaves them (the last read's, with the jobs it ``touched`` (admitted, preempted,
        resized) read again), kept once the transaction commits with what they add up to. The next
        read trusts them only if RunningTotals adds up to the same: anyone else's change to a
        running job, during this cycle or after it, makes it read every running job again."""
        self._carried = None
        if connection.vendor != "postgresql" or self._key is None:
            return
        fold_totals(RunningTotals)
        read = np.column_stack([self._ids, self._revisions])
        touched = sorted(set(touched))
        if touched:
            read = read[~np.isin(read[:, 0], touched)]
            rows, table, on = [], Job._meta.db_table, JobState.RUNNING.value
            with connection.cursor() as cursor:
                for i in range(0, len(touched), _CHUNK):
                    # by primary key only: with the state in the condition too, PostgreSQL on stale
                    # statistics scanned every running job (20-550 ms for a thousand ids)
                    chunk = ",".join(str(int(x)) for x in touched[i : i + _CHUNK])
                    cursor.execute(f"SELECT id, revision, state FROM {table} WHERE id IN ({chunk})")
                    rows += [(j, rev) for j, rev, state in cursor.fetchall() if state == on]
            if rows:
                read = np.concatenate([read, np.array(rows, dtype=np.int64)])
                read = read[np.argsort(read[:, 0], kind="stable")]
        carried = (_figures(read), read)

        def keep() -> None:
            self._carried = carried

        transaction.on_commit(keep)

    def _build(self, ids: list[int], everything: bool, pairs, queues, chips) -> dict[int, RunningJob]:
        """RunningJobs for ``ids`` (``everything``: read every running job, cheaper than a long
        list of ids), from their rows and their allocations in ``pairs``."""
        if not ids:
            return {}
        select = (
            f"SELECT j.id, j.queue_id, j.chip_id, {', '.join(_read(c) for c in COLUMNS)} "
            f"FROM {Job._meta.db_table} j WHERE j.state = %s"
        )
        rows = []
        with connection.cursor() as cursor:
            if everything:
                cursor.execute(select, [JobState.RUNNING.value])
                rows = cursor.fetchall()
            else:
                for i in range(0, len(ids), _CHUNK):
                    chunk = ",".join(str(int(x)) for x in ids[i : i + _CHUNK])
                    cursor.execute(f"{select} AND j.id IN ({chunk})", [JobState.RUNNING.value])
                    rows += cursor.fetchall()
        return _running_jobs(rows, pairs, queues, chips)


def _read_running() -> np.ndarray:
    """Every running job's (id, revision), by id: one string of "id,revision,..." parsed by NumPy
    in one pass, so 100,000 rows are not 100,000 Python tuples. Ordered here: a sort of ids that
    mostly come in order costs little, while PostgreSQL's ORDER BY of 100,000 rows on stale
    statistics spilled to disk."""
    if connection.vendor == "postgresql":
        packed = "string_agg(id::text || ',' || revision::text, ',')"
    else:
        packed = "group_concat(id || ',' || revision, ',')"
    with connection.cursor() as cursor:
        table = Job._meta.db_table
        cursor.execute(f"SELECT {packed} FROM {table} WHERE state = %s", [JobState.RUNNING.value])
        text = cursor.fetchone()[0]
    if not text:
        return np.zeros((0, 2), dtype=np.int64)
    read = np.fromstring(text, dtype=np.int64, sep=",").reshape(-1, 2)
    return read[np.argsort(read[:, 0], kind="stable")]


def _read(column: str) -> str:
    """A column as the engine takes it: datetimes as epoch seconds."""
    return epoch(f"j.{column}") if column.endswith("_at") else f"j.{column}"


def _running_jobs(rows, pairs, queues, chips) -> dict[int, RunningJob]:
    ids = [r[0] for r in rows]
    pairs = pairs[np.isin(pairs[:, 0], ids)]  # only these jobs' GPUs are looked up
    gpu_index = topology_cache.gpu_indices(pairs[:, 1])
    snapshot = topology_cache.structure()
    # Python ints: slicing with NumPy scalars costs twice as much, 100,000 times
    bounds = np.searchsorted(pairs[:, 0], ids).tolist()
    ends = np.searchsorted(pairs[:, 0], ids, side="right").tolist()
    out = {}
    for row, lo, hi in zip(rows, bounds, ends, strict=True):
        job_id, queue, chip, priority, started, duration, checkpoint = row[:7]
        low, high, step, topology, share, mixed, array = row[7:]
        gpus = gpu_index[lo:hi]
        start = started or 0.0
        out[job_id] = RunningJob(  # positional: the fields' order (engine.workload.RunningJob)
            job_id,
            queues[queue],
            gpus,
            chips.get(chip, ""),
            priority,
            start,
            start + duration if duration is not None else None,
            checkpoint,
            low,
            high if low is not None else None,
            step,
            topology,
            share,
            _parts(snapshot, gpus) if mixed else (),
            array,
        )
    return out


def _parts(snapshot, gpus) -> tuple[tuple[str, int], ...]:
    """(chip type, GPUs) per chip type a mixed-chip job holds."""
    chips, counts = np.unique(snapshot.gpu_chip[gpus], return_counts=True)
    return tuple((snapshot.chip_names[c], int(n)) for c, n in zip(chips, counts, strict=True))


running = RunningStore()


def load_running() -> list[RunningJob]:
    return running.load()


def load_running_index(names: Names | None = None) -> RunningIndex:
    """The running jobs as the engine takes them, with the index kept between reads."""
    running.load(names)
    return running.index
