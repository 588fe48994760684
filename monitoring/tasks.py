from celery import shared_task

from monitoring.services import handle_fault


@shared_task(ignore_result=True, time_limit=120)
def handle_fault_task(fault_id: int) -> dict:
    """Classify a fault, take the hardware out of service and recover the jobs it hit."""
    return handle_fault(fault_id)
