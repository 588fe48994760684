"""Checkpoint recommendations for a job: the Young/Daly interval from its measured mean time
between faults (or the default physics until it has seen enough faults) and its stall."""

from __future__ import annotations

from django.utils import timezone

from engine.checkpoint import CheckpointKind, recommend, stall_seconds
from engine.faults import XID_DETECTION_S
from engine.lifecycle import checkpoint_bytes
from engine.physics import Physics
from engine.policy import NO_POLICY, CheckpointPolicy
from scheduling.models import Job

PHYSICS = Physics()
MEASURED_AFTER = 3  # faults before the job's own MTBF replaces the default physics


def job_policy(job: Job) -> CheckpointPolicy:
    """The job's checkpoint policy (its own, else its queue's default; none: no checkpoints) as
    the engine reads it."""
    policy = job.effective_checkpoint_policy
    return policy.value if policy is not None else NO_POLICY


def job_mtbf(job: Job) -> tuple[float, str]:
    faults = job.faults.count() if job.pk else 0
    factor = job.chip.failure_rate_factor if job.chip_id else 1.0
    if faults >= MEASURED_AFTER and job.started_at:
        first = job.events.filter(kind="admitted").order_by("at").values_list("at", flat=True).first()
        running = ((job.finished_at or timezone.now()) - (first or job.started_at)).total_seconds()
        return running / faults, "measured"
    return default_mtbf(job.gpus, factor), "default physics"


def recommendation(job: Job) -> dict:
    policy = job.effective_checkpoint_policy
    mtbf, source = job_mtbf(job)
    return {
        "policy": policy.name if policy else None,
        **recommend_for(
            CheckpointKind(policy.kind) if policy else CheckpointKind.ASYNC,
            policy.interval_s if policy else None,
            job.parameters or 0.0,
            job.gpus,
            mtbf,
        ),
        "mtbf_source": source,
    }


def default_mtbf(gpus: int, failure_rate_factor: float = 1.0) -> float:
    return 86_400 / (PHYSICS.gpu_interruptions_per_day * failure_rate_factor * gpus)


# reference jobs the policies page shows recommendations for: (label, parameters, GPUs)
REFERENCE_JOBS = (
    ("70B on 1,024 GPUs", 70e9, 1024),
    ("405B on 16,384 GPUs", 405e9, 16_384),
)


def recommend_for(
    kind: CheckpointKind, chosen: float | None, parameters: float, gpus: int, mtbf: float
) -> dict:
    """The Daly interval for a job of this size under this mechanism, next to the chosen one."""
    state = checkpoint_bytes(parameters, PHYSICS)
    storage = PHYSICS.storage_gbps(gpus)
    stall = max(stall_seconds(kind, state, gpus, storage, PHYSICS.host_copy_gbps), 1e-3)
    restart = XID_DETECTION_S + PHYSICS.restart_s(gpus)
    rec = recommend(stall, mtbf, restart, chosen)
    return {
        "kind": kind.value,
        "stall_s": round(stall, 3),
        "mtbf_s": round(mtbf, 1),
        "recommended_interval_s": round(rec.interval_s, 1),
        "recommended_expected_ettr": round(rec.expected_ettr, 5),
        "chosen_interval_s": rec.chosen_interval_s,
        "chosen_expected_ettr": round(rec.chosen_expected_ettr, 5)
        if rec.chosen_expected_ettr is not None
        else None,
    }
