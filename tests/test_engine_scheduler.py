"""Scheduling scenarios in the Kueue style: given a cluster, queues, running and pending jobs,
the expected admissions, placements, victims and pending reasons. Every cycle is checked by the
invariant checker."""

from __future__ import annotations

import numpy as np

from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import cycle, domains_of, layout_for, running

H100 = "H100-SXM"


def job(job_id, gpus, queue="a", **kw):
    return PendingJob(
        job_id, queue, gpus, chip_types=kw.pop("chips", (H100,)), submitted_at=kw.pop("t", job_id), **kw
    )


def big_queue(name="a", **kw):
    return QueueSpec(name, nominal={H100: kw.pop("nominal", 10_000)}, **kw)


# --- placement --------------------------------------------------------------------------------
def test_a_one_node_job_takes_one_node():
    lay = layout_for()
    result, _ = cycle(lay, [big_queue()], [], [job(1, 8)])
    (a,) = result.admissions
    assert len(domains_of(lay, a.held, "node")) == 1


def test_a_gang_goes_to_the_smallest_domain_that_holds_it():
    lay = layout_for()  # racks of 2 nodes x 8, pods of 2 racks
    result, _ = cycle(lay, [big_queue()], [], [job(1, 16), job(2, 32), job(3, 64)])
    placed = {a.job_id: a for a in result.admissions}
    assert len(domains_of(lay, placed[1].held, "rack")) == 1 and placed[1].domain.startswith("rack")
    assert len(domains_of(lay, placed[2].held, "pod")) == 1 and placed[2].domain.startswith("pod")
    assert len(domains_of(lay, placed[3].held, "datacenter")) == 1


def test_best_fit_keeps_large_blocks_free():
    lay = layout_for()
    # node 0 busy: rack 0 has one free node, rack 1 two. An 8-GPU job goes to rack 0's free node.
    busy = [running(lay, 100, "a", nodes=[0])]
    result, _ = cycle(lay, [big_queue()], busy, [job(1, 8)])
    assert domains_of(lay, result.admissions[0].held, "node") == {1}


def test_a_partial_node_job_goes_to_the_fullest_node_that_fits():
    lay = layout_for()
    busy = [running(lay, 100, "a", gpus=np.arange(8, 14))]  # node 1 has 2 free GPUs
    result, _ = cycle(lay, [big_queue()], busy, [job(1, 2)])
    assert domains_of(lay, result.admissions[0].held, "node") == {1}


def test_a_gang_is_all_or_nothing():
    lay = layout_for(datacenters=1)  # 64 GPUs
    busy = [running(lay, 100, "a", gpus=[0])]
    result, after = cycle(lay, [big_queue()], busy, [job(1, 64, topology="any")])
    assert result.admissions == []
    assert (
        result.pending[1] == "no cluster with 64 free H100-SXM GPUs (largest free block: 63 in the cluster)"
    )
    assert len(after) == 1


def test_the_topology_constraint_is_respected_and_any_spans_datacenters():
    lay = layout_for()  # two datacenters of 64
    result, _ = cycle(lay, [big_queue()], [], [job(1, 24, topology="rack"), job(2, 96, topology="any")])
    assert result.pending[1].startswith("no rack with 24 free H100-SXM GPUs (largest free block: 16 in rack")
    (a,) = result.admissions
    assert a.job_id == 2 and len(domains_of(lay, a.held, "datacenter")) == 2


def test_cordoned_nodes_and_critical_gpus_are_never_used():
    lay = layout_for(datacenters=1, pods_per_dc=1)  # 32 GPUs on 4 nodes
    lay.topo.node_state[0] = 1  # cordoned
    lay.topo.gpu_health[8] = 2  # critical GPU on node 1
    result, _ = cycle(lay, [big_queue()], [], [job(1, 8), job(2, 8), job(3, 8)])
    used = np.concatenate([a.held for a in result.admissions])
    assert len(result.admissions) == 2 and not (used < 16).any()
    assert "no datacenter with 8 free" in result.pending[3]


