"""Inference services in the cluster simulator: each service's replicas follow its load as the
production autoscaler decides (engine.inference.decide), every AUTOSCALE_S of virtual time."""

from __future__ import annotations

from engine.inference import LoadProfile, decide
from sim.workload import SimJob, SimService

DAY = 86_400.0
AUTOSCALE_S = 300.0


class Services:
    """The simulated inference services, their replicas (job ids, oldest first) and the replica
    time they ran and ran short of what their load needed."""

    def __init__(self, services: list[SimService] | None):
        self.services = list(services or [])
        self.profiles = [LoadProfile.from_dict(svc.load_profile()) for svc in self.services]
        self.replicas: list[list[int]] = [[] for _ in self.services]
        self.low_since: list[float | None] = [None] * len(self.services)
        self.replica_seconds = [0.0] * len(self.services)
        self.short_seconds = [0.0] * len(self.services)  # running replicas below what the load needs

    def __bool__(self) -> bool:
        return bool(self.services)

    def gpus_by_chip(self) -> dict[str, int]:
        """The GPUs every service may grow to, by chip (the inference queues' quotas)."""
        gpus: dict[str, int] = {}
        for svc in self.services:
            gpus[svc.chip] = gpus.get(svc.chip, 0) + svc.max_replicas * svc.replica_gpus
        return gpus

    def running_replicas(self, running) -> int:
        return sum(1 for ids in self.replicas for i in ids if i in running)

    def step(self, sim) -> None:
        """Each service's replicas follow its load, as the production autoscaler decides."""
        for k, (svc, profile) in enumerate(zip(self.services, self.profiles, strict=True)):
            ids = [i for i in self.replicas[k] if sim.jobs[i].ended is None]
            decision = decide(
                profile.rate(sim.now),
                replicas=len(ids),
                capacity_rps=svc.capacity_rps,
                headroom=svc.headroom,
                min_replicas=svc.min_replicas,
                max_replicas=svc.max_replicas,
                low_since=self.low_since[k],
                now=sim.now,
                scale_down_delay_s=300.0,
            )
            self.low_since[k] = (self.low_since[k] or sim.now) if decision.desired < len(ids) else None
            running = sum(1 for i in ids if i in sim.running)
            self.replica_seconds[k] += running * AUTOSCALE_S
            self.short_seconds[k] += max(0, decision.desired - running) * AUTOSCALE_S
            for _ in range(decision.target - len(ids)):
                spec = _replica(sim.new_job_id(), svc, sim.now)
                sim.submit(spec)
                ids.append(spec.id)
            if decision.target < len(ids):
                retire = sorted(ids, key=lambda i: (i in sim.running, -i))[: len(ids) - decision.target]
                for job_id in retire:
                    sim.retire(job_id)
                self.low_since[k] = None
            self.replicas[k] = [i for i in ids if sim.jobs[i].ended is None]

    def report(self) -> list[dict]:
        return [
            {
                "service": svc.name,
                "replica_hours": round(self.replica_seconds[k] / 3600, 1),
                "short_replica_hours": round(self.short_seconds[k] / 3600, 1),
                "replicas_at_end": len(self.replicas[k]),
            }
            for k, svc in enumerate(self.services)
        ]


def _replica(job_id: int, svc: SimService, now: float) -> SimJob:
    """One more replica of the service: a node-packed inference job that runs until retired."""
    return SimJob(
        job_id,
        "inference",
        svc.replica_gpus,
        now,
        365 * DAY,
        svc.chip,
        "node",
        20,
        "inference",
        parameters=0.0,
    )
