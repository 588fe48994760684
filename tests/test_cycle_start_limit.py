"""A cycle starts at most MYRIAD_CYCLE_MAX_START_GPUS GPUs; the jobs past the limit say so and the
next cycle runs at once after the commit, without waiting for beat."""

import contextlib
import fcntl
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from django.db import connections

from scheduling.cycle import run_cycle
from scheduling.models import Job
from scheduling.services import submit_job


def test_jobs_past_the_start_limit_start_in_the_cycle_that_follows_at_once(
    queues, settings, eager_celery, django_capture_on_commit_callbacks
):
    settings.CYCLE_MAX_START_GPUS = 16
    jobs = [
        submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name=f"j{i}")
        for i in range(3)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        first = run_cycle()
    assert first.admitted == 2 and first.pending == 1
    for job in jobs:
        job.refresh_from_db()
    assert [j.state for j in jobs] == ["running", "running", "running"]  # the follow-up cycle ran
    waited = jobs[2].events.get(kind="admitted").at
    assert waited >= jobs[1].events.get(kind="admitted").at


def test_a_job_deferred_by_the_start_limit_keeps_its_reason_until_a_cycle_decides(queues, settings):
    """Jobs past the limit were not looked at: a new one keeps "waiting for the next scheduling
    cycle" (no write for it), one that an earlier cycle had given a reason is told it was deferred;
    the next cycle gives each its own reason."""
    settings.CYCLE_MAX_START_GPUS = 16
    submit_job(queue=queues["vision"], gpus=32, chip_types=["H100-SXM"], topology="any", name="filler")
    run_cycle()
    older = submit_job(queue=queues["vision"], gpus=24, chip_types=["H100-SXM"], topology="any", name="older")
    run_cycle()  # 16 GPUs free: it has its reason
    older.refresh_from_db()
    assert older.state == "pending" and older.pending_reason != "waiting for the next scheduling cycle"
    Job.objects.filter(pk=older.pk).update(priority=-1)  # behind the new ones
    for i in range(4):
        submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name=f"n{i}")
    summary = run_cycle()
    assert summary.admitted == 2
    reasons = dict(Job.objects.filter(state="pending").values_list("name", "pending_reason"))
    assert reasons["n2"] == reasons["n3"] == "waiting for the next scheduling cycle"
    assert reasons["older"].startswith("waiting for the next cycle: this one started 16 GPUs")
    run_cycle()
    reasons = dict(Job.objects.filter(state="pending").values_list("name", "pending_reason"))
    assert sorted(reasons) == ["n2", "n3", "older"]
    assert not any("next" in reason for reason in reasons.values()), reasons


def test_without_a_limit_one_cycle_starts_everything(queues, settings):
    settings.CYCLE_MAX_START_GPUS = 0
    for i in range(3):
        submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name=f"j{i}")
    summary = run_cycle()
    assert summary.admitted == 3 and Job.objects.filter(state="running").count() == 3


def _queued(monkeypatch):
    """What asking for a cycle sends to the workers: (countdown or None, kwargs) per task."""
    from scheduling.tasks import run_scheduling_cycle

    sent = []
    monkeypatch.setattr(run_scheduling_cycle, "delay", lambda **kw: sent.append((None, kw)))
    monkeypatch.setattr(
        run_scheduling_cycle, "apply_async", lambda countdown=None, **kw: sent.append((countdown, kw))
    )
    return sent


