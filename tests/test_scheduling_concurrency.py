"""Cycles running at once never double-allocate (lock + database constraint), and a real Celery
worker runs the cycle a submit asks for."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from cluster.snapshot import topology_cache
from engine.workload import Admission, CycleResult
from scheduling.cycle import apply_decisions, run_cycle
from scheduling.models import AllocatedGPU, Allocation, Job
from scheduling.trigger import clear_requested
from scheduling.worker import worker_command


def _make_jobs(queues, n, gpus):
    now = timezone.now()
    return [
        Job.objects.create(
            queue=queues["vision"], gpus=gpus, chip_types=["H100-SXM"], topology="any", submitted_at=now
        )
        for _ in range(n)
    ]


def _cycle_in_thread(summaries: list) -> threading.Thread:
    """A cycle (waiting for the lock) run on a thread of its own, its summary appended."""

    def cycle():
        try:
            summaries.append(run_cycle(wait=True))
        finally:
            connection.close()

    thread = threading.Thread(target=cycle)
    thread.start()
    return thread


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_cycles_on_postgres_never_double_allocate(queues):
    from scheduling.models import QueueQuota

    QueueQuota.objects.filter(queue=queues["vision"]).update(nominal=1000)
    _make_jobs(queues, 12, 8)  # 96 GPUs asked, 64 H100 exist, 48 outside the spare nodes
    barrier = threading.Barrier(4)
    summaries = []

    def cycle():
        try:
            barrier.wait()
            summaries.append(run_cycle(wait=True))
        finally:
            connection.close()

    threads = [threading.Thread(target=cycle) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    active = list(AllocatedGPU.objects.filter(active=True).values_list("gpu_id", flat=True))
    assert len(active) == len(set(active)) == 48
    assert sum(s.admitted for s in summaries) == 6  # each job admitted once, by whichever cycle came first
    assert Job.objects.filter(state="running").count() == 6


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_non_waiting_cycles_skip_while_one_holds_the_lock(queues):
    from scheduling.locks import locked_transaction

    held = threading.Event()
    release = threading.Event()

    def hold():
        with locked_transaction():
            held.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert run_cycle(wait=False).ran is False
    finally:
        release.set()
        holder.join()
    assert run_cycle(wait=False).ran is True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cycle_commits_its_starts_before_the_pending_reasons_and_keeps_the_lock_until_then(
    queues, monkeypatch
):
    from scheduling import apply

    fits, waits = _make_jobs(queues, 1, 8)[0], _make_jobs(queues, 1, 512)[0]
    writing, release = threading.Event(), threading.Event()
    plain = apply.update_rows

    def slow_reasons(model, fields, rows):
        if "pending_reason" in fields and any(r[0] == waits.pk for r in rows):
            writing.set()
            release.wait(10)
        return plain(model, fields, rows)

    monkeypatch.setattr(apply, "update_rows", slow_reasons)
    summaries: list = []
    worker = _cycle_in_thread(summaries)
    try:
        assert writing.wait(10)
        # while the reasons are being written: the start is committed and seen by others, the
        # waiting job still reads as before the cycle, and no other cycle can run
        assert Job.objects.get(pk=fits.pk).state == "running"
        assert Job.objects.get(pk=waits.pk).pending_reason == waits.pending_reason
        assert run_cycle(wait=False).ran is False
    finally:
        release.set()
        worker.join(20)
    assert summaries and summaries[0].admitted == 1
    reason = Job.objects.get(pk=waits.pk).pending_reason
    assert reason != waits.pending_reason and "quota" in reason


def test_a_cycle_that_skipped_the_lock_still_cannot_double_allocate(queues):
    """Even decisions computed without the lock are refused by the partial unique index."""
    a, b = _make_jobs(queues, 2, 8)
    snapshot = topology_cache.current()
    gpus = topology_cache.gpu_indices(list(snapshot.gpu_id[:8]))
    first = CycleResult(admissions=[Admission(a.pk, "H100-SXM", gpus, "node x", 0)])
    second = CycleResult(admissions=[Admission(b.pk, "H100-SXM", gpus, "node x", 0)])
    now = timezone.now()
    with transaction.atomic():
        apply_decisions(first, snapshot, now, {})
    with pytest.raises(IntegrityError), transaction.atomic():
        apply_decisions(second, snapshot, now, {})
    assert Job.objects.get(pk=b.pk).state == "pending"  # the whole cycle rolled back
    assert AllocatedGPU.objects.filter(active=True).count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_real_celery_worker_runs_the_cycle_a_submit_asks_for(queues, operator_client, tmp_path):
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{db['NAME']}"
    else:
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {**os.environ, "MYRIAD_DATABASE_URL": url, "MYRIAD_DATA_DIR": str(settings.DATA_DIR)}
    if settings.REDIS_URL:
        env["MYRIAD_REDIS_URL"] = settings.REDIS_URL
    root = Path(__file__).resolve().parent.parent
    clear_requested()  # a marker left by an earlier run would hold back the request
    log = (tmp_path / "worker.log").open("w")  # noqa: SIM115 - closed in the finally below
    worker = subprocess.Popen(
        worker_command(loglevel="warning"),
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        response = operator_client.post(
            "/api/v1/jobs/", {"queue": "vision", "gpus": 16, "chip_types": ["H100-SXM"]}, format="json"
        )
        assert response.status_code == 201
        job_id = response.json()["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Job.objects.get(pk=job_id).state == "running":
                break
            time.sleep(0.25)
        assert Job.objects.get(pk=job_id).state == "running", (tmp_path / "worker.log").read_text()[-3000:]
        assert AllocatedGPU.objects.filter(job_id=job_id, active=True).count() == 16
    finally:
        worker.terminate()
        worker.wait(20)
        log.close()


def _decide_then(monkeypatch, act):
    """Run one cycle whose decisions are taken, then ``act`` runs in another connection (as an
    operator's cancel or a node's finish does, without the scheduling lock) before they are
    written."""
    import scheduling.cycle as cycle_module

    decide = cycle_module.schedule

    def deciding(*args, **kwargs):
        result = decide(*args, **kwargs)
        worker = threading.Thread(target=lambda: (act(), connection.close()))
        worker.start()
        worker.join()
        return result

    monkeypatch.setattr(cycle_module, "schedule", deciding)
    return run_cycle(wait=True)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_while_the_cycle_decides_is_not_started(queues, monkeypatch):
    from scheduling.invariants import check_database
    from scheduling.services import change_state

    (job,) = _make_jobs(queues, 1, 8)
    summary = _decide_then(monkeypatch, lambda: change_state(job.pk, "cancel", actor="operator"))
    assert summary.ran
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert not Allocation.objects.filter(job=job, active=True).exists()
    assert check_database().problems == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_that_finished_while_the_cycle_decides_is_not_preempted(queues, monkeypatch):
    from scheduling.invariants import check_database
    from scheduling.models import Queue
    from scheduling.services import change_state

    low = _make_jobs(queues, 6, 8)  # fill the 48 H100 GPUs outside the spares
    assert run_cycle(wait=True).admitted == 6
    Queue.objects.filter(pk=queues["vision"].pk).update(within_queue="lower_priority")
    victim_ids = [j.pk for j in low]
    Job.objects.create(
        queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", priority=100,
        submitted_at=timezone.now(),
    )  # fmt: skip

    def finish_all():
        for pk in victim_ids:
            change_state(pk, "finish", actor="node")

    _decide_then(monkeypatch, finish_all)
    assert set(Job.objects.filter(pk__in=victim_ids).values_list("state", flat=True)) == {"finished"}
    assert not Job.objects.filter(pk__in=victim_ids, preemptions__gt=0).exists()
    assert check_database().problems == []


@pytest.mark.postgres
def test_four_cycle_workers_under_churn_keep_every_invariant():
    """bench.soak, short: four worker processes, submits, cancels, finishes, faults and node faults
    throughout; the database checked after every 100 cycles."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYRIAD_DATABASE")}
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--cycles", "300", "--workers", "4", "--seed", "3",
         "--database", "myriad_soak_test"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["cycles"] >= 300 and figures["checks"] >= 3
    assert figures["failed_cycles"] == 0, out.stdout
    assert figures["double_allocations"] == 0
    assert figures["quota_violations"] == 0
    assert figures["other_violations"] == 0, out.stdout
    assert figures["submitted"] > 100 and figures["cancelled"] and figures["finished"] and figures["faults"]


