"""A cycle starts at most MYRIAD_CYCLE_MAX_START_GPUS GPUs; the jobs past the limit say so and the
next cycle runs at once after the commit, without waiting for beat."""

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


def test_without_a_limit_one_cycle_starts_everything(queues, settings):
    settings.CYCLE_MAX_START_GPUS = 0
    for i in range(3):
        submit_job(queue=queues["vision"], gpus=8, chip_types=["H100-SXM"], topology="any", name=f"j{i}")
    summary = run_cycle()
    assert summary.admitted == 3 and Job.objects.filter(state="running").count() == 3