def test_chip_types_are_tried_in_the_order_given():
    lay = layout_for(datacenters=1, pods_per_dc=1, chips=(H100, "A100-80G"))
    q = QueueSpec("a", nominal={H100: 1000, "A100-80G": 1000})
    busy = [running(lay, 100, "a", nodes=[0, 1, 2, 3])]  # all H100 busy
    result, _ = cycle(lay, [q], busy, [job(1, 8, chips=(H100, "A100-80G"))])
    assert result.admissions[0].chip == "A100-80G"


# --- quota, cohorts, borrowing ------------------------------------------------------------------
def test_quota_without_a_cohort_is_a_hard_limit():
    lay = layout_for()
    result, _ = cycle(lay, [big_queue(nominal=16)], [], [job(1, 16), job(2, 8)])
    assert [a.job_id for a in result.admissions] == [1]
    assert result.pending[2].startswith(
        "quota of queue a exhausted for H100-SXM: 16 of 16 in use, needs 8; the queue is in no cohort, "
        "so it cannot borrow"
    )


def test_a_queue_borrows_idle_quota_from_its_cohort():
    lay = layout_for()
    queues = [QueueSpec("a", "research", nominal={H100: 16}), QueueSpec("b", "research", nominal={H100: 48})]
    result, _ = cycle(lay, queues, [], [job(1, 32)])
    (a,) = result.admissions
    assert a.borrowed == 16


def test_borrowing_and_lending_limits_hold():
    lay = layout_for()
    queues = [
        QueueSpec("a", "research", nominal={H100: 16}, borrowing_limit={H100: 8}),
        QueueSpec("b", "research", nominal={H100: 48}, lending_limit={H100: 4}),
        QueueSpec("c", "research", nominal={H100: 8}),
    ]
    # The cohort pool holds a's 16, b's lendable 4 and c's 8: 28 GPUs; b keeps 44 for itself.
    result, _ = cycle(lay, queues, [], [job(1, 32), job(2, 24)])
    assert result.pending[1] == "queue a would borrow 16 H100-SXM GPUs, above its borrowing limit of 8"
    admitted = {a.job_id: a for a in result.admissions}
    assert admitted[2].borrowed == 8  # a uses 24 of the pool's 28
    # c's own 8 are partly lent to a now: only 4 are left in the pool
    _, after = cycle(lay, queues, [], [job(2, 24)])
    again, _ = cycle(lay, queues, after, [job(3, 8, queue="c"), job(4, 48, queue="b")])
    assert again.pending[3].startswith("queue c's nominal H100-SXM quota (8) is lent to other queues")
    # b's 44 guaranteed GPUs are its own, and the 4 it lends are still free
    assert [a.job_id for a in again.admissions] == [4] and again.admissions[0].borrowed == 0
    # in one cycle, jobs within their queue's nominal quota go first: a's borrowing job finds the
    # pool emptied by c's and b's own work
    together, _ = cycle(lay, queues, [], [job(2, 24), job(3, 8, queue="c"), job(4, 48, queue="b")])
    assert sorted(a.job_id for a in together.admissions) == [3, 4]
    assert "cohort research has 16 to lend" in together.pending[2]  # a's own 16: it needs 24


def test_a_queue_reclaims_lent_quota_by_preempting_the_borrower():
    lay = layout_for()
    queues = [
        QueueSpec("a", "research", nominal={H100: 32}),
        QueueSpec("b", "research", nominal={H100: 96}, reclaim_within_cohort="any"),
    ]
    # a runs 96 GPUs (64 borrowed from b); b now wants 64 of its own quota
    busy = [
        running(lay, 10, "a", gpus=np.arange(0, 32), started_at=0, checkpoint=50),
        running(lay, 11, "a", gpus=np.arange(32, 64), started_at=0, checkpoint=90),
        running(lay, 12, "a", gpus=np.arange(64, 96), started_at=0, checkpoint=10),
    ]
    result, _ = cycle(lay, queues, busy, [job(1, 64, queue="b", topology="any")], now=100)
    (a,) = result.admissions
    # needs 64 in the quota: a must drop to its nominal 32 and b gets 64 of the cluster's 128
    victims = sorted(p.job_id for p in result.preemptions)
    assert victims == [10, 11]  # the least work since the last checkpoint (12 lost 90 s)
    assert all("queue b reclaims H100-SXM quota lent to queue a" in p.reason for p in result.preemptions)
    assert sorted(a.preempted) == [10, 11]


