"""What the active allocations and the running jobs add up to, kept by PostgreSQL's triggers so that
a cycle can ask "did anyone else change them?" by reading a few rows (scheduling.store,
scheduling.running)."""

from __future__ import annotations

from django.db import models


class AllocationTotals(models.Model):
    """On PostgreSQL, what the active allocation rows add up to (scheduling.store's key: their
    count and the sums of their job ids, of their places, node id x 16 + bank, in ``gpu_sum``, and
    of a hash of job, place and slots), kept by a trigger (migrations 0028 and 0035): each
    statement that writes allocations adds one row of what it changed, and the cycle folds the
    rows into one now and then. Reading these few rows replaces
    an aggregate over every allocation row, history included. SQLite computes the same sums from
    its covering index of the active rows and leaves this table empty."""

    count = models.BigIntegerField()
    job_sum = models.BigIntegerField()
    gpu_sum = models.BigIntegerField()
    mix_sum = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.count:+d} active allocations"


class RunningTotals(models.Model):
    """On PostgreSQL, what the running jobs add up to (their count, and the sums of their ids, of
    their revisions and of a hash of each id and revision), kept by a trigger (migration 0033) as
    AllocationTotals is: each statement that writes jobs adds a row of what it changed. A cycle
    that knows what it changed itself compares these few rows with what it expects instead of
    reading every running job's id and revision again (scheduling.running). SQLite leaves it
    empty."""

    count = models.BigIntegerField()
    id_sum = models.BigIntegerField()
    revision_sum = models.BigIntegerField()
    mix_sum = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.count:+d} running jobs"
