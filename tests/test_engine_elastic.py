"""Elastic jobs in the scheduling cycle: admitted at the largest feasible size, shrunk instead of
evicted, grown back when GPUs free up. Every cycle runs the invariant checker."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.workload import PendingJob, QueueSpec, RunningJob
from tests.engine_helpers import cycle, gpus_of_nodes, layout_for, running

H100 = "H100-SXM"


def elastic(job_id, low, high, queue="a", step=8, **kw):
    return PendingJob(
        job_id,
        queue,
        high,
        chip_types=(H100,),
        submitted_at=job_id,
        min_gpus=low,
        size_step=step,
        topology=kw.pop("topology", "region"),
        **kw,
    )


def as_running(admission, job, queue="a", priority=0):
    return RunningJob(
        admission.job_id,
        queue,
        admission.held,
        admission.chip,
        priority,
        min_gpus=job.min_gpus,
        max_gpus=job.gpus,
        size_step=job.size_step,
        topology=job.topology,
    )


def test_admitted_at_the_largest_size_the_free_gpus_allow():
    lay = layout_for()  # 2 datacenters x 2 pods x 32 GPUs = 128 H100
    busy = [running(lay, 100, "a", nodes=list(range(0, 10)))]  # 80 busy, 48 free
    job = elastic(1, 16, 128)
    result, _ = cycle(lay, [QueueSpec("a", nominal={H100: 1000})], busy, [job])
    (a,) = result.admissions
    assert len(a.held) == 48


def test_admitted_at_the_largest_size_the_quota_allows():
    lay = layout_for()
    job = elastic(1, 16, 128)
    result, _ = cycle(lay, [QueueSpec("a", nominal={H100: 40})], [], [job])
    assert len(result.admissions[0].held) == 40


def test_below_its_minimum_it_stays_pending_with_the_minimum_in_the_reason():
    lay = layout_for()
    busy = [running(lay, 100, "a", nodes=list(range(0, 14)))]  # 16 GPUs free
    result, _ = cycle(lay, [QueueSpec("a", nominal={H100: 1000})], busy, [elastic(1, 24, 64)])
    assert not result.admissions
    assert "24 free H100-SXM" in result.pending[1]


def test_reclaiming_quota_shrinks_the_borrower_instead_of_evicting_it():
    lay = layout_for()  # 128 GPUs
    queues = [
        QueueSpec("lender", cohort="c", nominal={H100: 64}, reclaim_within_cohort="any"),
        QueueSpec("borrower", cohort="c", nominal={H100: 64}),
    ]
    # the borrower's elastic job runs on all 128 GPUs (64 borrowed), minimum 64
    job = elastic(1, 64, 128, queue="borrower")
    first, after = cycle(lay, queues, [], [job])
    assert len(first.admissions[0].held) == 128
    big = after[0]
    # the lender wants 32 of its own back
    want = PendingJob(2, "lender", 32, chip_types=(H100,), submitted_at=5)
    result, after = cycle(lay, queues, [big], [want], now=10)
    assert not result.preemptions  # nobody evicted
    (resize,) = result.resizes
    assert resize.job_id == 1 and resize.old_size == 128 and resize.new_size == 96
    assert "for job 2" in resize.reason and "reclaims" in resize.reason
    (a,) = result.admissions
    assert a.job_id == 2 and len(a.held) == 32
    assert set(a.held) <= set(resize.released.tolist())
    sizes = {j.id: len(j.held) for j in after}
    assert sizes == {1: 96, 2: 32}


def test_when_shrinking_is_not_enough_whole_jobs_are_evicted():
    lay = layout_for()
    queues = [QueueSpec("a", nominal={H100: 1000}, within_queue="lower_priority")]
    low = elastic(1, 96, 128)
    first, after = cycle(lay, queues, [], [low])
    urgent = PendingJob(2, "a", 64, priority=10, chip_types=(H100,), submitted_at=3, topology="region")
    result, after = cycle(lay, queues, after, [urgent], now=5)
    # shrinking 128 -> 96 frees only 32: the elastic job is evicted whole instead
    assert [p.job_id for p in result.preemptions] == [1]
    assert not result.resizes
    assert [a.job_id for a in result.admissions] == [2]


def test_grows_back_when_gpus_free_up_and_nobody_waits():
    lay = layout_for()
    queues = [QueueSpec("a", nominal={H100: 1000})]
    other = running(lay, 100, "a", nodes=list(range(0, 8)))  # 64 busy
    job = elastic(1, 16, 128)
    first, after = cycle(lay, queues, [other], [job])
    assert len(first.admissions[0].held) == 64
    mine = next(j for j in after if j.id == 1)
    # the other job ends: the elastic job grows to its maximum in the next cycle
    result, after = cycle(lay, queues, [mine], [], now=60)
    (resize,) = result.resizes
    assert resize.old_size == 64 and resize.new_size == 128 and len(resize.added) == 64
    assert "grew from 64 to 128" in resize.reason


def test_does_not_grow_while_a_pending_gang_waits_for_the_same_chip():
    lay = layout_for()
    queues = [QueueSpec("a", nominal={H100: 1000})]
    mine = running(lay, 1, "a", nodes=list(range(0, 8)))
    mine = replace(mine, min_gpus=16, max_gpus=128, size_step=8, topology="region")
    blocker = running(lay, 100, "a", nodes=list(range(8, 12)))  # 32 busy, 32 free
    gang = PendingJob(2, "a", 48, chip_types=(H100,), submitted_at=1, topology="datacenter")
    result, _ = cycle(lay, queues, [mine, blocker], [gang], now=5)
    assert not result.admissions and not result.resizes
    assert 2 in result.pending


def test_growth_respects_quota_and_steps():
    lay = layout_for()
    queues = [QueueSpec("a", nominal={H100: 84})]
    mine = replace(
        running(lay, 1, "a", nodes=[0, 1]), min_gpus=16, max_gpus=128, size_step=8, topology="region"
    )
    result, after = cycle(lay, queues, [mine], [], now=5)
    (resize,) = result.resizes
    assert resize.new_size == 80  # 84 allowed, whole nodes of 8
    assert np.all(np.isin(gpus_of_nodes(lay, 0, 1), resize.held))
