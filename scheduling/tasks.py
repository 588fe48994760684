from celery import shared_task

from scheduling.cycle import run_cycle
from scheduling.trigger import clear_requested


@shared_task(ignore_result=True, time_limit=120, soft_time_limit=100)
def run_scheduling_cycle() -> dict:
    """One scheduling cycle. Cycles run one at a time (the scheduling lock); the request marker is
    cleared first so jobs submitted while this cycle runs queue the next one."""
    clear_requested()
    return run_cycle(wait=True).as_dict()
