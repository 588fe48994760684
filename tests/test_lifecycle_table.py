"""The job and node lifecycle of the core, case by case (engine.lifecycle, engine.states): which
action applies in which state, what a stop does to a job's work, the lemon rule, the shape rules
every submit follows."""

from __future__ import annotations

import pytest

from engine import lifecycle
from engine.checkpoint import CheckpointKind
from engine.states import NODE_ACTIONS, InvalidTransition, node_action_target
from engine.workload import QueueSpec, Reclaim

JOB_CASES = [
    # (state, action, resulting state or None when refused)
    ("pending", "cancel", "cancelled"),
    ("running", "cancel", "cancelled"),
    ("suspended", "cancel", "cancelled"),
    ("finished", "cancel", None),
    ("pending", "suspend", "suspended"),
    ("running", "suspend", "suspended"),
    ("suspended", "suspend", None),
    ("suspended", "resume", "pending"),
    ("running", "resume", None),
    ("pending", "admit", "running"),
    ("running", "admit", None),
    ("running", "preempt", "pending"),
    ("pending", "preempt", None),
    ("running", "requeue", "pending"),
    ("running", "finish", "finished"),
    ("pending", "finish", None),
    ("running", "fail", "failed"),
    ("cancelled", "resume", None),
]


@pytest.mark.parametrize(("state", "action", "target"), JOB_CASES)
def test_job_actions(state, action, target):
    if target is None:
        with pytest.raises(lifecycle.JobStateError, match=f"cannot {action} a job that is {state}"):
            lifecycle.job_action_target(action, state)
    else:
        assert lifecycle.job_action_target(action, state) == target


def test_every_job_state_and_action_is_in_the_table():
    covered = {(s, a) for s, a, _ in JOB_CASES}
    assert {a for _, a in covered} == set(lifecycle.JOB_ACTIONS)
    for action, (allowed, target) in lifecycle.JOB_ACTIONS.items():
        assert allowed <= set(lifecycle.JOB_STATES) and target in lifecycle.JOB_STATES, action
    with pytest.raises(lifecycle.JobStateError, match="unknown job action 'explode'"):
        lifecycle.job_action_target("explode", "running")


def test_the_operator_sees_only_the_actions_that_apply():
    assert lifecycle.operator_actions("pending") == ["cancel", "suspend"]
    assert lifecycle.operator_actions("running") == ["cancel", "suspend"]
    assert lifecycle.operator_actions("suspended") == ["cancel", "resume"]
    assert lifecycle.operator_actions("finished") == []


NODE_CASES = [
    ("ready", "cordon", "cordoned"),
    ("ready", "drain", "draining"),
    ("cordoned", "drain", "draining"),
    ("draining", "drain", None),
    ("draining", "drained", "drained"),
    ("ready", "drained", None),
    ("drained", "uncordon", "ready"),
    ("drained", "repair", "repairing"),
    ("draining", "mark_down", "down"),
    ("down", "repair", "repairing"),
    ("repairing", "return", "ready"),
    ("down", "fault", None),  # already down: a second fault leaves it there
    ("repairing", "fault", None),
    ("drained", "fault", "down"),
    ("down", "quarantine", "down"),
    ("repairing", "quarantine", None),
]


@pytest.mark.parametrize(("state", "action", "target"), NODE_CASES)
def test_node_transitions(state, action, target):
    if target is None:
        with pytest.raises(InvalidTransition):
            node_action_target(action, state)
    else:
        assert node_action_target(action, state) == target


def test_controller_events_are_not_operator_actions():
    assert {"drained", "fault", "quarantine"}.isdisjoint(NODE_ACTIONS)


STOP_CASES = [
    # (policy, graceful, progress before, started, last checkpoint, now) -> (saved, progress, lost)
    (CheckpointKind.ASYNC, True, 100.0, 0.0, 50.0, 80.0, (True, 130.0, 0.0)),
    (CheckpointKind.TRIGGERED, True, 100.0, 0.0, None, 40.0, (True, 140.0, 0.0)),
    (CheckpointKind.PERIODIC, True, 100.0, 0.0, 50.0, 80.0, (False, 100.0, 30.0)),
    (None, True, 0.0, 10.0, None, 70.0, (False, 0.0, 60.0)),
    (CheckpointKind.ASYNC, False, 100.0, 0.0, 50.0, 80.0, (False, 100.0, 30.0)),  # a fault, not a stop
    (CheckpointKind.ASYNC, True, 100.0, 0.0, 80.0, 80.0, (False, 100.0, 0.0)),  # nothing unsaved
    # a checkpoint from an earlier run: the work since this run started is what is at stake
    (CheckpointKind.PERIODIC, True, 100.0, 60.0, 20.0, 80.0, (False, 100.0, 20.0)),
]


@pytest.mark.parametrize(("policy", "graceful", "progress", "started", "last", "now", "expected"), STOP_CASES)
def test_stopping_a_job_saves_what_its_policy_can(policy, graceful, progress, started, last, now, expected):
    out = lifecycle.stop(
        now,
        progress_s=progress,
        started_at=started,
        last_checkpoint_at=last,
        policy=policy,
        graceful=graceful,
    )
    assert (out.saved, out.progress_s, out.lost_s) == expected
    assert out.last_checkpoint_at == (now if out.saved else last)


def test_the_lemon_rule():
    day = 86_400.0
    now = 30 * day
    assert not lifecycle.is_lemon(lifecycle.recent_faults([now - 1, now - 2], now))
    assert lifecycle.is_lemon(lifecycle.recent_faults([now - 1, now - 2 * day, now - 6 * day], now))
    assert not lifecycle.is_lemon(lifecycle.recent_faults([now - 1, now - 2 * day, now - 8 * day], now))
    assert lifecycle.recent_faults([now + 5], now) == 0  # a fault after now does not count yet


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"gpus": 8}, None),
        ({"gpus": 64, "min_gpus": 16, "size_step": 8}, None),
        ({"gpus": 8, "min_gpus": 16}, "min_gpus"),
        ({"gpus": 60, "min_gpus": 16, "size_step": 8}, "size_step"),
        ({"gpus": 8, "size_step": 8}, "size_step"),
        ({"gpus": 2, "share": 500}, "share"),
        ({"gpus": 1, "share": 500}, None),
        ({"gpus": 16, "mixed": True, "chip_types": ("H100-SXM",)}, "mixed_chips"),
        ({"gpus": 16, "mixed": True, "chip_types": ("H100-SXM", "A100-80G")}, None),
    ],
)
def test_job_shape_rules(fields, problem):
    gpus = fields.pop("gpus")
    found = lifecycle.shape_problem(gpus, **fields)
    assert (found[0] if found else None) == problem


def test_queue_policies_are_enums_and_a_bad_name_is_refused_by_field():
    q = QueueSpec("a", reclaim_within_cohort="any", within_queue="lower_priority", queueing="strict_fifo")
    assert q.reclaim_within_cohort is Reclaim.ANY
    with pytest.raises(ValueError, match="within_queue: unknown policy 'sometimes' of queue a"):
        QueueSpec("a", within_queue="sometimes")