def test_requested_cycles_keep_the_minimum_interval_after_the_last_one(
    db, settings, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    """Under a stream of submits cycles do not run back to back: the one asked for waits until the
    interval since the last cycle's end has passed; a quiet cluster's cycle starts at once."""
    from scheduling import trigger

    settings.REDIS_URL, settings.DATA_DIR, settings.CYCLE_MIN_INTERVAL_S = None, tmp_path, 2.0
    sent = _queued(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        trigger.request_cycle()  # no cycle ended yet: at once
    assert sent == [(None, {"at_once": False})]
    trigger.clear_requested()  # the cycle starts ...
    trigger.note_cycle_ended()  # ... and ends
    with django_capture_on_commit_callbacks(execute=True):
        trigger.request_cycle()
        trigger.request_cycle()  # one queued: the second asks nothing
    assert len(sent) == 2 and 1.5 < sent[1][0] <= 2.0
    trigger.clear_requested()
    with django_capture_on_commit_callbacks(execute=True):
        trigger.request_cycle(at_once=True)  # the start limit's follow-up does not wait
    assert sent[2] == (None, {"at_once": True})
    settings.CYCLE_MIN_INTERVAL_S = 0
    assert trigger.seconds_until_allowed() == 0


def test_a_cycle_that_comes_too_early_is_put_off_not_run(settings, tmp_path, monkeypatch):
    from scheduling import tasks, trigger

    settings.REDIS_URL, settings.DATA_DIR, settings.CYCLE_MIN_INTERVAL_S = None, tmp_path, 2.0
    sent = _queued(monkeypatch)
    ran = []
    monkeypatch.setattr(
        tasks, "run_cycle", lambda **kw: ran.append(kw) or SimpleNamespace(ran=True, as_dict=dict)
    )
    trigger.note_cycle_ended()
    assert trigger.mark_requested()
    answer = tasks.run_scheduling_cycle()
    assert answer["ran"] is False and ran == [] and 1.5 < sent[0][0] <= 2.0
    assert not trigger.mark_requested()  # the marker is kept: submits meanwhile queue nothing
    settings.CYCLE_MIN_INTERVAL_S = 0.01
    time.sleep(0.02)
    tasks.run_scheduling_cycle()  # its time has come: it runs, and clears the marker
    assert len(ran) == 1 and trigger.mark_requested()


def test_two_cycle_tasks_due_at_once_in_one_worker_run_one_cycle(settings, tmp_path, monkeypatch):
    """Celery runs a put-off task (a countdown) on its timer thread, beside the task on the worker's
    main thread: two tasks due at the same moment both found the interval passed and ran two cycles
    back to back, the second one reading every pending job again for the few submitted meanwhile
    (seen under 500 submits a second). The second now waits for the first and is put off."""
    import os
    import threading

    from scheduling import tasks, trigger

    settings.REDIS_URL, settings.DATA_DIR, settings.CYCLE_MIN_INTERVAL_S = None, tmp_path, 1.0
    sent = _queued(monkeypatch)
    ran = []

    def cycle(**kw):
        ran.append(kw)
        time.sleep(0.3)
        return SimpleNamespace(ran=True, as_dict=dict)

    monkeypatch.setattr(tasks, "run_cycle", cycle)
    trigger.note_cycle_ended()
    ended = trigger._moment_path("ended")
    os.utime(ended, (time.time() - 5, time.time() - 5))  # the last cycle ended long ago
    answers = []
    first = threading.Thread(target=lambda: answers.append(tasks.run_scheduling_cycle()))
    second = threading.Thread(target=lambda: answers.append(tasks.run_scheduling_cycle()))
    first.start()
    time.sleep(0.05)
    second.start()
    first.join(5)
    second.join(5)
    assert len(ran) == 1
    put_off = [a for a in answers if not a.get("ran", True)]
    assert len(put_off) == 1 and 0.8 < sent[0][0] <= 1.0


def test_no_garbage_collection_pass_runs_inside_a_cycle_and_collections_resume_after(queues, monkeypatch):
    """A full collection over a 100k-job worker's heap took 200-290 ms inside a cycle; the cycle
    holds collections off while it decides and writes, the pending reasons it writes after its
    commit included (still under the lock), and leaves them as it found them."""
    import gc

    import scheduling.cycle as cycle
    import scheduling.locks as locks

    seen, after = [], []
    decide, write_after = cycle.schedule, locks._run_after

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return decide(*args, **kwargs)

    def watched_after(writes):
        after.append(gc.isenabled())
        return write_after(writes)

    monkeypatch.setattr(cycle, "schedule", watched)
    monkeypatch.setattr(locks, "_run_after", watched_after)
    submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name="j")
    submit_job(queue=queues["vision"], gpus=48, chip_types=["H100-SXM"], topology="any", name="big")
    assert gc.isenabled()
    assert run_cycle().admitted == 1
    assert seen == [False] and after == [False] and gc.isenabled()
    gc.disable()  # a process that runs without the collector keeps running without it
    try:
        run_cycle()
        assert not gc.isenabled()
    finally:
        gc.enable()


@contextlib.contextmanager
def _lock_held_elsewhere():
    """The scheduling lock held by another process's session (a cycle running in another worker)."""
    from django.conf import settings
    from django.db import connection

    from scheduling.locks import LOCK_KEY

    if connection.vendor == "postgresql":
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**{k: v for k, v in params.items() if k != "pool"}, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
            yield
        return
    with open(Path(settings.DATA_DIR) / "scheduling-cycle.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def test_a_requested_cycle_that_finds_another_running_is_put_off_and_keeps_the_request(
    queues, settings, tmp_path, monkeypatch
):
    """With a standby worker on the cycle queue, two tasks due at once went one to each worker and
    the second waited for the lock, then ran right after the first. A requested cycle that finds the
    lock held is put off by the interval, keeping the request (submits meanwhile queue nothing);
    the start limit's follow-up waits for the lock and runs."""
    from scheduling import tasks, trigger

    settings.REDIS_URL, settings.DATA_DIR, settings.CYCLE_MIN_INTERVAL_S = None, tmp_path, 1.0
    sent = _queued(monkeypatch)
    job = submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name="j")
    trigger.clear_requested()
    answers = []

    def ask():  # in a thread: a task that waited for the lock would never return while it is held
        try:
            answers.append(tasks.run_scheduling_cycle())
        finally:
            connections.close_all()

    with _lock_held_elsewhere():
        asking = threading.Thread(target=ask)
        asking.start()
        asking.join(10)
        assert not asking.is_alive(), "the requested cycle waited for the lock"
    asking.join(10)
    assert answers == [{"ran": False, "put_off_s": 1.0, "busy": True}]
    assert [countdown for countdown, _ in sent] == [1.0] and "asked_at" in sent[0][1]["kwargs"]
    assert not trigger.mark_requested()  # the request is kept: this task carries it
    job.refresh_from_db()
    assert job.state == "pending"
    assert tasks.run_scheduling_cycle(at_once=True)["ran"] is True  # the lock is free again
    job.refresh_from_db()
    assert job.state == "running"


