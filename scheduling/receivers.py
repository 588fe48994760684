"""What scheduling does when the inventory changes (connected in SchedulingConfig.ready)."""

from __future__ import annotations

from scheduling.trigger import request_cycle

# Node changes that give the scheduler something to do: work to move off (drain), GPUs back in
# service, or spares returned to the general pool. The cycle's own "drained" marks need none.
_RESCHEDULE = {"drain", "uncordon", "return", "spare"}


def schedule_after_node_change(sender, nodes, action: str, at, **kwargs) -> None:
    if action in _RESCHEDULE:
        request_cycle()  # after the commit
