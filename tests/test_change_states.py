"""Many jobs changing state at once (the simulated fleet's completions, an array's cancel) as each
would alone: its state, its GPUs released, its event; a job the action does not apply to stops the
whole change and nothing is written."""

from __future__ import annotations

import pytest

from engine.lifecycle import JobStateError
from scheduling.cycle import run_cycle
from scheduling.models import AllocatedGPU, Allocation, Job
from scheduling.services import change_state, change_states


def _running(queues, n: int) -> list[int]:
    from django.utils import timezone

    for i in range(n):
        Job.objects.create(
            queue=queues["vision"], name=f"j{i}", gpus=2, chip_types=["H100-SXM"], submitted_at=timezone.now()
        )
    run_cycle()
    ids = list(Job.objects.filter(state="running").order_by("id").values_list("id", flat=True))
    assert len(ids) == n
    return ids


def test_jobs_finished_together_are_each_finished_with_their_gpus_released_and_an_event(queues):
    ids = _running(queues, 6)
    started = dict(Job.objects.filter(pk__in=ids).values_list("id", "started_at"))
    assert change_states(ids[:5], "finish", actor="simulated fleet", reason="finished (simulated)") == 5
    for job in Job.objects.filter(pk__in=ids[:5]):
        assert job.state == "finished" and job.finished_at is not None and job.allocated_gpus == 0
        assert job.started_at == started[job.pk]  # a finished job keeps when its run started
        event = job.events.get(kind="finished")
        assert event.reason == "finished (simulated)"
        assert event.data == {"gpus_released": 2, "by": "simulated fleet"}
    assert not Allocation.objects.filter(job_id__in=ids[:5], active=True).exists()
    assert AllocatedGPU.objects.filter(job_id=ids[5], active=True).count() == 2  # the other runs on
    # one job alone, as an operator's action: the same rule
    cancelled = change_state(ids[5], "cancel", actor="operator")
    assert cancelled.state == "cancelled" and cancelled.started_at is None and cancelled.pending_reason == ""
    assert cancelled.events.get(kind="cancelled").data == {"gpus_released": 2, "by": "operator"}


def test_a_job_the_action_does_not_apply_to_changes_nothing(queues):
    ids = _running(queues, 3)
    Job.objects.filter(pk=ids[1]).update(state="finished")
    with pytest.raises(JobStateError):
        change_states(ids, "finish", actor="simulated fleet")
    assert list(Job.objects.filter(pk__in=ids).order_by("id").values_list("state", flat=True)) == [
        "running",
        "finished",
        "running",
    ]
    assert AllocatedGPU.objects.filter(job_id=ids[0], active=True).count() == 2
    assert not Job.objects.get(pk=ids[0]).events.filter(kind="finished").exists()
