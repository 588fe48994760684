from celery import shared_task

from monitoring.services import handle_fault


@shared_task(ignore_result=True, time_limit=120)
def handle_fault_task(fault_id: int) -> dict:
    """Classify a fault, take the hardware out of service and recover the jobs it hit."""
    return handle_fault(fault_id)


@shared_task(ignore_result=True, time_limit=3600, soft_time_limit=3500)
def run_simulation_task(simulation_id: int) -> str:
    """Run a stored what-if simulation; progress, summary and report land on the record."""
    from monitoring.simulations import run_stored

    return run_stored(simulation_id)


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def fleet_tick() -> dict:
    """One tick of the live simulated fleet (MYRIAD_SIMULATED_FLEET): telemetry, faults, repairs,
    checkpoints and completions."""
    from monitoring.fleet_driver import tick

    return tick()


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def sample_cluster() -> str:
    """Store one ClusterSample for the overview's charts over time."""
    from monitoring.overview import take_sample

    return str(take_sample())


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def watch_agents() -> dict:
    """Heartbeat loss for silent node agents; give up starts that did not reach every node; put
    the agents' readings in the telemetry frame when no simulated fleet writes it."""
    from monitoring.ingest import compose_frame, watch

    out = watch()
    out["frame_gpus"] = compose_frame()
    return out
