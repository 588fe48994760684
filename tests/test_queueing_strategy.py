"""A big job does not starve behind its own queue's small jobs. Backfill (the default) reserves
the quota a job blocked by quota waits for at once: later jobs use it only if they end before the
blocked job's expected start. Best effort with a bounded wait holds the queue's quota for it once
it has waited long enough; strict FIFO holds the queue for any blocked job."""

from __future__ import annotations

from dataclasses import replace

import pytest

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
    started, reason = _replay(
        QueueSpec("train", nominal={"H100-SXM": 512}, queueing="best_effort", head_wait_s=None)
    )
    assert started is None
    assert reason.startswith("quota of queue train exhausted for H100-SXM")


def test_the_bounded_wait_holds_the_quota_and_the_big_job_starts():
    queue = QueueSpec("train", nominal={"H100-SXM": 512}, queueing="best_effort")
    assert queue.head_wait_s == 600.0
    started, reason = _replay(queue)
    assert started is not None
    # it waited out the bounded wait, then half of the queue's small jobs ended (they run 30 min)
    assert 10 <= started <= 10 + 31
    assert "past 600 s: queue train holds its quota for it" in reason


def test_the_wait_shows_in_the_reason_and_followers_say_whom_they_wait_for():
    lay = layout_for(pods_per_dc=1, datacenters=1)  # 32 GPUs
    queue = QueueSpec("train", nominal={"H100-SXM": 16}, queueing="best_effort")
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
    queue = QueueSpec("train", nominal={"H100-SXM": 16, "A100-80G": 16}, queueing="best_effort")
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


def _a100_job(queue, now, gpus, priority=0, ago_s=0.0, hours=None):
    """A job of ``queue`` on A100s in one datacenter, submitted ``ago_s`` before ``now``."""
    from datetime import timedelta

    from scheduling.models import Job

    return Job.objects.create(
        queue=queue,
        gpus=gpus,
        priority=priority,
        chip_types=["A100-80G"],
        topology="datacenter",
        submitted_at=now - timedelta(seconds=ago_s),
        estimated_duration_s=hours * 3600 if hours else None,
    )


def test_the_live_cycle_holds_a_queue_for_its_long_waiting_job(queues, operator_client):

    from django.utils import timezone

    from scheduling.cycle import run_cycle

    legacy = queues["legacy"]  # 12 A100 GPUs of quota, no cohort
    legacy.queueing_strategy = "best_effort"
    legacy.save()
    now = timezone.now()

    def job(gpus, priority=0, ago_s=0.0):
        return _a100_job(legacy, now, gpus, priority, ago_s)

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


def test_the_live_cycle_reserves_quota_for_a_blocked_job_and_says_until_when(queues, operator_client):

    from django.utils import timezone

    from scheduling.cycle import run_cycle

    legacy = queues["legacy"]  # 12 A100 GPUs of quota, no cohort; backfill, the default
    now = timezone.now()

    def job(gpus, priority=0, ago_s=0.0, hours=None):
        return _a100_job(legacy, now, gpus, priority, ago_s, hours)

    first = job(8, ago_s=60, hours=2)
    run_cycle(now=now)
    big = job(8, priority=5, ago_s=30)  # 8 + 8 > 12: it waits for the first to end, in about 2 h
    long, short = job(4, ago_s=10, hours=3), job(4, ago_s=5, hours=1)
    run_cycle(now=now)
    for j in (first, big, long, short):
        j.refresh_from_db()
    assert (first.state, big.state, long.state, short.state) == ("running", "pending", "pending", "running")
    answer = operator_client.get(f"/api/v1/jobs/{long.pk}/").json()
    assert answer["pending_reason"] == (
        f"waiting behind job {big.pk} of queue legacy: its A100-80G quota is reserved for that job "
        "(8 GPUs) until it starts in about 2.0 h; this job's estimated 3.0 h runs past that"
    )
    assert "expected to start in about 2.0 h" in big.pending_reason


def test_a_bad_queueing_strategy_is_refused_by_name(queues, operator_client):
    legacy = queues["legacy"]
    response = operator_client.patch(
        f"/api/v1/queues/{legacy.pk}/", {"queueing_strategy": "lifo", "head_wait_s": -1}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()) >= {"queueing_strategy", "head_wait_s"}
    legacy.refresh_from_db()
    assert legacy.queueing_strategy == "backfill" and legacy.head_wait_s == 600


TEN_HOURS_S = 36_000.0


def _hours_of_small_jobs(queue: QueueSpec, minutes: int = 120):
    """The case a new user tries: a queue of 512 GPUs of quota, 64 running 8-GPU jobs ending over
    the first half hour (as their estimates say); a 256-GPU job of higher priority, then 40 more
    8-GPU jobs of 10 h each and one of 5 min. Returns ({job: minute it started}, {job: its reason
    at minute 1})."""
    lay = layout_for(pods_per_dc=4, racks=4, nodes_per_rack=4, datacenters=2)  # 1,024 GPUs
    chips = ("H100-SXM",)
    first = [
        PendingJob(i, queue.name, 8, chip_types=chips, estimated_duration_s=(i + 1) * SMALL_S / 64)
        for i in range(64)
    ]
    _, running = cycle(lay, [queue], [], first, now=0.0)
    big = PendingJob(1000, queue.name, 256, priority=50, chip_types=chips, submitted_at=1.0)
    later = [
        PendingJob(
            2000 + k, queue.name, 8, chip_types=chips, submitted_at=2.0, estimated_duration_s=TEN_HOURS_S
        )
        for k in range(40)
    ]
    short = PendingJob(3000, queue.name, 8, chip_types=chips, submitted_at=3.0, estimated_duration_s=300.0)
    pending, started, reasons = [big, *later, short], {}, {}
    for minute in range(1, minutes):
        now = minute * PERIOD_S
        running = [j for j in running if j.estimated_end is None or j.estimated_end > now]
        result, running = cycle(lay, [queue], running, pending, now=now)
        for a in result.admissions:
            started[a.job_id] = minute
        if minute == 1:
            reasons = dict(result.pending)
        pending = [p for p in pending if p.id not in started]
    return started, reasons


