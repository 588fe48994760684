import logging

from celery import shared_task
from celery.signals import worker_ready

from scheduling.cycle import run_cycle
from scheduling.trigger import clear_requested


@shared_task(ignore_result=True, time_limit=120, soft_time_limit=100)
def run_scheduling_cycle() -> dict:
    """One scheduling cycle. Cycles run one at a time (the scheduling lock); the request marker is
    cleared first so jobs submitted while this cycle runs queue the next one."""
    clear_requested()
    return run_cycle(wait=True).as_dict()


@worker_ready.connect
def warm_up(**_kwargs) -> None:
    """Load the topology snapshot, its layout and the active allocations when the worker starts, so
    the first cycle after a restart is as fast as the others (at 100k GPUs the snapshot takes about
    half a second to load and the allocations about 0.1 s)."""
    from cluster.snapshot import topology_cache
    from scheduling.store import allocations, layouts

    try:
        layouts.layout(topology_cache.current())
        allocations.active_pairs()
    except Exception:  # noqa: BLE001 - an empty or unmigrated database: the first cycle loads it
        logging.getLogger("myriad.scheduling").warning("could not preload the topology", exc_info=True)


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def autoscale_services() -> dict:
    """Replicas of every inference service follow their load profile (Celery beat runs this)."""
    from scheduling.inference import autoscale_all

    return autoscale_all()
