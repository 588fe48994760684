"""The embedded default's writers take turns: a submit waiting for SQLite's write lock gets it at the
next gap between another process's transactions, not after a run of them (a scheduling worker
running cycles back to back held submits off for seconds with SQLite's own busy handler)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time

from django.db import connections

from config.sqlite3.base import DatabaseWrapper

HOLD_S, GAP_S = 0.15, 0.005  # a cycle's turn, and the moment between one cycle and the next


def _back_to_back(path: str, stop) -> None:
    """Transactions one after another, each holding the write lock HOLD_S, GAP_S apart."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    while not stop.is_set():
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO turns (who) VALUES ('cycle')")
        time.sleep(HOLD_S)
        db.execute("COMMIT")
        time.sleep(GAP_S)


def test_a_writer_gets_the_lock_at_the_next_gap_between_back_to_back_transactions(
    tmp_path, django_db_blocker
):
    path = str(tmp_path / "writers.sqlite3")
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, who TEXT)")
    settings_dict = {
        **connections["default"].settings_dict,
        "ENGINE": "config.sqlite3",
        "NAME": path,
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    }
    writer = DatabaseWrapper(settings_dict, alias="writers")
    stop = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_back_to_back, args=(path, stop))
    holder.start()
    waited = []
    with django_db_blocker.unblock():  # a database of its own, not the suite's
        try:
            writer.ensure_connection()
            while setup.execute("SELECT COUNT(*) FROM turns").fetchone()[0] < 2:
                time.sleep(0.01)
            for _ in range(8):
                before = setup.execute("SELECT COUNT(*) FROM turns WHERE who = 'cycle'").fetchone()[0]
                writer._start_transaction_under_autocommit()  # the BEGIN that transaction.atomic() issues
                with writer.cursor() as cursor:
                    cursor.execute("SELECT COUNT(*) FROM turns WHERE who = 'cycle'")
                    waited.append(cursor.fetchone()[0] - before)  # the other's turns it waited through
                    cursor.execute("INSERT INTO turns (who) VALUES ('submit')")
                writer.connection.execute("COMMIT")
                time.sleep(HOLD_S / 3)
        finally:
            stop.set()
            holder.join(10)
            writer.close()
    # each submit waits for the transaction under way, now and then for one more; SQLite's own
    # busy handler, sleeping up to 100 ms between tries, let 10-100 of them pass
    assert max(waited) <= 2, waited