def test_without_a_reclaim_policy_the_owner_waits_with_a_reason():
    lay = layout_for()
    queues = [QueueSpec("a", "research", nominal={H100: 32}), QueueSpec("b", "research", nominal={H100: 96})]
    busy = [running(lay, 10, "a", gpus=np.arange(0, 96))]
    result, _ = cycle(lay, queues, busy, [job(1, 64, queue="b", topology="any")])
    assert result.preemptions == []
    assert "nominal H100-SXM quota (96) is lent to other queues of cohort research" in result.pending[1]


def test_lower_priority_reclaim_spares_equal_priority_work():
    lay = layout_for()
    queues = [
        QueueSpec("a", "research", nominal={H100: 32}),
        QueueSpec("b", "research", nominal={H100: 96}, reclaim_within_cohort="lower_priority"),
    ]
    busy = [running(lay, 10, "a", gpus=np.arange(0, 128), priority=5)]
    result, _ = cycle(lay, queues, busy, [job(1, 32, queue="b", priority=5, topology="any")])
    assert result.preemptions == [] and 1 in result.pending


def test_within_queue_preemption_evicts_lower_priority_jobs_only():
    lay = layout_for(datacenters=1)
    queues = [big_queue(within_queue="lower_priority")]
    busy = [
        running(lay, 10, "a", nodes=[0, 1, 2, 3], priority=1),
        running(lay, 11, "a", nodes=[4, 5, 6, 7], priority=9),
    ]
    result, _ = cycle(lay, queues, busy, [job(1, 32, priority=5)])
    assert [p.job_id for p in result.preemptions] == [10]
    assert result.preemptions[0].reason == "preempted by higher-priority job 1 in queue a"


def test_victims_free_a_placeable_block_in_one_domain():
    lay = layout_for(datacenters=1)  # racks: nodes (0,1) (2,3) (4,5) (6,7)
    queues = [big_queue(within_queue="lower_priority")]
    busy = [
        running(lay, 10, "a", nodes=[0], priority=1, checkpoint=None),  # rack 0
        running(lay, 11, "a", nodes=[2], priority=1, checkpoint=None),  # rack 1
        running(lay, 12, "a", nodes=[4, 5], priority=1, started_at=50),  # rack 2, least lost work
        running(lay, 13, "a", nodes=[1, 3, 6, 7], priority=1),
    ]
    # a 16-GPU job that must fit in one rack: evicting 10 and 11 frees 16 GPUs but in two racks;
    # only 12 frees a whole rack.
    result, _ = cycle(lay, queues, busy, [job(1, 16, priority=5, topology="rack")], now=100)
    assert [p.job_id for p in result.preemptions] == [12]
    assert domains_of(lay, result.admissions[0].held, "node") == {4, 5}


def test_a_stopped_queue_admits_nothing_and_keeps_running_work():
    lay = layout_for()
    q = big_queue(stopped=True)
    busy = [running(lay, 10, "a", nodes=[0])]
    result, after = cycle(lay, [q], busy, [job(1, 8)])
    assert result.admissions == [] and result.pending[1] == "queue a is stopped"
    assert [j.id for j in after] == [10]


def test_an_unknown_queue_is_a_reason_not_a_crash():
    lay = layout_for()
    result, _ = cycle(lay, [big_queue()], [], [job(1, 8, queue="ghost")])
    assert result.pending[1] == "queue ghost does not exist"


# --- ordering -------------------------------------------------------------------------------------
def test_priority_then_fair_share_then_submit_time():
    lay = layout_for(datacenters=1, pods_per_dc=1)  # 32 GPUs
    queues = [QueueSpec("a", nominal={H100: 100}), QueueSpec("b", nominal={H100: 100}, weight=1.0)]
    busy = [running(lay, 10, "a", nodes=[0])]  # a already uses 8, b nothing
    pending = [
        job(1, 8, queue="a", t=1),
        job(2, 8, queue="b", t=2),
        job(3, 8, queue="a", t=3, priority=9),
        job(4, 8, queue="b", t=4),
    ]
    result, _ = cycle(lay, queues, busy, pending)
    # 24 free: job 3 first (priority), then b (lower share) job 2, then b again? b's share is now 8
    # and a's 16, so job 4 before job 1.
    assert [a.job_id for a in result.admissions] == [3, 2, 4]
    assert "no datacenter with 8 free" in result.pending[1]


