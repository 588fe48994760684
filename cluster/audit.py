"""Audit records: who changed what. Written in the same transaction as the change itself."""

from __future__ import annotations

from cluster.models import AuditRecord


def changes(before: dict, after: dict) -> dict:
    """{field: [before, after]} for the fields whose value differs."""
    return {
        k: [before.get(k), after.get(k)]
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }


def record(
    actor, action: str, object_type: str, obj, diff: dict | None = None, reason: str = ""
) -> AuditRecord:
    name = getattr(actor, "username", None) or str(actor or "system")
    return AuditRecord.objects.create(
        actor=name[:150],
        action=action,
        object_type=object_type,
        object_id=getattr(obj, "pk", None),
        object_name=str(obj)[:128],
        changes=diff or {},
        reason=reason[:255],
    )
