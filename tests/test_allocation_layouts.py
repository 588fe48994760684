"""The allocation layouts ``bench.allocation_rows`` compares keep the same guarantee: a GPU held
by one active allocation is refused to a second, while jobs on disjoint GPUs of one node share it."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from bench.allocation_rows import SQLITE_SCHEMA, STAMP, per_node, sqlite_run


@pytest.mark.parametrize("layout", ["gpu", "node", "slots"])
def test_every_layout_refuses_a_second_holder_and_lets_disjoint_jobs_share_a_node(layout, tmp_path):
    jobs = np.array([1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3])  # jobs 1 and 2 share node 0 with job 3
    gpus = np.arange(len(jobs))
    figures = sqlite_run(layout, jobs, gpus, tmp_path)
    assert figures["second_holder_refused"]
    assert figures["rows"] == (len(gpus) if layout == "gpu" else 4)


def test_a_per_node_mask_that_meets_another_on_any_slot_is_refused(tmp_path):
    for layout in ("node", "slots"):
        db = sqlite3.connect(tmp_path / f"{layout}.sqlite3", isolation_level=None)
        for statement in SQLITE_SCHEMA[layout]:
            db.execute(statement)
        insert = (
            "INSERT INTO a (job_id, node_id, mask, active, share, created_at) VALUES (?, ?, ?, ?, 1000, ?)"
        )
        db.execute(insert, (1, 0, 0b0000_0110, 1, STAMP))
        db.execute(insert, (2, 0, 0b1111_0001, 1, STAMP))  # disjoint: accepted
        db.execute(insert, (3, 1, 0b0000_0110, 1, STAMP))  # another node: accepted
        db.execute(insert, (4, 0, 0b0000_0110, 0, STAMP))  # released history: accepted
        with pytest.raises(sqlite3.IntegrityError):
            db.execute(insert, (5, 0, 0b0000_1100, 1, STAMP))  # meets job 1 on slot 2
        db.close()


def test_per_node_rows_carry_each_jobs_gpus_of_a_node_as_one_mask():
    jobs = np.array([7, 7, 7, 8, 8, 8, 8, 8, 8, 8])
    assert per_node(jobs, np.arange(10)) == [(7, 0, 0b111), (8, 0, 0b1111_1000), (8, 1, 0b11)]