# --- reservation and backfill ----------------------------------------------------------------------
def test_a_blocked_gang_reserves_and_short_jobs_backfill():
    lay = layout_for(datacenters=1)  # 64 GPUs
    busy = [
        running(lay, 10, "a", nodes=[0, 1, 2, 3], end=1000),
        running(lay, 11, "a", nodes=[4, 5], end=5000),
    ]  # 16 free (nodes 6, 7)
    pending = [
        job(1, 48, priority=9),  # needs nodes 0-3 (free at t=1000) + 16 more
        job(2, 8, estimated_duration_s=500),  # ends at 500 < 1000: may backfill
        job(3, 8, estimated_duration_s=5000),  # would delay the big job
    ]
    result, _ = cycle(lay, [big_queue()], busy, pending, now=0)
    (res,) = result.reservations
    assert res.job_id == 1 and res.start_at == 1000 and len(res.held) == 48
    assert result.pending[1].startswith("waiting for reservation: 48 H100-SXM GPUs in")
    # the run's clock starts at 0: the time is named in hours into it (1000 s: hour 0.3)
    assert result.pending[1].endswith("expected free at hour 0.3 of the run")
    assert result.pending[1].kind == "reservation" and result.pending[1].facts["free_in_s"] == 1000
    admitted = {a.job_id: a for a in result.admissions}
    assert 2 in admitted and admitted[2].backfilled
    assert (
        "reserved for a larger job starting at hour 0.3 of the run; this job would not end before it"
        in result.pending[3]
    )
    assert (
        result.pending[3].kind == "reservation" and result.pending[3].facts["reservation_starts_in_s"] == 1000
    )


def test_a_reservation_reason_names_its_time_and_does_not_count_down():
    """On the wall clock the reasons name the UTC minute the reserved GPUs are expected free; a
    minute later, nothing having changed, both sentences are the same (a countdown in seconds
    would be stale between the cycles that rewrite it)."""
    lay = layout_for(datacenters=1)
    t0 = 1_796_000_000.0  # 2026-11-30 00:53:20 UTC
    busy = [
        running(lay, 10, "a", nodes=[0, 1, 2, 3], end=t0 + 1000),
        running(lay, 11, "a", nodes=[4, 5], end=t0 + 5000),
    ]
    pending = [job(1, 48, priority=9), job(3, 8, estimated_duration_s=5000)]
    first, _ = cycle(lay, [big_queue()], busy, pending, now=t0)
    later, _ = cycle(lay, [big_queue()], busy, pending, now=t0 + 60)
    assert first.pending[1].endswith("expected free at 2026-11-30 01:10 UTC")
    assert "reserved for a larger job starting at 2026-11-30 01:10 UTC" in first.pending[3]
    assert first.pending[1].facts["free_at"] == t0 + 1000
    assert first.pending[3].facts["reservation_starts_at"] == t0 + 1000
    assert later.pending == first.pending
    assert later.pending[1].facts["free_in_s"] == 940


def test_every_pending_reason_has_its_kind_and_facts():
    """The scheduler says what keeps each job pending as a kind with the facts of its sentence;
    metrics and the API read the kind and never parse the words."""
    lay = layout_for()  # two datacenters of 64 GPUs: racks of 16, pods of 32
    queues = [big_queue(), QueueSpec("small", nominal={H100: 8}), big_queue("off", stopped=True)]
    pending = [
        job(1, 24, topology="rack"),  # no rack holds 24: topology
        job(2, 16, queue="small"),  # 16 of 8 GPUs of quota, no cohort: quota
        job(3, 8, queue="off"),  # its queue is stopped
        job(4, 8, queue="nowhere"),  # no such queue
        job(5, 200, topology="any"),  # more than the fleet: capacity
    ]
    result, _ = cycle(lay, queues, [], pending)
    kinds = {job_id: (reason.kind, reason.facts) for job_id, reason in result.pending.items()}
    assert kinds[1] == ("topology", {**kinds[1][1], "level": "rack", "gpus": 24, "chip": H100})
    assert kinds[2][0] == "quota" and kinds[2][1]["queue"] == "small" and kinds[2][1]["needs"] == 16
    assert kinds[3] == ("stopped", {"queue": "off"})
    assert kinds[4] == ("other", {"queue": "nowhere"})
    assert kinds[5][0] == "capacity" and kinds[5][1]["largest_free"] < 200
    assert str(result.pending[2]).startswith("quota of queue small exhausted for H100-SXM: 0 of 8 in use")


