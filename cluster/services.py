"""Inventory changes shared by the API, the admin and the pages."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from cluster.models import AuditRecord, Node
from engine.states import InvalidTransition, node_action_target


@transaction.atomic
def apply_node_action(nodes: Iterable[Node], action: str, *, actor: str, reason: str = "") -> list[Node]:
    """Cordon, drain or uncordon nodes. All or nothing: one node in a wrong state changes none.

    The nodes are re-read under a row lock so two operators acting at once cannot both win.
    """
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
    now = timezone.now()
    before_states = [node.state for node in locked]
    text = f"{action} by {actor}" + (f": {reason}" if reason else "")
    for node in locked:
        node.state = targets[node.pk]
        node.state_reason = "" if action in ("uncordon", "return") else text[:255]
        node.state_changed_at = now
    Node.objects.bulk_update(locked, ["state", "state_reason", "state_changed_at"])
    AuditRecord.objects.bulk_create(
        AuditRecord(
            actor=actor[:150],
            action=action,
            object_type="node",
            object_id=node.pk,
            object_name=node.hostname,
            changes={"state": [before, node.state]},
            reason=reason[:255],
        )
        for node, before in zip(locked, before_states, strict=True)
    )
    if action == "return":
        # a repaired node comes back whole: its GPUs were reset, its open faults are cleared
        from cluster.models import GPU
        from monitoring.models import FaultEvent

        GPU.objects.filter(node__in=locked).update(state="ready", health="ok")
        FaultEvent.objects.filter(node__in=locked, cleared_at__isnull=True).update(cleared_at=now)
        FaultEvent.objects.filter(gpu__node__in=locked, cleared_at__isnull=True).update(cleared_at=now)
    return locked


def set_spare(nodes: Iterable[Node], spare: bool) -> int:
    return Node.objects.filter(pk__in=[n.pk for n in nodes]).update(is_spare=spare)
