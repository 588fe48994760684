"""Checkpoint recommendations for a job: the Young/Daly interval from its measured mean time
between faults (or the default physics until it has seen enough faults) and its stall."""

from __future__ import annotations

from django.utils import timezone

from engine.checkpoint import PolicyKind, recommend, stall_seconds, state_bytes
from engine.faults import XID_DETECTION_S
from engine.physics import Physics
from scheduling.models import Job

PHYSICS = Physics()
MEASURED_AFTER = 3  # faults before the job's own MTBF replaces the default physics


def policy_kind(job: Job) -> tuple[PolicyKind | None, float]:
    """The job's checkpoint policy kind (its own, else its queue's default) and the success
    probability of a triggered save."""
    policy = job.checkpoint_policy or job.queue.default_checkpoint_policy
    if policy is None:
        return None, 0.95
    return PolicyKind(policy.kind), policy.triggered_success


def job_mtbf(job: Job) -> tuple[float, str]:
    faults = job.faults.count() if job.pk else 0
    factor = job.chip.failure_rate_factor if job.chip_id else 1.0
    if faults >= MEASURED_AFTER and job.started_at:
        first = job.events.filter(kind="admitted").order_by("at").values_list("at", flat=True).first()
        running = ((job.finished_at or timezone.now()) - (first or job.started_at)).total_seconds()
        return running / faults, "measured"
    per_second = PHYSICS.gpu_interruptions_per_day * factor * job.gpus / 86_400
    return 1.0 / per_second, "default physics"


def recommendation(job: Job) -> dict:
    policy = job.checkpoint_policy or job.queue.default_checkpoint_policy
    kind = PolicyKind(policy.kind) if policy else PolicyKind.ASYNC
    state = state_bytes(job.parameters or 0.0, PHYSICS.bytes_per_parameter)
    storage = PHYSICS.storage_gbps(job.gpus)
    stall = max(stall_seconds(kind, state, job.gpus, storage, PHYSICS.host_copy_gbps), 1e-3)
    mtbf, source = job_mtbf(job)
    restart = XID_DETECTION_S + PHYSICS.restart_s(job.gpus)
    rec = recommend(stall, mtbf, restart, policy.interval_s if policy else None)
    return {
        "policy": policy.name if policy else None,
        "kind": kind.value,
        "stall_s": round(stall, 3),
        "mtbf_s": round(mtbf, 1),
        "mtbf_source": source,
        "recommended_interval_s": round(rec.interval_s, 1),
        "recommended_expected_ettr": round(rec.expected_ettr, 5),
        "chosen_interval_s": rec.chosen_interval_s,
        "chosen_expected_ettr": round(rec.chosen_expected_ettr, 5)
        if rec.chosen_expected_ettr is not None
        else None,
    }
