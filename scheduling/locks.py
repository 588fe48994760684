"""The scheduling lock: one cycle at a time across all workers and machines.

PostgreSQL: a transaction-scoped advisory lock. SQLite (the embedded default, one machine): an
exclusive file lock. Either way the partial unique index on active allocations is the last line:
even a cycle that ran without the lock could not put a GPU in two active allocations.

On SQLite a write transaction holds the database's one write lock from its BEGIN, so every holder
of the scheduling lock takes the file lock first and the write transaction second
(``locked_transaction``): a cycle reads and decides holding only the file lock and opens its write
transaction to apply (``cycle_scope``), so submits wait for a cycle's writes only. Were the order
reversed anywhere, a holder of the write lock waiting for the file lock and a cycle holding the
file lock waiting for the write lock would wait for each other until SQLite's timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

LOCK_KEY = 0x6D797269  # "myri"


def lock_clock() -> float:
    """Now on the clock the lock lives by (the database server's on PostgreSQL): a cycle's times
    read inside the lock, on one clock, show that two cycles never held it together."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
            return float(cursor.fetchone()[0])
    import time

    return time.time()


@contextlib.contextmanager
def locked_transaction(wait: bool = True):
    """A transaction under the scheduling lock, the two taken in the one order every holder uses;
    yields whether the lock is held (``wait=False``: False at once when another holds it, and
    then no transaction is open on SQLite)."""
    with cycle_scope(wait) as (locked, writing):
        if not locked:
            yield False
            return
        with writing():
            yield True


@contextlib.contextmanager
def cycle_scope(wait: bool = False):
    """The scheduling lock for a cycle: yields (held, writing), ``writing()`` being what the
    cycle's writes run in. PostgreSQL: one transaction from the lock to the commit, its statements
    each reading what was committed when it ran; ``writing()`` adds nothing. SQLite: the file lock
    only while the cycle reads and decides (each statement again reads what is committed), then
    ``writing()`` is the write transaction. Either way a decision about a job that changed since
    the cycle read it is dropped when it is applied (scheduling.apply.still_current)."""
    if connection.vendor == "postgresql":
        with transaction.atomic(), cycle_lock(wait) as locked:
            yield locked, contextlib.nullcontext
        return
    with cycle_lock(wait) as locked:
        yield locked, transaction.atomic


@contextlib.contextmanager
def cycle_lock(wait: bool = False):
    """Yields True when this process holds the lock. PostgreSQL: must be entered inside a
    transaction (the lock is released at its end). SQLite: must be entered outside one, and the
    transaction opened inside it (``locked_transaction``)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            if wait:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
                yield True
            else:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
                yield bool(cursor.fetchone()[0])
        return  # released when the transaction ends
    path = Path(settings.DATA_DIR) / "scheduling-cycle.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