# --- start limit ------------------------------------------------------------------------------


def test_a_cycle_starts_at_most_its_limit_and_says_why_the_rest_wait():
    from engine.scheduler import SchedulerConfig

    lay = layout_for()
    pending = [job(1, 8), job(2, 16), job(3, 8), job(4, 8)]
    result, _ = cycle(lay, [big_queue()], [], pending, config=SchedulerConfig(max_start_gpus=20))
    # jobs 1 and 2 start (24 GPUs: the job that crosses the limit still starts whole); 3 and 4 wait
    assert [a.job_id for a in result.admissions] == [1, 2]
    assert result.start_limited and result.considered == 4
    assert result.pending[3] == "waiting for the next cycle: this one started 24 GPUs, its limit is 20"
    assert set(result.pending) == {3, 4}
    unlimited, _ = cycle(lay, [big_queue()], [], pending)
    assert len(unlimited.admissions) == 4 and not unlimited.start_limited


# --- the fabric's congestion --------------------------------------------------------------------
def test_a_gang_that_spans_nodes_goes_to_a_pod_with_clear_links_first():
    lay = layout_for(datacenters=1, pods_per_dc=3, racks=2, nodes_per_rack=2)
    # pod 0 is the best fit (a node of it is busy), but its fabric is congested
    busy = [running(lay, 100, "a", nodes=[0])]
    congested = np.array([True, False, False])
    result, _ = cycle(lay, [big_queue()], busy, [job(1, 16)], congested_pods=congested)
    (a,) = result.admissions
    pods = domains_of(lay, a.held, "pod")
    assert pods != {0} and len(pods) == 1 and not a.congested
    calm, _ = cycle(lay, [big_queue()], busy, [job(1, 16)])  # without congestion: the best fit
    assert domains_of(lay, calm.admissions[0].held, "pod") == {0}


def test_when_every_pod_is_congested_the_gang_still_starts_and_says_so():
    lay = layout_for(datacenters=1, pods_per_dc=2, racks=2, nodes_per_rack=2)
    result, _ = cycle(lay, [big_queue()], [], [job(1, 16), job(2, 8)], congested_pods=np.array([True, True]))
    first, second = result.admissions
    assert first.congested  # spans nodes of a congested pod: no clear one had room
    assert not second.congested  # one node: its traffic stays on the node


def test_a_gang_reclaiming_quota_from_hundreds_of_jobs_charges_each_victim_a_few_times(monkeypatch):
    """The GPUs are free, the cohort's quota is not: the gang must reclaim 192 one-GPU borrowers
    that free no GPU it needs. Choosing them takes each one's quota back once (and once more where
    it is dropped); asking the quota with every victim chosen so far charged again was quadratic:
    an 8,192-GPU gang over 1,000 jobs took 25 s of a live cycle."""
    from engine.quota import QuotaBook

    lay = layout_for(pods_per_dc=6, racks=4, nodes_per_rack=4, datacenters=1)  # 768 GPUs
    queues = [
        QueueSpec("a", "research", nominal={H100: 64}),
        QueueSpec("b", "research", nominal={H100: 448}, reclaim_within_cohort="any"),
    ]
    busy = [running(lay, 1000 + g, "a", gpus=[g], checkpoint=g % 50) for g in range(448)]  # 384 borrowed
    calls = {"add": 0}
    add = QuotaBook.add

    def counted(self, *args):
        calls["add"] += 1
        return add(self, *args)

    monkeypatch.setattr(QuotaBook, "add", counted)
    result, _ = cycle(lay, queues, busy, [job(1, 256, queue="b", topology="any")], now=100)
    (admitted,) = result.admissions
    assert len(admitted.held) == 256
    # the cohort's 512 GPUs of quota: a keeps 256 (its 64 and 192 still lent), b takes its 256
    assert len(result.preemptions) == 192
    assert all(p.reason.startswith("preempted by job 1: queue b reclaims") for p in result.preemptions)
    assert calls["add"] < 3 * len(busy)
