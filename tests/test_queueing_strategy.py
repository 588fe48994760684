"""A big job does not starve behind its own queue's small jobs: best effort with a bounded wait
(the default) holds the queue's quota for a job blocked by quota once it has waited long enough;
strict FIFO holds the queue for any blocked job."""

from __future__ import annotations

from dataclasses import replace

from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import cycle, layout_for

SMALL_S = 1_800.0  # each small job runs half an hour
PERIOD_S = 60.0


def _replay(queue: QueueSpec, minutes: int = 240):
    """A 512-GPU queue full of 8-GPU jobs ending at staggered times; a 256-GPU job at priority 50
    arrives, then a stream of long 8-GPU jobs (one a minute). Returns (minute the big job started
    or None, its reason at the end or at its start)."""
    lay = layout_for(pods_per_dc=4, racks=4, nodes_per_rack=4, datacenters=2)  # 1,024 GPUs
    running, ends, next_id = [], {}, 1000
    small = [PendingJob(i, queue.name, 8, chip_types=("H100-SXM",), submitted_at=-10.0) for i in range(64)]
    result, running = cycle(lay, [queue], [], small, now=-10.0)
    for k, a in enumerate(result.admissions):
        ends[a.job_id] = k * SMALL_S / 64  # the first 64 end over the first half hour
    pending = [PendingJob(1, queue.name, 256, priority=50, chip_types=("H100-SXM",), submitted_at=0.0)]
    reason = ""
    for minute in range(minutes):
        now = minute * PERIOD_S
        running = [j for j in running if ends.get(j.id, float("inf")) > now]
        for _ in range(2):  # more small work arrives than finishes
            pending.append(PendingJob(next_id, queue.name, 8, chip_types=("H100-SXM",), submitted_at=now))
            next_id += 1
        result, running = cycle(lay, [queue], running, pending, now=now)
        for a in result.admissions:
            ends[a.job_id] = now + SMALL_S
        started = {a.job_id for a in result.admissions}
        if 1 in started:
            return minute, reason
        reason = result.pending[1]
        pending = [p for p in pending if p.id not in started]
    return None, reason


def test_without_a_bounded_wait_the_big_job_starves():
    started, reason = _replay(QueueSpec("train", nominal={"H100-SXM": 512}, head_wait_s=None))
    assert started is None
    assert reason.startswith("quota of queue train exhausted for H100-SXM")


def test_the_default_bounded_wait_holds_the_quota_and_the_big_job_starts():
    queue = QueueSpec("train", nominal={"H100-SXM": 512})
    assert queue.queueing == "best_effort" and queue.head_wait_s == 600.0
    started, reason = _replay(queue)
    assert started is not None
    # it waited out the bounded wait, then half of the queue's small jobs ended (they run 30 min)
    assert 10 <= started <= 10 + 31
    assert "past 600 s: queue train holds its quota for it" in reason


def test_the_wait_shows_in_the_reason_and_followers_say_whom_they_wait_for():
    lay = layout_for(pods_per_dc=1, datacenters=1)  # 32 GPUs
    queue = QueueSpec("train", nominal={"H100-SXM": 16})
    full = [PendingJob(i, "train", 8, chip_types=("H100-SXM",), submitted_at=0.0) for i in (1, 2)]
    _, running = cycle(lay, [queue], [], full, now=0.0)
    big = PendingJob(10, "train", 16, priority=5, chip_types=("H100-SXM",), submitted_at=0.0)
    little = PendingJob(11, "train", 8, chip_types=("H100-SXM",), submitted_at=100.0)
    early, _ = cycle(lay, [queue], running, [big, little], now=300.0)
    assert early.pending[10].endswith("(waited 300 s; after 600 s queue train holds its quota for it)")
    late, _ = cycle(lay, [queue], running, [big, little], now=700.0)
    assert late.pending[10].endswith("(waited 700 s, past 600 s: queue train holds its quota for it)")
    assert late.pending[11] == (
        "waiting behind job 10 of queue train, pending 700 s (past the queue's bounded wait of 600 s)"
    )


