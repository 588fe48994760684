"""Inventory changes: the only code that writes a node's or a GPU's state. The API, the admin, the
pages, the scheduling cycle, the fault task and the simulated fleet all call these functions;
every change follows engine.states and leaves an audit record."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from cluster.models import GPU, AuditRecord, Node
from cluster.signals import nodes_changed
from engine.states import NODE_ACTIONS, InvalidTransition, node_action_target

CONTROLLER = "controller"  # the actor of changes the control plane makes by itself


@transaction.atomic
def apply_node_action(
    nodes: Iterable[Node],
    action: str,
    *,
    actor: str,
    reason: str = "",
    deadline: datetime | None = None,
    at: datetime | None = None,
    lemon: bool | None = None,
) -> list[Node]:
    """Take ``action`` (an operator's action or a controller event of engine.states) on the nodes.
    All or nothing: one node in a wrong state changes none. The nodes are re-read under a row lock
    so two operators acting at once cannot both win.

    ``deadline``: for a drain, until when running work may finish before it is moved.
    ``lemon``: set or clear the node's lemon mark along with the change.
    """
    if deadline is not None and action != "drain":
        raise InvalidTransition(f"deadline: only a drain takes a deadline, not {action}")
    ids = [n.pk for n in nodes]
    locked = list(Node.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
    problems = []
    targets = {}
    for node in locked:
        try:
            targets[node.pk] = node_action_target(action, node.state)
        except InvalidTransition as exc:
            problems.append(f"{node.hostname}: {exc}")
    if problems:
        raise InvalidTransition("; ".join(problems))
    now = at or timezone.now()
    before = [(node.state, node.is_lemon) for node in locked]
    text = reason if actor == CONTROLLER else f"{action} by {actor}" + (f": {reason}" if reason else "")
    for node in locked:
        node.state = targets[node.pk]
        node.state_reason = "" if node.state == "ready" else text[:255]
        node.state_changed_at = now
        if node.state != "draining":
            node.drain_deadline = None
        elif action == "drain":
            node.drain_deadline = deadline
        if lemon is not None:
            node.is_lemon = lemon
    Node.objects.bulk_update(
        locked, ["state", "state_reason", "state_changed_at", "drain_deadline", "is_lemon"]
    )
    _audit(locked, before, action, actor, reason)
    if action == "return":
        # a repaired node comes back whole: its GPUs were reset
        GPU.objects.filter(node__in=locked).update(state="ready", health="ok")
    nodes_changed.send(sender=Node, nodes=locked, action=action, at=now)
    return locked


def _audit(nodes: list[Node], before: list[tuple[str, bool]], action: str, actor: str, reason: str) -> None:
    records = []
    for node, (state, was_lemon) in zip(nodes, before, strict=True):
        diff = {"state": [state, node.state]}
        if was_lemon != node.is_lemon:
            diff["is_lemon"] = [was_lemon, node.is_lemon]
        if node.drain_deadline is not None:
            diff["drain_deadline"] = [None, node.drain_deadline.isoformat()]
        records.append(
            AuditRecord(
                actor=actor[:150],
                action=action,
                object_type="node",
                object_id=node.pk,
                object_name=node.hostname,
                changes=diff,
                reason=reason[:255],
            )
        )
    AuditRecord.objects.bulk_create(records)


def operator_actions(node: Node) -> list[str]:
    """The operator's actions that apply to the node now (the node page's buttons)."""
    return [a for a, (allowed, _) in NODE_ACTIONS.items() if node.state in allowed]


def mark_drained(node_ids: list[int], at: datetime | None = None) -> list[Node]:
    """Draining nodes with no work left become drained (the scheduling cycle calls this)."""
    nodes = list(Node.objects.filter(pk__in=node_ids, state="draining"))
    if not nodes:
        return []
    return apply_node_action(
        nodes, "drained", actor=CONTROLLER, reason="drained: no work left on the node", at=at
    )


def take_down(node: Node, reason: str, at: datetime | None = None, *, lemon: bool = False) -> bool:
    """A fault takes the node out of service (``lemon``: quarantined as a lemon, whatever its state
    but repair). Returns whether the node changed; a node already down or in repair stays."""
    action = "quarantine" if lemon else "fault"
    try:  # the node is re-read under its row lock there, and the transition checked
        apply_node_action(
            [node], action, actor=CONTROLLER, reason=reason, at=at, lemon=True if lemon else None
        )
    except InvalidTransition:
        return False
    return True


def cordon(node: Node, reason: str, at: datetime | None = None) -> bool:
    """A fault cordons the node: no new work is placed there. Returns whether it changed; a node
    not ready (already cordoned, draining, down) stays as it is."""
    try:
        apply_node_action([node], "cordon", actor=CONTROLLER, reason=reason, at=at)
    except InvalidTransition:
        return False
    return True


def set_gpus(gpu_ids: list[int], *, state: str | None = None, health: str | None = None) -> int:
    """A fault changes GPUs' state or health (one statement for all of them)."""
    fields = {k: v for k, v in (("state", state), ("health", health)) if v is not None}
    return GPU.objects.filter(pk__in=gpu_ids).update(**fields) if fields else 0


@transaction.atomic
def set_spare(nodes: Iterable[Node], spare: bool, *, actor: str = CONTROLLER, reason: str = "") -> int:
    """Mark nodes as spares (kept idle for fault recovery) or return them to the general pool."""
    changed = list(Node.objects.filter(pk__in=[n.pk for n in nodes]).exclude(is_spare=spare))
    Node.objects.filter(pk__in=[n.pk for n in changed]).update(is_spare=spare)
    AuditRecord.objects.bulk_create(
        AuditRecord(
            actor=actor[:150],
            action="mark_spare" if spare else "unmark_spare",
            object_type="node",
            object_id=node.pk,
            object_name=node.hostname,
            changes={"is_spare": [not spare, spare]},
            reason=reason[:255],
        )
        for node in changed
    )
    if changed:
        nodes_changed.send(sender=Node, nodes=changed, action="spare", at=timezone.now())
    return len(changed)
