"""Scheduling cases as a table, in the style of Kueue's scheduler tests: each named case gives a
cluster, queues, running and pending jobs, and expects exactly which jobs are admitted (and the
smallest domain each gang landed in), which jobs are preempted, which gang holds a reservation,
and what the pending reasons say. Every cycle also passes the invariant checker.

Cluster shape (``layout_for``): per datacenter ``pods`` pods per chip type, each pod ``racks``
racks of ``nodes`` nodes of 8 GPUs; node n of the first datacenter holds GPUs 8n .. 8n+7."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from engine.placement import LEVELS
from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import cycle, domains_of, layout_for, running

H100, H200 = "H100-SXM", "H200"


def q(name="a", cohort=None, **kw) -> QueueSpec:
    nominal = kw.pop("nominal", {H100: 10_000})
    return QueueSpec(name, cohort, nominal=nominal, **kw)


def j(job_id, gpus, queue="a", **kw) -> PendingJob:
    return PendingJob(
        job_id, queue, gpus, chip_types=kw.pop("chips", (H100,)), submitted_at=kw.pop("t", job_id), **kw
    )


@dataclass
class Run:
    """A running job on whole nodes of the first datacenter."""

    id: int
    queue: str
    nodes: tuple[int, ...]
    priority: int = 0
    started_at: float = 0.0
    end: float | None = None
    checkpoint: float | None = None
    chip: str = H100


@dataclass
class Case:
    name: str
    queues: list[QueueSpec]
    pending: list[PendingJob]
    running: list[Run] = field(default_factory=list)
    cluster: dict = field(default_factory=dict)
    now: float = 0.0
    admitted: dict[int, str] = field(default_factory=dict)  # job -> smallest domain holding it
    victims: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)  # job -> text its pending reason contains


CASES = [
    Case(
        "one node for an 8-GPU job",
        [q()],
        [j(1, 8)],
        admitted={1: "node"},
    ),
    Case(
        "gangs take the smallest domain that holds them",
        [q()],
        [j(1, 16), j(2, 32), j(3, 64)],
        admitted={1: "rack", 2: "pod", 3: "datacenter"},
    ),
    Case(
        "a gang larger than any datacenter waits unless it may span datacenters",
        [q()],
        [j(1, 96), j(2, 96, topology="any")],
        admitted={2: "region"},
        reasons={1: "no datacenter with 96 free H100-SXM GPUs"},
    ),
    Case(
        "a gang is all or nothing: 40 GPUs do not start on the 32 left",
        [q()],
        [j(1, 40, topology="any")],
        running=[Run(10, "a", tuple(range(12)))],  # 96 of 128 busy
        reasons={1: "40 free H100-SXM GPUs"},
    ),
    Case(
        "a node constraint no node can meet",
        [q()],
        [j(1, 16, topology="node")],
        reasons={1: "no node with 16 free H100-SXM GPUs"},
    ),
    Case(
        "chip types are tried in the order given",
        [q(nominal={H100: 100, H200: 100})],
        [j(1, 64, chips=(H200, H100)), j(2, 64, chips=(H200, H100))],
        cluster={"chips": (H100, H200), "datacenters": 1},
        admitted={1: "datacenter", 2: "datacenter"},
    ),
    Case(
        "quota without a cohort is a hard limit",
        [q(nominal={H100: 16})],
        [j(1, 16), j(2, 8)],
        admitted={1: "rack"},
        reasons={2: "quota of queue a exhausted for H100-SXM: 16 of 16 in use, needs 8"},
    ),
    Case(
        "a queue borrows idle quota from its cohort",
        [q("a", "research", nominal={H100: 16}), q("b", "research", nominal={H100: 48})],
        [j(1, 32)],
        admitted={1: "pod"},
    ),
    Case(
        "the borrowing limit holds",
        [
            q("a", "research", nominal={H100: 16}, borrowing_limit={H100: 8}),
            q("b", "research", nominal={H100: 48}),
        ],
        [j(1, 32), j(2, 24)],
        admitted={2: "pod"},  # 24 of the cohort's 64: 16 of its own and 8 borrowed
        reasons={1: "above its borrowing limit of 8"},
    ),
    Case(
        "an owner reclaims lent quota, evicting the borrower with the least work since its checkpoint",
        [
            q("a", "research", nominal={H100: 32}),
            q("b", "research", nominal={H100: 96}, reclaim_within_cohort="any"),
        ],
        [j(1, 64, queue="b", topology="any")],
        running=[
            Run(10, "a", (0, 1, 2, 3), checkpoint=50),
            Run(11, "a", (4, 5, 6, 7), checkpoint=90),
            Run(12, "a", (8, 9, 10, 11), checkpoint=10),
        ],
        now=100,
        admitted={1: "datacenter"},
        victims=[10, 11],
    ),
    Case(
        "without a reclaim policy the owner waits and says why",
        [q("a", "research", nominal={H100: 32}), q("b", "research", nominal={H100: 96})],
        [j(1, 64, queue="b", topology="any")],
        running=[Run(10, "a", tuple(range(12)))],
        reasons={1: "nominal H100-SXM quota (96) is lent to other queues of cohort research"},
    ),
    Case(
        "within a queue only lower-priority work is evicted",
        [q(within_queue="lower_priority")],
        [j(1, 32, priority=5)],
        running=[Run(10, "a", (0, 1, 2, 3), priority=1), Run(11, "a", (4, 5, 6, 7), priority=9)],
        cluster={"datacenters": 1},
        admitted={1: "pod"},
        victims=[10],
    ),
    Case(
        "victims free a placeable block in one rack, not the most GPUs",
        [q(within_queue="lower_priority")],
        [j(1, 16, priority=5, topology="rack")],
        running=[
            Run(10, "a", (0,), priority=1),
            Run(11, "a", (2,), priority=1),
            Run(12, "a", (4, 5), priority=1, started_at=50),
            Run(13, "a", (1, 3, 6, 7), priority=1),
        ],
        cluster={"datacenters": 1},
        now=100,
        admitted={1: "rack"},
        victims=[12],
    ),
    Case(
        "a stopped queue admits nothing",
        [q(stopped=True), q("b")],
        [j(1, 8), j(2, 8, queue="b")],
        admitted={2: "node"},
        reasons={1: "queue a is stopped"},
    ),
    Case(
        "a chip type the queue has no quota for",
        [q(nominal={H200: 64})],
        [j(1, 8)],
        cluster={"chips": (H100, H200)},
        reasons={1: "quota of queue a exhausted for H100-SXM"},
    ),
    Case(
        "priority first, then the queue with the smaller fair share",
        [q("a", nominal={H100: 100}), q("b", nominal={H100: 100})],
        [j(1, 8, "a", t=1), j(2, 8, "b", t=2), j(3, 8, "a", t=3, priority=9), j(4, 8, "b", t=4)],
        running=[Run(10, "a", (0,))],
        cluster={"datacenters": 1, "pods_per_dc": 1},  # 32 GPUs, 24 free
        admitted={3: "node", 2: "node", 4: "node"},
        reasons={1: "no datacenter with 8 free"},
    ),
    Case(
        "a blocked gang reserves; a short job backfills, a long one waits",
        [q()],
        [j(1, 48, priority=9), j(2, 8, estimated_duration_s=500), j(3, 8, estimated_duration_s=5000)],
        running=[Run(10, "a", (0, 1, 2, 3), end=1000), Run(11, "a", (4, 5), end=5000)],
        cluster={"datacenters": 1},
        admitted={2: "node"},
        reserved=[1],
        reasons={1: "waiting for reservation: 48 H100-SXM GPUs", 3: "this job would not end before it"},
    ),
]


def _smallest_level(lay, gpus) -> str:
    for level in LEVELS:
        if len(domains_of(lay, gpus, level)) == 1:
            return level
    raise AssertionError("an admission spans more than the cluster")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scheduling_case(case: Case):
    lay = layout_for(**case.cluster)
    busy = [
        running(
            lay,
            r.id,
            r.queue,
            nodes=list(r.nodes),
            chip=r.chip,
            priority=r.priority,
            started_at=r.started_at,
            end=r.end,
            checkpoint=r.checkpoint,
        )
        for r in case.running
    ]
    result, _ = cycle(lay, case.queues, busy, case.pending, now=case.now)

    landed = {a.job_id: _smallest_level(lay, np.asarray(a.held)) for a in result.admissions}
    assert landed == case.admitted
    assert sorted(p.job_id for p in result.preemptions) == sorted(case.victims)
    assert [r.job_id for r in result.reservations] == case.reserved
    for job_id, text in case.reasons.items():
        assert text in result.pending.get(job_id, ""), (job_id, result.pending.get(job_id))
    # every job not admitted says why, and no admitted job has a pending reason
    for job in case.pending:
        if job.id in landed:
            assert job.id not in result.pending
        else:
            assert result.pending.get(job.id), f"job {job.id} is pending without a reason"
