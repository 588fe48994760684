"""The earliest start a reservation or a span decision uses is found by counting releases per
domain; it must agree with giving the ending jobs' GPUs back to a copy of the pool one job at a
time and asking the placement (FreePool.find) after each."""

from __future__ import annotations

import numpy as np
import pytest

from engine.scheduler import SchedulerConfig
from engine.steps.reservation import earliest, ending_jobs
from engine.steps.state import CycleState
from engine.workload import PendingJob, QueueSpec, RunningJob
from tests.engine_helpers import layout_for

H100 = "H100-SXM"
C = 1  # H100's index among the snapshot's chip types


def _state(seed: int):
    """A 2-datacenter cluster of 512 GPUs, mostly busy with jobs of 1-64 GPUs that end at random
    times, some nodes cordoned and some GPUs already reserved."""
    rng = np.random.default_rng(seed)
    lay = layout_for(datacenters=2, pods_per_dc=2, racks=4, nodes_per_rack=4)  # 512 GPUs
    topo = lay.topo
    free = list(rng.permutation(topo.num_gpus))
    running = []
    while len(free) > rng.integers(0, 60):
        n = int(min(len(free), rng.choice([1, 2, 8, 16, 64])))
        gpus = np.sort(np.array([free.pop() for _ in range(n)], dtype=np.int64))
        end = float(rng.choice([rng.uniform(10, 5000), 300.0]))  # ties on purpose
        running.append(RunningJob(1000 + len(running), "a", gpus, H100, 0, 0.0, end, 0.0))
    s = CycleState(lay, [QueueSpec("a", nominal={H100: 10_000})], running, [], 0.0, SchedulerConfig())
    cordoned = rng.random(topo.num_nodes) < 0.1
    s.schedulable &= ~cordoned[topo.gpu_node]
    reserved = rng.random(topo.num_gpus) < 0.05
    s.reserved |= reserved & ~s.pools.open.free
    assert s.topo.chip_names[C] == H100 and s.topo.num_gpus == 512
    return s


def _one_at_a_time(s: CycleState, gang: int, level: int):
    """The reference: the soonest start found by giving back one ending job at a time."""
    ending, releasable = ending_jobs(s, C)
    trial = s.pools.open.copy()
    usable = s.schedulable & ~s.reserved
    for job, gpus in zip(ending, releasable, strict=True):
        trial.give(gpus[usable[gpus]])
        where = trial.find(C, gang, level)
        if where is not None:
            return job.estimated_end, where
    return None


@pytest.mark.parametrize("seed", range(40))
def test_the_counted_search_finds_the_same_start_as_giving_back_job_by_job(seed):
    s = _state(seed)
    rng = np.random.default_rng(seed + 100)
    for _ in range(6):
        gang = int(rng.choice([16, 40, 64, 100, 128, 200, 256, 400, 500]))
        level = int(rng.integers(1, 5))
        if s.pools.open.find(C, gang, level) is not None:
            continue  # it fits now: no reservation is asked for
        job = PendingJob(1, "a", gang, chip_types=(H100,))
        expected = _one_at_a_time(s, gang, level)
        found = earliest(s, job, C, level)
        if expected is None:
            assert found is None
            continue
        assert found is not None
        start, trial, where = found
        assert start == max(expected[0], 0.0)
        assert where == expected[1]
        assert trial.find(C, gang, level) == where