def test_a_put_off_cycle_task_ends_when_a_cycle_has_started_since(settings, tmp_path, monkeypatch):
    """Each put-off task carries what was asked before it was put off. Under a stream of submits
    (one new request a cycle) and beat's own tasks, put-off tasks piled up, each waking about once a
    cycle to be put off again (455 in 45 s of 500 submits a second): one that finds a cycle has
    started since it was put off has nothing left to carry and ends."""
    from scheduling import tasks

    settings.REDIS_URL, settings.DATA_DIR, settings.CYCLE_MIN_INTERVAL_S = None, tmp_path, 0.05
    sent = _queued(monkeypatch)
    ran = []
    monkeypatch.setattr(
        tasks, "run_cycle", lambda **kw: ran.append(kw) or SimpleNamespace(ran=True, as_dict=dict)
    )
    asked = time.time()
    time.sleep(0.05)  # (a file's time is the kernel's coarse clock: a few ms behind)
    tasks.run_scheduling_cycle()  # a cycle starts (and ends) after the request was put off
    assert len(ran) == 1
    time.sleep(0.06)  # the interval has passed: only the covering cycle stops it
    assert tasks.run_scheduling_cycle(asked_at=asked) == {"ran": False, "covered": True}
    assert len(ran) == 1 and sent == []
    assert tasks.run_scheduling_cycle(asked_at=time.time()) == {}  # asked since: it runs
    assert len(ran) == 2