def test_backfill_reserves_the_quota_at_once_and_lets_only_jobs_that_end_before_it_pass():
    queue = QueueSpec("train", nominal={"H100-SXM": 512})
    assert queue.queueing == "backfill"  # the default
    started, reasons = _hours_of_small_jobs(queue)
    # half of the 64 jobs end by minute 15: the 256 GPUs of quota are free for the big job then
    assert 14 <= started[1000] <= 16
    # none of the 10-hour jobs took the quota before it; the 5-minute job did, and gave it back
    assert all(started.get(2000 + k, 10**6) >= started[1000] for k in range(40))
    assert started[3000] < started[1000]
    big, follower = reasons[1000], reasons[2000]
    assert "queue train reserves its H100-SXM quota for it: expected to start in about 14 min" in big
    assert follower.startswith(
        "waiting behind job 1000 of queue train: its H100-SXM quota is reserved for that job (256 GPUs) "
        "until it starts in about 14 min; this job's estimated 10.0 h runs past that"
    )
    assert follower.kind == "ordering" and follower.facts["behind_job"] == 1000
    assert follower.facts["reserved_until"] == pytest.approx(32 * SMALL_S / 64)


def test_under_the_bounded_wait_the_ten_hour_jobs_take_the_freed_quota_first():
    started, _ = _hours_of_small_jobs(QueueSpec("train", nominal={"H100-SXM": 512}, queueing="best_effort"))
    backfilled, _ = _hours_of_small_jobs(QueueSpec("train", nominal={"H100-SXM": 512}))
    # until the bounded wait ran out, the freed quota went to 10-hour jobs: the big job starts later,
    # and those jobs hold GPUs of the queue's quota for 10 h
    first_hour = [k for k in range(40) if started.get(2000 + k, 10**6) < started.get(1000, 10**6)]
    assert len(first_hour) >= 10
    assert started.get(1000, 10**6) >= backfilled[1000] + 10


def test_backfill_without_known_ends_holds_every_later_job_of_the_chip_type():
    lay = layout_for(pods_per_dc=1, datacenters=1)  # 32 GPUs
    queue = QueueSpec("train", nominal={"H100-SXM": 16})
    full = [PendingJob(i, "train", 8, chip_types=("H100-SXM",)) for i in (1, 2)]  # no estimates
    _, running = cycle(lay, [queue], [], full, now=0.0)
    big = PendingJob(10, "train", 16, priority=5, chip_types=("H100-SXM",))
    quick = PendingJob(11, "train", 8, chip_types=("H100-SXM",), submitted_at=1.0, estimated_duration_s=60.0)
    result, _ = cycle(lay, [queue], running, [big, quick], now=5.0)
    assert not result.admissions
    assert "no running job of the queue has an estimated end, so its later jobs wait" in result.pending[10]
    assert result.pending[11].endswith("; no end is known")


def test_a_what_if_run_compares_the_queueing_strategies_on_one_workload(tmp_path):
    """``queueing=`` sets every queue's strategy in a what-if run: behind a gang the cluster cannot
    hold yet, strict FIFO keeps the small jobs waiting; best effort lets them pass."""
    import json

    from engine.workload import Queueing
    from monitoring.whatif.simreport import parse_config, run_all

    assert parse_config("queueing=strict_fifo")["queueing"] == Queueing.STRICT_FIFO
    with pytest.raises(ValueError, match="bad value for queueing: 'lifo'"):
        parse_config("queueing=lifo")
    pod = {"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 4, "gpus_per_node": 8}
    doc = {"regions": [{"name": "r", "datacenters": [{"name": "dc1", "pods": [pod]}]}]}
    base = {"chip": "H100-SXM", "queue": "research", "topology": "any"}
    rows = [
        {**base, "arrival_s": 0, "gpus": 32, "work_s": 3600},
        {**base, "arrival_s": 10, "gpus": 48, "work_s": 3600},  # waits for the first to end
        *({**base, "arrival_s": 20 + i, "gpus": 8, "work_s": 600} for i in range(6)),
    ]
    workload = tmp_path / "gang-then-small.json"
    workload.write_text(json.dumps(rows))
    names = ("queueing=strict_fifo", "queueing=best_effort", "queueing=backfill", "baseline")
    runs = run_all(doc, [parse_config(c) for c in names], days=1, seed=4, jobs=None, workload=str(workload))
    fifo, bounded, backfill, baseline = (r["completion"] for r in runs)
    assert {r["completed"] for r in (fifo, bounded, backfill)} == {len(rows)}
    # backfill lets the 10-minute jobs pass the gang (they end before it can start); best effort
    # lets them pass until the gang has waited its bounded 600 s; strict FIFO not at all
    assert backfill["mean_wait_s"] < bounded["mean_wait_s"] < fifo["mean_wait_s"]
    assert baseline == backfill  # the default
