"""The autoscaler for inference services: replicas follow the service's load profile.

Each decision reads the load now (engine.inference.LoadProfile), counts the replicas running or
pending, and submits or retires replicas as engine.inference.decide says. Replicas are ordinary
jobs in the service's queue, so the scheduling cycle places them, and at peak the queue's
priority and reclaim policy take GPUs back from training that borrowed them.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from cluster.audit import changes, record
from engine.inference import LoadProfile, decide, replica_topology
from scheduling.choices import JobKind, JobState
from scheduling.models import InferenceService, Job, ServiceScale
from scheduling.services import change_state, submit_job
from scheduling.signals import services_changed

ACTIVE = (JobState.PENDING, JobState.RUNNING)


def replicas_of(service: InferenceService):
    return service.replicas.filter(state__in=ACTIVE)


@transaction.atomic
def autoscale(service_id: int, now: datetime | None = None) -> ServiceScale | None:
    """One decision for one service; returns the change made, if any."""
    now = now or timezone.now()
    service = InferenceService.objects.select_for_update().select_related("queue").get(pk=service_id)
    if service.paused:
        return None
    replicas = list(replicas_of(service).order_by("-submitted_at", "-id"))
    count = len(replicas)
    load = LoadProfile.from_dict(service.load_profile).rate(now.timestamp())
    decision = decide(
        load,
        replicas=count,
        capacity_rps=service.capacity_rps,
        headroom=service.headroom,
        min_replicas=service.min_replicas,
        max_replicas=service.max_replicas,
        low_since=service.low_since.timestamp() if service.low_since else None,
        now=now.timestamp(),
        scale_down_delay_s=service.scale_down_delay_s,
    )
    service.load_rps, service.desired_replicas = load, decision.desired
    if decision.desired < count:
        service.low_since = service.low_since or now
    else:
        service.low_since = None
    change = None
    if decision.target > count:
        for _ in range(decision.target - count):
            submit_job(
                name=f"{service.name}-replica",
                queue=service.queue,
                kind=JobKind.INFERENCE,
                priority=service.queue.priority,
                gpus=service.replica_gpus,
                share=service.replica_share,
                chip_types=list(service.chip_types),
                topology=replica_topology(service.replica_gpus),
                service=service,
            )
    elif decision.target < count:
        # retire pending replicas first, then the newest running ones
        retire = sorted(replicas, key=lambda j: (j.state != JobState.PENDING,))[: count - decision.target]
        for job in retire:
            action = "cancel" if job.state == JobState.PENDING else "finish"
            change_state(job.pk, action, actor="autoscaler", reason=f"scaled down: {decision.reason}")
        service.low_since = None
    if decision.target != count:
        change = ServiceScale.objects.create(
            service=service,
            at=now,
            load_rps=load,
            replicas_before=count,
            replicas_after=decision.target,
            reason=decision.reason,
        )
    service.save(update_fields=["load_rps", "desired_replicas", "low_since", "updated_at"])
    return change


def autoscale_all(now: datetime | None = None) -> dict:
    changes = 0
    services = list(InferenceService.objects.filter(paused=False).values_list("id", flat=True))
    for service_id in services:
        if autoscale(service_id, now) is not None:
            changes += 1
    return {"services": len(services), "changes": changes}


def stop_service(service: InferenceService, actor: str) -> int:
    """Retire every replica (before a service is deleted)."""
    n = 0
    for job in Job.objects.filter(service=service, state__in=ACTIVE):
        change_state(job.pk, "cancel", actor=actor, reason=f"service {service.name} deleted")
        n += 1
    return n


# what a service's audit record compares: its editable fields, the queue by id
SERVICE_AUDITED = ("queue_id", *(f for f in InferenceService.EDITABLE_FIELDS if f not in ("name", "queue")))


def _service_state(service: InferenceService | None) -> dict:
    return {f: getattr(service, f) for f in SERVICE_AUDITED} if service else {}


@transaction.atomic
def save_service(serializer, *, actor, reason: str = "") -> InferenceService:
    """Create or change an inference service through its (validated) serializer, audited; the
    autoscaler decides again after the commit."""

    creating = serializer.instance is None
    before = _service_state(serializer.instance)
    service = serializer.save()
    diff = changes(before, _service_state(service))
    record(actor, "create" if creating else "update", "service", service, diff, reason)
    transaction.on_commit(lambda: services_changed.send(sender=InferenceService, service=service.pk))
    return service
