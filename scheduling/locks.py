"""The scheduling lock: one cycle at a time across all workers and machines.

PostgreSQL: a transaction-scoped advisory lock. SQLite (the embedded default, one machine): an
exclusive file lock. Either way the partial unique index on active allocations is the last line:
even a cycle that ran without the lock could not put a GPU in two active allocations.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from django.conf import settings
from django.db import connection

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
def cycle_lock(wait: bool = False):
    """Yields True when this process holds the lock. Must be entered inside a transaction."""
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
