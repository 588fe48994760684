"""Job arrays (engine.arrays): one submit writes N jobs in bulk, and the array is cancelled, held
and released as one, or some of its indices at a time. Every job of an array is a whole job:
quota, fair share, priority, preemption, events and ETTR treat it as any of its queue's jobs;
the engine keeps its array under its ``%N`` running limit."""

from __future__ import annotations

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from engine import arrays
from engine.lifecycle import JOB_ACTIONS
from scheduling.bulk import insert_copies
from scheduling.choices import JobState
from scheduling.models import Job, JobArray
from scheduling.services import SubmitError, change_states, new_job, submitted_event
from scheduling.trigger import request_cycle

# array action -> (the job action it takes, the states it takes it from)
ACTIONS = {
    "cancel": ("cancel", JOB_ACTIONS["cancel"][0]),
    "hold": ("suspend", frozenset({JobState.PENDING.value})),  # running jobs keep running (Slurm's hold)
    "release": ("resume", JOB_ACTIONS["resume"][0]),
}


def parse_spec(text: str) -> arrays.ArraySpec:
    try:
        return arrays.parse(text, max_size=settings.ARRAY_MAX_SIZE)
    except arrays.ArrayError as exc:
        raise SubmitError(exc.field, exc.message) from None


@transaction.atomic
def submit_array(spec: str, *, now=None, **fields) -> JobArray:
    """Submit one job per index of ``spec`` (e.g. "0-9999%500"): the same checks as one job's
    submit, then the array, its jobs and their submitted events in three statements. A bad
    field raises SubmitError and writes nothing."""
    parsed = parse_spec(spec)
    job = new_job(now, **fields)
    array = JobArray.objects.create(
        name=job.name,
        queue=job.queue,
        owner=job.owner,
        spec=parsed.text,
        size=parsed.size,
        max_running=parsed.max_running,
        submitted_at=job.submitted_at,
    )
    job.array, job.array_index = array, 0
    if settings.CYCLE_MAX_STARTS:  # until the cycle's window reaches them (scheduling.store)
        job.pending_reason = (
            f"waiting behind the earlier jobs of array {array.pk}: a cycle considers its first "
            f"{settings.CYCLE_MAX_STARTS} pending jobs"
        )
        job.pending_kind = "array"
    insert_copies(job, "array_index", parsed.indices)
    ids = list(Job.objects.filter(array=array).order_by("id").values_list("id", flat=True))
    reason = f"submitted to queue {job.queue.name} in array {array.pk} ({parsed.text})"
    insert_copies(submitted_event(job, reason, array=array.pk), "job", ids)
    request_cycle()
    return array


@transaction.atomic
def act(array: JobArray, name: str, *, indices: str | None = None, actor="", reason="", now=None) -> int:
    """Take ``name`` (cancel, hold, release) on the array's jobs it applies to, or on those of
    ``indices`` (the array's own syntax, e.g. "7" or "0-99"); returns how many jobs changed.
    An index that is not in the array raises SubmitError("indices", ...) and changes nothing."""
    action, states = ACTIONS[name]
    now = now or timezone.now()
    rows = np.array(
        Job.objects.select_for_update()
        .filter(array=array)
        .values_list("id", "array_index", "state")
        .order_by("id"),
        dtype=object,
    ).reshape(-1, 3)
    chosen = np.isin(rows[:, 2], list(states))
    if indices is not None:
        known = rows[:, 1].astype(np.int64)
        wanted, problem = arrays.indices_problem(indices, known, settings.ARRAY_MAX_SIZE)
        if problem:
            raise SubmitError("indices", problem)
        chosen &= np.isin(rows[:, 1].astype(np.int64), wanted)
    ids = [int(i) for i in rows[chosen, 0]]
    if not ids:
        return 0
    text = reason or (f"{name} of array {array.pk} by {actor}" if actor else f"{name} of array {array.pk}")
    return change_states(ids, action, actor=actor, reason=text, now=now, data={"array": array.pk})


def state_counts(array: JobArray) -> dict[str, int]:
    """How many of the array's jobs are in each state (every state, zeros included)."""
    counts = dict.fromkeys(JobState.values, 0)
    rows = Job.objects.filter(array=array).values_list("state").annotate(n=Count("id")).order_by()
    for state, n in rows:
        counts[state] = n
    return counts