def test_a_held_queue_still_admits_jobs_for_other_chip_types():
    lay = layout_for(pods_per_dc=1, datacenters=1, chips=("H100-SXM", "A100-80G"))
    queue = QueueSpec("train", nominal={"H100-SXM": 16, "A100-80G": 16})
    full = [PendingJob(i, "train", 8, chip_types=("H100-SXM",)) for i in (1, 2)]
    _, running = cycle(lay, [queue], [], full, now=0.0)
    big = PendingJob(10, "train", 16, priority=5, chip_types=("H100-SXM",))
    other = PendingJob(11, "train", 8, chip_types=("A100-80G",), submitted_at=500.0)
    result, _ = cycle(lay, [queue], running, [big, other], now=900.0)
    assert [a.job_id for a in result.admissions] == [11]


def test_a_job_its_queue_could_never_hold_does_not_block_the_queue():
    lay = layout_for(pods_per_dc=1, datacenters=1)
    queue = QueueSpec("train", nominal={"H100-SXM": 16})
    huge = PendingJob(10, "train", 24, priority=5, chip_types=("H100-SXM",))  # above its quota, no cohort
    small = PendingJob(11, "train", 8, chip_types=("H100-SXM",), submitted_at=500.0)
    result, _ = cycle(lay, [queue], [], [huge, small], now=900.0)
    assert [a.job_id for a in result.admissions] == [11]


def test_strict_fifo_holds_the_queue_behind_any_blocked_job():
    lay = layout_for(pods_per_dc=1, datacenters=1)
    strict = QueueSpec("train", nominal={"H100-SXM": 32}, queueing="strict_fifo")
    full = [PendingJob(i, "train", 8, chip_types=("H100-SXM",)) for i in (1, 2, 3)]
    _, running = cycle(lay, [strict], [], full, now=0.0)
    big = PendingJob(10, "train", 16, priority=5, chip_types=("H100-SXM",))
    small = PendingJob(11, "train", 8, chip_types=("H100-SXM",), submitted_at=1.0)
    result, _ = cycle(lay, [strict], running, [big, small], now=2.0)
    assert not result.admissions
    assert result.pending[11] == "waiting behind job 10: queue train admits its jobs in strict order"
    assert result.pending[11].kind == "ordering" and result.pending[11].facts["behind_job"] == 10
    best_effort = replace(strict, queueing="best_effort")
    result, _ = cycle(lay, [best_effort], running, [big, small], now=2.0)
    assert [a.job_id for a in result.admissions] == [11]  # best effort lets it pass (not waited yet)


def test_the_live_cycle_holds_a_queue_for_its_long_waiting_job(queues, operator_client):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.cycle import run_cycle
    from scheduling.models import Job

    legacy = queues["legacy"]  # 12 A100 GPUs of quota, no cohort
    now = timezone.now()

    def job(gpus, priority=0, ago_s=0.0):
        return Job.objects.create(
            queue=legacy,
            gpus=gpus,
            priority=priority,
            chip_types=["A100-80G"],
            topology="datacenter",
            submitted_at=now - timedelta(seconds=ago_s),
        )

    first = job(8, ago_s=900)
    run_cycle(now=now)
    big = job(8, priority=5, ago_s=700)  # 8 + 8 > 12: blocked by quota for 700 s
    small = job(4, ago_s=10)  # would fit in the 4 left
    run_cycle(now=now)
    for j in (first, big, small):
        j.refresh_from_db()
    assert first.state == "running" and big.state == "pending" and small.state == "pending"
    assert "past 600 s: queue legacy holds its quota for it" in big.pending_reason
    assert small.pending_reason.startswith(f"waiting behind job {big.pk} of queue legacy")
    # an operator turns the bounded wait off: the small job passes at the next cycle
    response = operator_client.patch(f"/api/v1/queues/{legacy.pk}/", {"head_wait_s": None}, format="json")
    assert response.status_code == 200, response.content
    run_cycle(now=now)
    small.refresh_from_db()
    assert small.state == "running"


def test_a_bad_queueing_strategy_is_refused_by_name(queues, operator_client):
    legacy = queues["legacy"]
    response = operator_client.patch(
        f"/api/v1/queues/{legacy.pk}/", {"queueing_strategy": "lifo", "head_wait_s": -1}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()) >= {"queueing_strategy", "head_wait_s"}
    legacy.refresh_from_db()
    assert legacy.queueing_strategy == "best_effort" and legacy.head_wait_s == 600
