"""What scheduling does when the inventory changes, and the Celery tasks behind its own signals
(connected in SchedulingConfig.ready)."""

from __future__ import annotations

import time

from scheduling.tasks import autoscale_services, run_scheduling_cycle
from scheduling.trigger import request_cycle

# Node changes that give the scheduler something to do: work to move off (drain), GPUs back in
# service, or spares returned to the general pool. The cycle's own "drained" marks need none.
_RESCHEDULE = {"drain", "uncordon", "return", "spare"}


def schedule_after_node_change(sender, nodes, action: str, at, **kwargs) -> None:
    if action in _RESCHEDULE:
        request_cycle()  # after the commit


def queue_cycle(sender, at_once: bool, countdown: float, **kwargs) -> None:
    """scheduling.signals.cycle_wanted: queue the cycle task (trigger has decided one is due). One
    put off carries what was asked until now: a cycle that starts before it is due reads that."""
    if countdown > 0:
        run_scheduling_cycle.apply_async(countdown=countdown, kwargs={"asked_at": time.time()})
    else:
        run_scheduling_cycle.delay(at_once=at_once)


def queue_autoscale(sender, **kwargs) -> None:
    """scheduling.signals.services_changed: the services' replicas follow their profiles now."""
    autoscale_services.delay()
