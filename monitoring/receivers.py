"""What monitoring does when the inventory changes (connected in MonitoringConfig.ready)."""

from __future__ import annotations

from django.db.models import Q

from monitoring.models import FaultEvent


def clear_faults_of_returned_nodes(sender, nodes, action: str, at, **kwargs) -> None:
    """A repaired node comes back whole: its open faults, and its GPUs', are cleared."""
    if action == "return":
        FaultEvent.objects.filter(Q(node__in=nodes) | Q(gpu__node__in=nodes), cleared_at__isnull=True).update(
            cleared_at=at
        )
