"""Shared GPUs in the scheduling cycle: fractions in thousandths pack onto shared GPUs, never past
1000; whole-GPU and gang jobs never land on a partly used GPU; quota is charged the fraction."""

from __future__ import annotations

import numpy as np
import pytest

from engine.invariants import InvariantViolation, check_cycle
from engine.workload import Admission, CycleResult, PendingJob, QueueSpec, RunningJob
from tests.engine_helpers import cycle, layout_for

H100 = "H100-SXM"


def frac(job_id, share, queue="a", **kw):
    return PendingJob(job_id, queue, 1, chip_types=(H100,), submitted_at=job_id, share=share, **kw)


def queue(nominal=1000):
    return QueueSpec("a", nominal={H100: nominal})


def test_fractions_share_one_gpu_up_to_a_whole():
    lay = layout_for()
    result, after = cycle(lay, [queue()], [], [frac(i, 250) for i in range(1, 6)])
    gpus = [int(a.held[0]) for a in result.admissions]
    assert len(gpus) == 5
    assert gpus[:4] == [gpus[0]] * 4  # four quarters fill one GPU
    assert gpus[4] != gpus[0]  # the fifth opens another


def test_a_whole_gpu_job_never_lands_on_a_shared_gpu():
    lay = layout_for(pods_per_dc=1, racks=1, nodes_per_rack=1, datacenters=1)  # one node of 8 GPUs
    sharer = RunningJob(1, "a", np.array([0]), H100, share=300)
    result, _ = cycle(lay, [queue()], [sharer], [PendingJob(2, "a", 8, chip_types=(H100,), topology="node")])
    assert not result.admissions
    assert "no node with 8 free H100-SXM" in result.pending[2]
    result, _ = cycle(lay, [queue()], [sharer], [PendingJob(3, "a", 7, chip_types=(H100,), topology="node")])
    assert 0 not in result.admissions[0].held


def test_fractions_go_to_the_fullest_node_and_leave_no_useless_sliver():
    lay = layout_for()
    # GPU 0 has 600 used. Pending: 0.3 and 0.4. Putting 0.3 on GPU 0 would leave 0.1 that no
    # pending job can use, so 0.4 goes there (exactly filling it) and 0.3 opens a fresh GPU.
    sharer = RunningJob(1, "a", np.array([0]), H100, share=600)
    result, _ = cycle(lay, [queue()], [sharer], [frac(2, 300), frac(3, 400, priority=-1)])
    placed = {a.job_id: int(a.held[0]) for a in result.admissions}
    assert placed[3] == 0
    assert placed[2] != 0 and lay.gpu_node[placed[2]] == lay.gpu_node[0]  # same, already used node


def test_quota_is_charged_the_fraction():
    lay = layout_for()
    result, _ = cycle(lay, [queue(nominal=1)], [], [frac(i, 250) for i in range(1, 6)])
    assert len(result.admissions) == 4
    assert result.pending[5] == (
        "quota of queue a exhausted for H100-SXM: 1 of 1 in use, needs 0.25; "
        "the queue is in no cohort, so it cannot borrow"
    )


def test_whole_jobs_do_not_evict_sharers():
    lay = layout_for(pods_per_dc=1, racks=1, nodes_per_rack=1, datacenters=1)
    sharers = [RunningJob(i, "a", np.array([i - 1]), H100, share=500) for i in range(1, 9)]
    q = QueueSpec("a", nominal={H100: 1000}, within_queue="lower_priority")
    urgent = PendingJob(20, "a", 8, priority=10, chip_types=(H100,), topology="node")
    result, _ = cycle(lay, [q], sharers, [urgent])
    assert not result.preemptions and not result.admissions


def test_the_checker_refuses_an_overcommitted_gpu():
    lay = layout_for()
    sharer = RunningJob(1, "a", np.array([0]), H100, share=700)
    pending = [frac(2, 400)]
    bad = CycleResult(admissions=[Admission(2, H100, np.array([0]), "node x", 0)])
    with pytest.raises(InvariantViolation, match="held by running jobs"):
        check_cycle(lay, [queue()], [sharer], pending, bad)


def test_a_fraction_keeps_room_the_queue_can_use_where_best_fit_would_strand_it():
    from engine.packing import TaskMix
    from engine.packing_scores import choose_shared_gpu

    # two otherwise full nodes: one GPU with 700 free, one fresh GPU; the work is mostly 0.6 jobs
    mix = TaskMix.from_kinds([(0, 1, 600, (), 9), (0, 1, 300, (), 1)], ["any"])
    before = np.array([[700, 0, 0, 0], [1000, 0, 0, 0]])
    # a 0.3 job on the 700 leaves 400 no 0.6 job can use; on the fresh GPU it leaves 700
    assert choose_shared_gpu(mix, before, np.array([0, 0]), 300, smallest=300) == 1
    # with only 0.3 jobs in the work, the tighter GPU is as good and is taken
    small = TaskMix.from_kinds([(0, 1, 300, (), 10)], ["any"])
    assert choose_shared_gpu(small, before, np.array([0, 0]), 300, smallest=300) == 0
    # a sliver smaller than any waiting fraction is avoided while another GPU has room
    assert choose_shared_gpu(small, np.array([[400, 0], [1000, 0]]), np.array([0, 0]), 300, smallest=300) == 1


def test_a_fraction_leaves_no_room_that_only_the_works_rare_small_jobs_could_fill():
    from engine.packing import TaskMix
    from engine.packing_scores import choose_shared_gpu

    # half the chip's work is 0.47 jobs, a third 0.32, a few 0.16; two 8-GPU nodes with 7 GPUs free,
    # one of them holding a 0.47 job (530 free on its first GPU)
    mix = TaskMix.from_kinds(
        [(0, 1, 470, (), 50), (0, 1, 320, (), 35), (0, 1, 160, (), 2), (0, 1, 1000, (), 13)], ["any"]
    )
    before = np.array([[530] + [1000] * 7, [1000] * 8])
    # a 0.32 job beside the 0.47 would leave 210 that only the rare 0.16 jobs fit: it takes a fresh
    # GPU, and the 530 stays for the next 0.47 job
    assert choose_shared_gpu(mix, before, np.array([0, 0]), 320, smallest=160) == 1
