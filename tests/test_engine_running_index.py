"""The running jobs' index a caller keeps between cycles (engine.steps.state.RunningIndex): grown
by the jobs started since, it is what a pass over every running job would give, and a cycle
given the index decides what it decides given the list, leaving the index as it was."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.scheduler import schedule
from engine.steps.state import RunningIndex
from engine.workload import PendingJob, QueueSpec, Reclaim
from tests.engine_helpers import layout_for, running

H100 = "H100-SXM"


def _jobs(lay):
    whole = running(lay, 1, "a", nodes=[0], end=500.0)
    shared = replace(running(lay, 2, "b", gpus=[8]), share=250)
    mixed = replace(running(lay, 3, "a", nodes=[2]), parts=((H100, 6), ("B200", 2)))
    idle = running(lay, 4, "a", gpus=[])  # holds nothing: left out
    in_array = [replace(running(lay, 10 + i, "b", gpus=[16 + i]), array=7) for i in range(3)]
    return [whole, shared, mixed, idle, *in_array]


def _figures(index: RunningIndex, queue_index, chip_index):
    usage, by_queue_chip, by_chip, fractional = index.maps(queue_index, chip_index)
    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    return (
        [j.id for j in index.jobs],
        usage,
        {k: ids(v) for k, v in by_queue_chip.items()},
        {k: ids(v) for k, v in by_chip.items()},
        ids(fractional),
        index.array_running,
        np.sort(index.owned()).tolist(),
    )


def test_an_index_grown_by_started_jobs_is_the_index_of_them_all():
    lay = layout_for()
    jobs = _jobs(lay)
    queue_index, chip_index = {"a": 0, "b": 1}, {H100: 0, "B200": 1}
    grown = RunningIndex(jobs[:2])
    grown.owned()  # asked between extensions, as a cycle does
    grown.extend(jobs[2:5])
    grown.extend(jobs[5:])
    whole = RunningIndex(jobs)
    assert _figures(grown, queue_index, chip_index) == _figures(whole, queue_index, chip_index)
    ids, usage, by_queue_chip, _, fractional, arrays, owned = _figures(whole, queue_index, chip_index)
    assert 4 not in ids and fractional == [2] and arrays == {7: 3}
    assert usage[("a", H100)] == (8 + 6) * 1000 and usage[("b", H100)] == 250 + 3 * 1000
    assert by_queue_chip[(0, 1)] == [3] and len(owned) == 8 + 1 + 8 + 3


def test_a_cycle_given_the_index_decides_as_with_the_list_and_leaves_the_index_as_it_was():
    lay = layout_for()
    queues = [
        QueueSpec("a", nominal={H100: 32}, cohort="c", reclaim_within_cohort=Reclaim.ANY),
        QueueSpec("b", nominal={H100: 32}, cohort="c"),
    ]
    # b borrowed a's idle quota; a's new work reclaims it
    holders = [running(lay, i + 1, "b", nodes=[i], end=1000.0 + i) for i in range(6)]
    pending = [PendingJob(20 + i, "a", 8, chip_types=(H100,), submitted_at=i) for i in range(5)]
    index = RunningIndex(holders)
    before = _figures(index, {"a": 0, "b": 1}, {H100: 0})
    with_list = schedule(lay, queues, holders, pending, 0.0)
    with_index = schedule(lay, queues, index, pending, 0.0)
    assert with_list.preemptions  # the cycle changed its own view of the running jobs
    assert [(a.job_id, a.held.tolist()) for a in with_index.admissions] == [
        (a.job_id, a.held.tolist()) for a in with_list.admissions
    ]
    assert [p.job_id for p in with_index.preemptions] == [p.job_id for p in with_list.preemptions]
    assert with_index.pending == with_list.pending
    assert _figures(index, {"a": 0, "b": 1}, {H100: 0}) == before
