"""The scheduling lock: one cycle at a time across all workers and machines.

PostgreSQL: an advisory lock, transaction-scoped (a cycle that writes after its commit holds it
for its session over both transactions: ``cycle_scope``). SQLite (the embedded default, one machine): an
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
import logging
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

log = logging.getLogger("myriad.scheduling")
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
def cycle_scope(wait: bool = False, after: list | None = None):
    """The scheduling lock for a cycle: yields (held, writing), ``writing()`` being what the
    cycle's writes run in. PostgreSQL: one transaction from the lock to the commit, its statements
    each reading what was committed when it ran; ``writing()`` adds nothing. SQLite: the file lock
    only while the cycle reads and decides (each statement again reads what is committed), then
    ``writing()`` is the write transaction. Either way a decision about a job that changed since
    the cycle read it is dropped when it is applied (scheduling.apply.still_current).

    ``after``: writes the cycle appends (callables) that run after its commit, each in a
    transaction of its own, still under the lock: what nobody's start waits for (the pending
    jobs' reasons), so that the jobs a cycle starts are visible without waiting for them. On
    PostgreSQL the lock is then taken for the session, over both transactions (a transaction's
    lock would be gone at the first commit, and another cycle's newer writes could be overwritten
    by these); inside a caller's transaction, where nothing commits before the caller does, they
    run before the commit."""
    if connection.vendor == "postgresql":
        if after is None or connection.in_atomic_block:
            with transaction.atomic(), cycle_lock(wait) as locked:
                yield locked, contextlib.nullcontext
                if locked:
                    _run_after(after)
            return
        with session_lock(wait) as locked:
            if not locked:
                yield False, contextlib.nullcontext
                return
            with transaction.atomic():
                yield True, contextlib.nullcontext
            _run_after(after)
        return
    with cycle_lock(wait) as locked:
        yield locked, transaction.atomic
        if locked:
            _run_after(after)


def _run_after(after: list | None) -> None:
    for write in after or ():
        try:
            with transaction.atomic():
                write()
        except Exception:  # a reason not written this cycle is written by the next; the cycle stands
            log.exception("a write after the cycle's commit failed")


@contextlib.contextmanager
def session_lock(wait: bool = False):
    """PostgreSQL: the scheduling lock held by this connection's session until the block ends
    (released by the server if the connection dies first); yields whether it is held."""
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
            held = True
        else:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
            held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


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
