from celery import shared_task

from monitoring.faults.progress import check_progress
from monitoring.faults.services import handle_fault
from monitoring.telemetry.ingest import compose_frame, watch
from monitoring.telemetry.overview import take_sample
from monitoring.whatif.fleet_driver import tick
from monitoring.whatif.simulations import restart_silent_parts, run_part, start


@shared_task(ignore_result=True, time_limit=120)
def handle_fault_task(fault_id: int) -> dict:
    """Classify a fault, take the hardware out of service and recover the jobs it hit."""
    return handle_fault(fault_id)


@shared_task(ignore_result=True, time_limit=3600, soft_time_limit=3500)
def run_simulation_task(simulation_id: int) -> str:
    """Start a stored what-if simulation: one task per configuration; progress, summary and
    report land on the record."""

    return start(simulation_id)


# acks_late with reject_on_worker_lost: a part whose worker dies goes back to the queue and runs
# on another worker (a kept result is never computed twice)
@shared_task(
    bind=True,
    ignore_result=True,
    time_limit=3600,
    soft_time_limit=3500,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_simulation_part(self, simulation_id: int, index: int) -> str:
    """One configuration of a simulation; the last to finish writes the report."""

    return run_part(simulation_id, index, worker=self.request.hostname or "")


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def fleet_tick() -> dict:
    """One tick of the live simulated fleet (MYRIAD_SIMULATED_FLEET): telemetry, faults, repairs,
    checkpoints and completions."""

    return tick()


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def sample_cluster() -> str:
    """Store one ClusterSample for the overview's charts over time."""

    return str(take_sample())


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def watch_agents() -> dict:
    """Heartbeat loss for silent node agents; give up starts that did not reach every node; hung
    and slow ranks of jobs on real nodes from their progress (monitoring.faults.progress); put
    the agents' readings in the telemetry frame when no simulated fleet writes it."""

    out = watch()
    out["progress"] = check_progress()
    out["frame_gpus"] = compose_frame()
    return out


@shared_task(ignore_result=True, time_limit=60, soft_time_limit=50)
def watch_simulations() -> list:
    """Start again the simulation parts whose worker went silent (Celery beat runs this)."""

    return restart_silent_parts()