@pytest.mark.django_db(transaction=True)
def test_a_submit_commits_while_a_cycle_decides_and_a_job_cancelled_meanwhile_is_not_started(
    queues, monkeypatch
):
    """While a cycle reads and decides, writers are not held back (on SQLite it holds the
    database's write lock only to apply; PostgreSQL never blocked them): a submit and a cancel
    commit at once. The cancelled job's admission, decided before the cancel, is dropped."""
    import scheduling.cycle as cycle_module
    from scheduling.services import change_state, submit_job

    first, cancelled = _make_jobs(queues, 2, 8)
    deciding, go_on = threading.Event(), threading.Event()
    decide = cycle_module.schedule

    def slow_schedule(*args, **kwargs):
        result = decide(*args, **kwargs)
        deciding.set()
        go_on.wait(20)
        return result

    monkeypatch.setattr(cycle_module, "schedule", slow_schedule)
    summaries: list = []
    thread = _cycle_in_thread(summaries)
    try:
        assert deciding.wait(20)
        t0 = time.monotonic()
        late = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any")
        change_state(cancelled.pk, "cancel", actor="test")
        waited = time.monotonic() - t0
    finally:
        go_on.set()
        thread.join(30)
    assert waited < 5  # not held until the cycle commits (it waits 20 s for go_on)
    # the cancelled job's admission, decided before the cancel, was dropped
    assert summaries and summaries[0].admitted == 1 and summaries[0].gpus_allocated == 8
    assert Job.objects.get(pk=first.pk).state == "running"
    assert Job.objects.get(pk=cancelled.pk).state == "cancelled"
    assert not AllocatedGPU.objects.filter(job_id=cancelled.pk, active=True).exists()
    assert Job.objects.get(pk=late.pk).state == "pending"  # not read by that cycle
